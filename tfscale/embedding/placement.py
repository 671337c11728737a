"""Where the two halves of a recommender live (docs/persia.md): embedding tables, their optimizer
state and their lookups in host memory (the CPU device), everything else on the accelerator when
there is one. This module is the one place that decides it; `describe` reports where a built
model's variables actually are."""

import tensorflow as tf

from tfscale.embedding import table_names

HOST_DEVICE = "/CPU:0"


def embedding_device():
    """The device of embedding tables and their lookups: host memory."""
    return HOST_DEVICE


def dense_device():
    """The device of the dense model: the first GPU when TensorFlow sees one, else the CPU (where
    TensorFlow and Keras place unpinned variables and ops by default, so nothing pins them)."""
    gpus = tf.config.list_logical_devices("GPU")
    return gpus[0].name if gpus else HOST_DEVICE


def describe(model):
    """One line naming the devices that hold `model`'s (built) embedding tables and its other
    variables."""
    table_devices, dense_devices = set(), set()
    for variable in model.variables:
        device = _short_device(variable.value.device)
        (table_devices if table_names.is_embedding_table(variable) else dense_devices).add(device)
    accelerator = "" if dense_device() != HOST_DEVICE else " (no accelerator found)"
    return (f"placement: embedding tables on {', '.join(sorted(table_devices)) or 'none'}, dense "
            f"model on {', '.join(sorted(dense_devices)) or 'none'}{accelerator}")


def _short_device(device):
    """"/job:localhost/replica:0/task:0/device:CPU:0" -> "CPU:0"."""
    return device.rsplit("device:", 1)[-1] if device else "unplaced"
