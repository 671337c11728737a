"""What a SavedModel holds of dynamic tables (tfscale.embedding.dynamic): their rows in use only.

A trained dynamic table is a variable of `capacity` rows of which only those handed out were
ever written, read through an IdRows map; a SavedModel writes whole variables. While one is
traced and written, `served_tables` copies each row index's rows in use (in row order) into a
compact variable per table, [rows in use, width], maps their ids to those compact rows in a
TensorFlow MutableHashTable (its entries are written with the variables, not into the graph,
so its size is not bounded by the graph's), and swaps both into the Tables; after, it puts the
training form back. The served lookup is the lookup outside training, unchanged: an id with a
row reads it, any other id its field's unknown row."""

import contextlib

import tensorflow as tf

from tfscale.embedding.id_rows import NO_ROW


class ServedIds:
    """The id -> compact row map of one row index's rows in use; `rows_of` as IdRows'."""

    def __init__(self, ids, name):
        self.map = tf.lookup.experimental.MutableHashTable(tf.int64, tf.int64, NO_ROW, name=name)
        self.map.insert(ids, tf.range(tf.size(ids, out_type=tf.int64)))

    def rows_of(self, keys):
        """The compact rows of `keys` (int64 [n]), NO_ROW for ids without one."""
        return tf.ensure_shape(self.map.lookup(keys), [None])


@contextlib.contextmanager
def served_tables(tables):
    """Swaps `tables` (built dynamic Tables, in one process) to their rows in use (module
    docstring) for the duration; yields the id maps, which the SavedModel must hold."""
    by_index = {}
    for table in tables:
        by_index.setdefault(id(table.row_index), (table.row_index, []))[1].append(table)
    training = [(table, table.variable, table.row_index) for table in tables]
    maps = []
    try:
        for index, members in by_index.values():
            rows, ids = index.in_use()
            served = ServedIds(ids, name=f"{index.name}_served")
            maps.append(served.map)
            for table in members:
                table.variable = tf.Variable(tf.gather(table.variable.value, rows),
                                             trainable=False, name=f"{table.name}_served")
                table.row_index = served
        yield maps
    finally:
        for table, variable, index in training:
            table.variable, table.row_index = variable, index
