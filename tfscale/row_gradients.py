"""Gradients that come in rows: `tf.IndexedSlices` (one row per looked-up id, as a gather's
gradient), `CountedSlices` (one row per unique id with its number of occurrences, from
de-duplicated lookups: tfscale.dedup), and turning either into a dense tensor.

The exchanges carry the counts over the ranks and CowClip clips each id by them; everything else
in TensorFlow and Keras sees a CountedSlices as the IndexedSlices it is."""

import tensorflow as tf


class CountedSlices(tf.IndexedSlices):
    """IndexedSlices whose row i stands for `counts[i]` occurrences of id `indices[i]` (float32
    [n])."""

    def __init__(self, values, indices, dense_shape, counts):
        super().__init__(values, indices, dense_shape)
        self.counts = counts


def with_values(gradient, values):
    """`gradient` (IndexedSlices or CountedSlices) with `values` instead of its own."""
    if isinstance(gradient, CountedSlices):
        return CountedSlices(values, gradient.indices, gradient.dense_shape, gradient.counts)
    return tf.IndexedSlices(values, gradient.indices, gradient.dense_shape)


def occurrence_counts(gradient):
    """Float32 [n]: how many occurrences each row of a row gradient stands for (its counts for a
    CountedSlices, 1 per row otherwise)."""
    if isinstance(gradient, CountedSlices):
        return tf.cast(gradient.counts, tf.float32)
    return tf.ones_like(gradient.indices, tf.float32)


def densify(gradient):
    """`gradient` as a dense tensor (IndexedSlices are summed into their rows once)."""
    if isinstance(gradient, tf.IndexedSlices):
        return tf.convert_to_tensor(gradient)
    return gradient
