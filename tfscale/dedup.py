"""ID de-duplication (docs/persia.md's "compact batch"): an embedding lookup of a batch's unique
ids gathered back by index, and the per-step record of those lookups.

A plain lookup's gradient has one row per occurrence of an id; a de-duplicated lookup's has one
row per unique id, already summed, so the exchange and the optimizer handle fewer rows. CowClip
clips each id by its occurrence count, which the summed rows no longer show: the train step
records each step's lookups (`recording`) and turns the tables' gradients into CountedSlices
(`attach_counts`; tfscale.row_gradients), which the exchange carries over the ranks and CowClip
sums per id. Why not Keras's or keras-rs's lookups: neither de-duplicates nor reports counts."""

import contextlib
import threading

import tensorflow as tf

from tfscale.row_gradients import CountedSlices
from tfscale.tables import lookup_rows


_local = threading.local()


class LookupRecord:
    """The de-duplicated lookups of one step: table path -> (unique rows, counts), and the number
    of ids looked up (for the unique-id rate)."""

    def __init__(self):
        self.tables = {}
        self._graph = None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()

    def add(self, table, unique_rows, counts):
        if self._graph is not None and unique_rows.graph is not self._graph:
            return  # Keras building a subclassed model by a call in a scratch graph: not the step
        if table.path in self.tables:
            raise ValueError(f"embedding table {table.path} is looked up more than once in one "
                             "step: its gradient rows could not be matched to their counts; look "
                             "all of a step's ids up in one call")
        self.tables[table.path] = (unique_rows, tf.cast(counts, tf.float32))

    def unique_ids(self):
        """The unique (table, row) pairs looked up (float32 scalar)."""
        return tf.add_n([tf.cast(tf.size(rows), tf.float32) for rows, _ in self.tables.values()])

    def ids_looked_up(self):
        """The (table, row) pairs looked up, repeats included (float32 scalar)."""
        return tf.add_n([tf.reduce_sum(counts) for _, counts in self.tables.values()])

    def unique_rate(self):
        """Unique (table, row) pairs over those looked up (1: no repeats)."""
        return self.unique_ids() / tf.maximum(self.ids_looked_up(), 1.0)


@contextlib.contextmanager
def recording():
    """Records the de-duplicated lookups made inside the block into the LookupRecord it yields."""
    lookups = LookupRecord()
    previous = getattr(_local, "record", None)
    _local.record = lookups
    try:
        yield lookups
    finally:
        _local.record = previous


def record(table, unique_rows, counts):
    """Adds a de-duplicated lookup of `table` (its gradient rows are `unique_rows`, standing for
    `counts` occurrences each) to the step's record, when inside `recording()`."""
    active = getattr(_local, "record", None)
    if active is not None:
        active.add(table, unique_rows, counts)


def lookup(table_layer, rows):
    """The rows `rows` of `table_layer`'s table (a keras.layers.Embedding's `embeddings`) read
    once per unique row (tfscale.tables.lookup_rows), gathered back to `rows`' shape. Recorded
    for the step when inside `recording()`."""
    flat = tf.reshape(rows, [-1])
    unique_rows, position, counts = tf.unique_with_counts(flat, out_idx=tf.int64)
    vectors = lookup_rows(table_layer.embeddings, unique_rows)
    record(table_layer.embeddings, unique_rows, counts)
    shape = tf.concat([tf.shape(rows, out_type=tf.int64), tf.shape(vectors, out_type=tf.int64)[1:]],
                      axis=0)
    return tf.reshape(tf.gather(vectors, position), shape)


def attach_counts(gradients, variables, record):
    """`gradients` with each recorded table's IndexedSlices turned into CountedSlices (the rows
    of a de-duplicated lookup's gradient are its unique rows in order, so the counts line up;
    checked in the graph)."""
    result = []
    for gradient, variable in zip(gradients, variables):
        entry = record.tables.get(variable.path)
        if entry is None or not isinstance(gradient, tf.IndexedSlices):
            result.append(gradient)
            continue
        unique_rows, counts = entry
        check = tf.debugging.assert_equal(
            tf.cast(gradient.indices, tf.int64), unique_rows,
            message=f"the gradient rows of {variable.path} are not its de-duplicated lookup's "
                    "(is the table also looked up elsewhere?)")
        with tf.control_dependencies([check]):
            counts = tf.identity(counts)
        result.append(CountedSlices(gradient.values, gradient.indices, gradient.dense_shape,
                                    counts, unique_ids=True))
    return result
