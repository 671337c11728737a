"""Where the two halves of a recommender live (docs/persia.md): embedding tables, their optimizer
state and their lookups in host memory (the CPU device), everything else on the accelerator when
there is one. This module is the one place that decides it;
tfscale.embedding.placement_report reports where a built model's variables actually are."""

import tensorflow as tf

HOST_DEVICE = "/CPU:0"


def embedding_device():
    """The device of embedding tables and their lookups: host memory."""
    return HOST_DEVICE


def dense_device():
    """The device of the dense model: the first GPU when TensorFlow sees one, else the CPU (where
    TensorFlow and Keras place unpinned variables and ops by default, so nothing pins them)."""
    gpus = tf.config.list_logical_devices("GPU")
    return gpus[0].name if gpus else HOST_DEVICE
