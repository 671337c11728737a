"""Gradients that come in rows: `tf.IndexedSlices` (one row per looked-up id, as a gather's
gradient), `CountedSlices` (one row per unique id with its number of occurrences, from
de-duplicated lookups: tfscale.embedding.dedup), and turning either into a dense tensor.

The exchanges carry the counts over the ranks and CowClip clips each id by them; everything else
in TensorFlow and Keras sees a CountedSlices as the IndexedSlices it is."""

import tensorflow as tf


class CountedSlices(tf.IndexedSlices):
    """IndexedSlices whose row i stands for `counts[i]` occurrences of id `indices[i]` (float32
    [n]). `unique_ids`: known to hold each id once (one process's de-duplicated lookup; rows
    gathered from several ranks repeat ids), so `sum_duplicate_rows` has nothing to sum."""

    def __init__(self, values, indices, dense_shape, counts, unique_ids=False):
        super().__init__(values, indices, dense_shape)
        self.counts = counts
        self.unique_ids = bool(unique_ids)


def with_values(gradient, values):
    """`gradient` (IndexedSlices or CountedSlices) with `values` instead of its own."""
    if isinstance(gradient, CountedSlices):
        return CountedSlices(values, gradient.indices, gradient.dense_shape, gradient.counts,
                             gradient.unique_ids)
    return tf.IndexedSlices(values, gradient.indices, gradient.dense_shape)


def sum_duplicate_rows(gradient):
    """(unique row ids int64, the gradient summed per id, occurrence counts float32) of a row
    gradient: an IndexedSlices whose rows stand for one occurrence each, or a CountedSlices whose
    rows carry their counts; an id may repeat (e.g. once per rank) unless `unique_ids`."""
    ids = tf.cast(gradient.indices, tf.int64)
    if isinstance(gradient, CountedSlices) and gradient.unique_ids:
        return ids, gradient.values, occurrence_counts(gradient)
    ids, position = tf.unique(ids)
    num_ids = tf.shape(ids)[0]
    rows = tf.math.unsorted_segment_sum(gradient.values, position, num_ids)
    counts = tf.math.unsorted_segment_sum(occurrence_counts(gradient), position, num_ids)
    return ids, rows, counts


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
