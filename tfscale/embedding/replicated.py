"""The `replicated` table strategy: every rank holds every row of each table (a ReplicatedTable's
variable), looked up once per unique row (tfscale.embedding.dedup) or once per id
(`deduplicate=False`); their gradients are averaged over the ranks by the exchange."""

import keras
import tensorflow as tf

from tfscale.embedding import dedup, placement
from tfscale.embedding.strategy import TableStrategy
from tfscale.embedding.table import RowShard, Table


class Replicated(TableStrategy):
    """The `replicated` strategy, FieldEmbedding's default (`sharding="replicated"`): every rank
    holds every row; a step's rows are looked up on the rank, and their gradients averaged over
    the ranks by the model's embedding exchange. It has no settings."""

    name = "replicated"
    description = "replicated"

    def make_table(self, name, rows, width, initializer, regularizer, dtype):
        layer = ReplicatedTable(rows, width, initializer, regularizer, table_dtype=dtype,
                                name=name)
        return Table(name, rows, width, self, layer)

    def build(self, table, embedding):
        table.layer.build()
        table.attach(table.layer.embeddings, RowShard(table.rows, 1, 0))

    def lookup(self, tables, rows, embedding, training=False):
        if embedding.deduplicate:
            return [dedup.lookup(table, rows) for table in tables]
        return [table.read_rows(rows) for table in tables]


@keras.saving.register_keras_serializable(package="tfscale")
class ReplicatedTable(keras.layers.Layer):
    """Every row of a [rows, dim] table, as the variable `embeddings` (of `table_dtype`, host
    memory, initialised by `embeddings_initializer`, with an optional Keras
    `embeddings_regularizer`). Not autocast, whatever the dtype policy of the layers around it:
    read through its Table (Table.read_rows). Why not keras.layers.Embedding: its variable is
    autocast, and a FieldEmbedding whose dtype policy differs from its model's would read it
    cast whole."""

    def __init__(self, rows, dim, embeddings_initializer, embeddings_regularizer=None,
                 table_dtype="float32", **kwargs):
        kwargs["dtype"] = "float32"
        super().__init__(**kwargs)
        self.rows = int(rows)
        self.dim = int(dim)
        self.embeddings_initializer = embeddings_initializer
        self.embeddings_regularizer = embeddings_regularizer
        self.table_dtype = table_dtype

    def build(self, input_shape=None):
        with tf.device(placement.embedding_device()):
            self.embeddings = self.add_weight(
                shape=(self.rows, self.dim), initializer=self.embeddings_initializer,
                regularizer=self.embeddings_regularizer, dtype=self.table_dtype,
                autocast=False, name="embeddings")
