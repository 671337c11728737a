"""The `replicated` table strategy: every rank holds every row of each table (a
keras.layers.Embedding's variable), looked up once per unique row (tfscale.embedding.dedup) or once
per id (`deduplicate=False`); their gradients are averaged over the ranks by the exchange."""

import keras
import tensorflow as tf

from tfscale.embedding import dedup, placement
from tfscale.embedding.strategy import TableStrategy
from tfscale.embedding.table import RowShard, Table


class Replicated(TableStrategy):
    name = "replicated"
    description = "replicated"

    def make_table(self, name, rows, width, initializer, regularizer, dtype):
        layer = keras.layers.Embedding(rows, width, embeddings_initializer=initializer,
                                       embeddings_regularizer=regularizer, dtype=dtype,
                                       name=name)
        return Table(name, rows, width, self, layer)

    def build(self, table, embedding):
        with tf.device(placement.embedding_device()):
            table.layer.build((None,))
        table.attach(table.layer.embeddings, RowShard(table.rows, 1, 0))

    def lookup(self, tables, rows, embedding, training=False):
        if embedding.deduplicate:
            return [dedup.lookup(table, rows) for table in tables]
        return [table.read_rows(rows) for table in tables]
