"""The tf.data options of every pipeline tfscale iterates (training and test batches, scoring,
vocabulary counting): autotuning off; and, for a pipeline that captures large tensors (the
synthetic data's per-id tables), tf.data's static rewrites off.

Why: TF 2.21's autotuning thread is not woken when its iterator is deleted, so a deletion (Keras
deletes the epoch's iterator at the end of `fit`, evaluation after each pass) can wait for the
thread's next tick, up to 60 s away once a pipeline has run a minute (18.9 s idle after a 63 s
epoch in `python -m benchmarks.iterator_teardown`). Without it, `AUTOTUNE` parallelism and buffer
sizes take fixed defaults (the Criteo reader measured no slower)."""

import tensorflow as tf


def without_autotuning(dataset):
    """`dataset` with tf.data's autotuning (and so its model thread) turned off."""
    options = tf.data.Options()
    options.autotune.enabled = False
    return dataset.with_options(options)


def without_static_rewrites(dataset):
    """`dataset` without tf.data's default static optimizations, for a pipeline whose map
    parallelism and prefetch are already explicit. Why: to rewrite, tf.data serializes the
    pipeline's graph when an iterator is made, copying every tensor a map function captures: at
    Criteo's cardinalities the synthetic teacher's 1.2 GB, each epoch and evaluation. (Under op
    determinism tf.data's make_deterministic rewrite still copies them: docs/limits.md.)"""
    options = tf.data.Options()
    options.experimental_optimization.apply_default_optimizations = False
    return dataset.with_options(options)
