"""A partitioned table strategy that lives outside the package, for tests/test_table_strategies.py:
table row i lives on rank i mod P, and a lookup sends each unique row to its owner and gets it
back through tfscale.distributed.owner_routing (one table at a time, no packing, no counts over the ranks: a toy).
It declares what it is (partitioned, lookups that span the ranks) and inherits the rest: its
tables checkpoint by global row, resume at any number of ranks, export, and train from
launch.train, found by the entry point in tests/plugins. This module and that entry point are all
a new kind costs."""

import tensorflow as tf

from tfscale import distributed
from tfscale.distributed.owner_routing import rows_from_owners
from tfscale.embedding.row_sharding import ShardedTable, check_partitioned_arguments
from tfscale.embedding.strategy import TableStrategy
from tfscale.embedding.table import Table


class ModuloPartitioned(TableStrategy):
    name = "test_modulo"
    description = "partitioned by id mod P (a test strategy)"
    partitioned = True
    lookups_span_ranks = True

    def check(self, embedding):
        check_partitioned_arguments(embedding, self.name)

    def make_table(self, name, rows, width, initializer, regularizer, dtype):
        return Table(name, rows, width, self, ShardedTable(rows, width, initializer,
                                                           table_dtype=dtype, name=name))

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
        found = _owned(table, unique_rows, tf.ones_like(unique_rows), ranks)
    else:
        found = rows_from_owners(unique_rows, tf.ones_like(unique_rows), lambda owned, counts:
                                 _owned(table, owned, counts, ranks), name).rows
    shape = tf.concat([tf.shape(rows, out_type=tf.int64), [table.width]], axis=0)
    return tf.reshape(tf.gather(found, position), shape)


def _owned(table, global_rows, counts, ranks):
    """This rank's rows `global_rows` (unique, all owned here), recorded with their `counts`
    (1 per sender)."""
    local_rows = global_rows // ranks
    table.record_lookup(local_rows, counts)
    return table.read_rows(local_rows)
