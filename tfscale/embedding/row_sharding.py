"""The `row` table strategy (tfscale.embedding.strategy): row-sharded embedding tables
(docs/sharding.md). Rank r of P holds the rows of global ids r, r + P, r + 2P, ... of every
sharded table (owner `id mod P`, local row `id div P`), their optimizer state with them, and
looks rows up from the other ranks by alltoall.

A lookup (`lookup`), per FieldEmbedding and step: this rank's unique ids go to their owners and
their rows come back by tfscale.distributed.owner_routing, one routing for all the layer's tables
(which share their rows; (id, count) pairs as int32 while the table's ids fit; rows packed side by
side, in float32 or, with `wire_dtype`, bfloat16); the owner answers with one gather per table of
its rows, recording each lookup with the global batch's counts; gathered to the batch positions. A
shard's gradient then holds one row per id the global batch looked up there: the gradient of the
global batch's mean loss, summed in rank order as the allgather exchange sums the replicated
tables' rows.
tfscale.exchanges.sharded keeps it out of every allreduce. Sharded tables are never broadcast: every
rank initialises its rows from (seed, global id) (tfscale.embedding.initializers.RowSeededNormal),
so the tables equal the whole ones a replicated model starts from, whatever P."""

import keras
import numpy as np
import tensorflow as tf

from tfscale import distributed
from tfscale.distributed.owner_routing import rows_from_owners
from tfscale.embedding import placement, row_wire
from tfscale.embedding.initializers import is_row_independent, with_rank_0_seed
from tfscale.embedding.strategy import TableStrategy
from tfscale.embedding.table import RowShard, Table
from tfscale.errors import UserError


class RowSharded(TableStrategy):
    """The `row` table strategy (module docstring): `FieldEmbedding(sharding="row")`, or
    `sharding=RowSharded(wire_dtype="bfloat16")` for half the alltoall bytes.

    Args:
        wire_dtype: what looked-up rows and their gradients travel in between ranks:
            "float32", or "bfloat16" (half the bytes of each row; rows and gradients rounded
            to bfloat16's 8 significant bits on the way, tables and their updates stay float32).
    """

    name = "row"
    description = "row-sharded"
    partitioned = True
    lookups_span_ranks = True

    def __init__(self, wire_dtype="float32"):
        row_wire.check_wire_dtype(wire_dtype)
        self.wire_dtype = wire_dtype

    def get_config(self):
        return self.name if self.wire_dtype == "float32" else {"name": self.name,
                                                               "wire_dtype": self.wire_dtype}

    def check(self, embedding):
        check_partitioned_arguments(embedding, "row")

    def make_table(self, name, rows, width, initializer, regularizer, dtype):
        return Table(name, rows, width, self, ShardedTable(rows, width, initializer,
                                                           table_dtype=dtype, name=name))

    def build(self, table, embedding):
        table.layer.build()
        table.attach(table.layer.embeddings, table.layer.shard)

    def lookup(self, tables, rows, embedding, training=False):
        return lookup(tables, rows, name=f"tfscale_{embedding.name}", scalars=embedding.scalars,
                      wire_dtype=self.wire_dtype)


@keras.saving.register_keras_serializable(package="tfscale")
class ShardedTable(keras.layers.Layer):
    """This rank's rows (`shard`) of a [total_rows, dim] table, as the variable `embeddings`
    [owned rows, dim] (of `table_dtype`, host memory, not autocast), initialised by
    `initializer.rows(global ids)` or, for a row-independent Keras initializer (zeros,
    constants), by the initializer itself. Read through its Table (Table.read_rows)."""

    def __init__(self, total_rows, dim, initializer, table_dtype="float32", **kwargs):
        kwargs["dtype"] = "float32"
        super().__init__(**kwargs)
        self.table_dtype = table_dtype
        self.total_rows = int(total_rows)
        self.dim = int(dim)
        self.initializer = initializer
        self.shard = None

    def build(self, input_shape=None):
        self.shard = shard = RowShard(self.total_rows, distributed.size(), distributed.rank())
        seeded = with_rank_0_seed(self.initializer)
        if hasattr(seeded, "rows"):
            initializer = lambda shape, dtype=None: seeded.rows(  # noqa: E731
                shard.global_ids(), self.dim, dtype)
        else:
            initializer = seeded
        with tf.device(placement.embedding_device()):
            self.embeddings = self.add_weight(shape=(shard.rows, self.dim),
                                              initializer=initializer, dtype=self.table_dtype,
                                              autocast=False, name="embeddings")


