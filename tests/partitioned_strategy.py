"""A partitioned table strategy that lives outside the package, for tests/test_table_strategies.py:
table row i lives on rank i mod P, and a lookup sends each unique row to its owner and gets it
back by two Horovod alltoalls (one table at a time, no packing, no counts over the ranks: a toy).
It declares what it is (partitioned, lookups that span the ranks) and inherits the rest: its
tables checkpoint by global row, resume at any number of ranks, export, and train from
launch.train, found by the entry point in tests/plugins. This module and that entry point are all
a new kind costs."""

import tensorflow as tf

from tfscale import distributed
from tfscale.embedding.row_sharding import (ShardedTable, check_partitioned_arguments,
                                            gradient_divided_by)
from tfscale.embedding.strategy import TableStrategy
from tfscale.embedding.table import Table


class ModuloPartitioned(TableStrategy):
    name = "test_modulo"
    description = "partitioned by id mod P (a test strategy)"
    partitioned = True
    lookups_span_ranks = True

    def check(self, embedding):
        check_partitioned_arguments(embedding, self.name)

    def make_table(self, name, rows, width, initializer, regularizer):
        return Table(name, rows, width, self, ShardedTable(rows, width, initializer, name=name))

    def build(self, table, embedding):
        table.layer.build()
        table.attach(table.layer.embeddings, table.layer.shard)

    def lookup(self, tables, rows, embedding, training=False):
        return [_lookup(table, rows, f"test_modulo_{embedding.name}_{table.name}")
                for table in tables]


def _lookup(table, rows, name):
    """[*rows.shape, width]: each row read from its owner."""
    ranks = distributed.size()
    flat = tf.reshape(rows, [-1])
    unique_rows, position = tf.unique(flat, out_idx=tf.int64)
    if ranks == 1:
        found = _owned(table, unique_rows, ranks)
    else:
        hvd = distributed.runtime.horovod()
        owner = tf.cast(unique_rows % ranks, tf.int32)
        order = tf.argsort(owner, stable=True)
        splits = tf.math.bincount(owner, minlength=ranks, maxlength=ranks, dtype=tf.int32)
        asked, asked_splits = hvd.alltoall(tf.gather(unique_rows, order), splits=splits,
                                           name=f"{name}_ids")
        answered, _ = hvd.alltoall(_owned(table, asked, ranks), splits=asked_splits,
                                   name=f"{name}_rows")
        # The gradient divided by P: the owner sums the global batch's mean loss's.
        found = tf.gather(gradient_divided_by(ranks)(answered), tf.math.invert_permutation(order))
    shape = tf.concat([tf.shape(rows, out_type=tf.int64), [table.width]], axis=0)
    return tf.reshape(tf.gather(found, position), shape)


def _owned(table, global_rows, ranks):
    """This rank's rows `global_rows` (all owned here, maybe repeated across senders), read once
    each and recorded (their counts: 1 per sender)."""
    unique_rows, position, counts = tf.unique_with_counts(global_rows // ranks, out_idx=tf.int64)
    table.record_lookup(unique_rows, counts)
    return tf.gather(table.read_rows(unique_rows), position)
