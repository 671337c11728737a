"""A table strategy that lives outside the package, for tests/test_table_strategies.py: each
table holds `BUCKETS` rows (fewer than its ids) on every rank and id i reads row i mod BUCKETS,
de-duplicated. One file plus `tfscale.embedding.strategies.register`, as a new strategy costs."""

import keras

from tfscale.embedding import dedup
from tfscale.embedding.strategy import TableStrategy
from tfscale.embedding.table import RowShard, Table

BUCKETS = 7


class Hashed(TableStrategy):
    name = "test_hashed"

    def make_table(self, name, rows, width, initializer, regularizer, dtype):
        buckets = min(rows, BUCKETS)
        layer = keras.layers.Embedding(buckets, width, embeddings_initializer=initializer,
                                       embeddings_regularizer=regularizer, dtype=dtype,
                                       name=name)
        return Table(name, buckets, width, self, layer)

    def build(self, table, embedding):
        table.layer.build((None,))
        table.attach(table.layer.embeddings, RowShard(table.rows, 1, 0))

    def lookup(self, tables, rows, embedding, training=False):
        return [dedup.lookup(table, rows % table.rows) for table in tables]
