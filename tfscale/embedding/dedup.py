"""ID de-duplication (docs/persia.md's "compact batch"): an embedding lookup of a batch's unique
ids gathered back by index, and the step's record of those lookups.

A plain lookup's gradient has one row per occurrence of an id; a de-duplicated lookup's has one
row per unique id, already summed, so the exchange and the optimizer handle fewer rows. CowClip
clips each id by its occurrence count, which the summed rows no longer show: each lookup is
recorded on its Table (tfscale.embedding.table), the train step collects the step's records
(`LookupRecord.of_step`) and turns the tables' gradients into CountedSlices (`attach_counts`;
tfscale.row_gradients), which the exchange carries over the ranks and CowClip sums per id. Why
not Keras's or keras-rs's lookups: neither de-duplicates nor reports counts."""

import tensorflow as tf

from tfscale.row_gradients import CountedSlices


class LookupRecord:
    """The de-duplicated lookups of one step: table variable path -> StepLookup (unique rows,
    counts)."""

    def __init__(self, lookups):
        self.tables = dict(lookups)

    @classmethod
    def of_step(cls, tables):
        """The lookups recorded on `tables` (Tables) in the step being traced."""
        return cls({table.variable.path: lookup for table in tables
                    if (lookup := table.step_lookup()) is not None})

    def unique_ids(self):
        """The unique (table, row) pairs looked up (float32 scalar)."""
        return tf.add_n([tf.cast(tf.size(lookup.unique_rows), tf.float32)
                         for lookup in self.tables.values()])

    def ids_looked_up(self):
        """The (table, row) pairs looked up, repeats included (float32 scalar)."""
        return tf.add_n([tf.reduce_sum(lookup.counts) for lookup in self.tables.values()])

    def unique_rate(self):
        """Unique (table, row) pairs over those looked up (1: no repeats)."""
        return self.unique_ids() / tf.maximum(self.ids_looked_up(), 1.0)


def lookup(table, rows):
    """The rows `rows` of `table` (a Table holding every row) read once per unique row
    (Table.read_rows), gathered back to `rows`' shape; recorded on the table."""
    flat = tf.reshape(rows, [-1])
    unique_rows, position, counts = tf.unique_with_counts(flat, out_idx=tf.int64)
    vectors = table.read_rows(unique_rows)
    table.record_lookup(unique_rows, counts)
    shape = tf.concat([tf.shape(rows, out_type=tf.int64), tf.shape(vectors, out_type=tf.int64)[1:]],
                      axis=0)
    return tf.reshape(tf.gather(vectors, position), shape)


def attach_counts(gradients, variables, record):
    """`gradients` with each recorded table's IndexedSlices turned into CountedSlices (the rows
    of a de-duplicated lookup's gradient are its unique rows in order, so the counts line up;
    checked in the graph)."""
    result = []
    for gradient, variable in zip(gradients, variables):
        lookup = record.tables.get(variable.path)
        if lookup is None or not isinstance(gradient, tf.IndexedSlices):
            result.append(gradient)
            continue
        check = tf.debugging.assert_equal(
            tf.cast(gradient.indices, tf.int64), lookup.unique_rows,
            message=f"the gradient rows of {variable.path} are not its de-duplicated lookup's "
                    "(is the table also looked up elsewhere?)")
        with tf.control_dependencies([check]):
            counts = tf.identity(lookup.counts)
        result.append(CountedSlices(gradient.values, gradient.indices, gradient.dense_shape,
                                    counts, unique_ids=True))
    return result