def check_partitioned_arguments(embedding, sharding):
    """UserErrors for the FieldEmbedding arguments a table spread over the ranks by ids
    (`sharding`: "row", "dynamic") cannot take: `deduplicate=False` (each unique id of a batch
    goes to its owner once), an initializer whose rows depend on the table's shape, a Keras
    regularizer (its gradient would be dense)."""
    if not embedding.deduplicate:
        raise UserError(f"`deduplicate=False` cannot be used with `sharding={sharding}`: its "
                        "lookup sends each unique id of the batch to its owner once (its outputs "
                        "and summed gradients are those of plain lookups); leave `deduplicate` "
                        "on")
    for argument in ("embeddings_initializer", "wide_initializer"):
        initializer = getattr(embedding, argument)
        if not is_row_independent(initializer):
            raise UserError(
                f"`{argument}={type(initializer).__name__}`: `sharding={sharding}` needs an "
                "initializer whose rows do not depend on the table's shape "
                "(tfscale.embedding.initializers.RowSeededNormal, zeros or a constant)")
    for argument in ("embeddings_regularizer", "wide_regularizer"):
        if getattr(embedding, argument) is not None:
            raise UserError(f"`{argument}`: a table with `sharding={sharding}` cannot carry a "
                            "Keras regularizer (its gradient would be dense): give the embedding "
                            "L2 to the optimizer (RowSparseAdam's `table_l2`, CowClip's `l2`) or "
                            "none")


def lookup(tables, rows, name, scalars=None, wire_dtype="float32"):
    """The rows `rows` (int64, any shape, global ids) of each of `tables` (built row-sharded
    Tables of one total size), as [*rows.shape, width] tensors; each table's lookup recorded on
    it (Table.record_lookup) with each owned row's global occurrence count. `name` must be the
    same on every rank. With `scalars` (a StepScalars), the step's alltoall bytes (payload, both
    passes) and the lookup's seconds are recorded. `wire_dtype`: RowSharded's."""
    shard = tables[0].shard
    if shard.num_shards != distributed.size():
        raise UserError(
            f"{tables[0].variable.path} was built as {shard.num_shards} row shard(s) but the job "
            f"has {distributed.size()} Horovod ranks (was the model built before Horovod "
            "started?): call tfscale.distributed.init() before building a model with "
            "`sharding=row`")
    flat = tf.reshape(rows, [-1])
    unique_ids, position, counts = tf.unique_with_counts(flat, out_idx=tf.int64)
    if shard.num_shards == 1:
        per_unique = _gather_owned(tables, unique_ids, counts, shard)
    elif scalars is None:
        per_unique = _through_owners(tables, unique_ids, counts, shard, name, wire_dtype)
    else:
        per_unique, seconds = scalars.timed(unique_ids, lambda: _through_owners(
            tables, unique_ids, counts, shard, name, wire_dtype, scalars))
        scalars.record("sharding/lookup_seconds", seconds)
    vectors = tf.gather(per_unique, position)
    shape = tf.shape(rows, out_type=tf.int64)
    return [tf.reshape(part, tf.concat([shape, [table.width]], axis=0))
            for part, table in zip(tf.split(vectors, [t.width for t in tables], axis=1), tables)]


def _through_owners(tables, unique_ids, counts, shard, name, wire_dtype, scalars=None):
    """[len(unique_ids), sum of widths]: each id's rows, fetched from its owner."""
    id_dtype = _id_dtype(shard.total_rows)
    routed = rows_from_owners(
        unique_ids, counts, lambda owned, owned_counts: _gather_owned(
            tables, owned, owned_counts, shard), name, id_dtype, wire_dtype)
    if scalars is not None:
        _record_bytes(scalars, routed.splits, routed.incoming_splits, shard.index,
                      2 * id_dtype.size,
                      row_wire.wire_bytes(wire_dtype) * sum(table.width for table in tables))
    return routed.rows


def _id_dtype(total_rows):
    """The dtype (id, count) pairs travel in: int32 while the table's ids fit (8 bytes a pair,
    not 16), else int64."""
    return tf.int32 if total_rows <= np.iinfo(np.int32).max else tf.int64


def _record_bytes(scalars, splits, incoming_splits, rank, pair_bytes, row_bytes):
    """Bytes this rank sends and receives to and from the other ranks in a lookup and its
    backward pass: (id, count) pairs of `pair_bytes` out, rows back, row gradients out again."""
    to_others = tf.cast(tf.reduce_sum(splits) - splits[rank], tf.float64)
    from_others = tf.cast(tf.reduce_sum(incoming_splits) - incoming_splits[rank], tf.float64)
    scalars.record("sharding/alltoall_bytes_sent",
                   pair_bytes * to_others + row_bytes * (from_others + to_others))
    scalars.record("sharding/alltoall_bytes_received",
                   pair_bytes * from_others + row_bytes * (to_others + from_others))


def _gather_owned(tables, owned_ids, counts, shard):
    """[len(owned_ids), sum of widths]: this rank's rows of `owned_ids` (unique, all owned
    here), each table's lookup recorded with the ids' counts."""
    local_rows = owned_ids // shard.num_shards
    for table in tables:
        table.record_lookup(local_rows, counts)
    return tf.concat([table.read_rows(local_rows) for table in tables], axis=1)
