"""Row-sharded embedding tables (docs/sharding.md): rank r of P holds the rows of global ids
r, r + P, r + 2P, ... of every sharded table (owner `id mod P`, local row `id div P`), their
optimizer state with them, and looks rows up from the other ranks by alltoall.

A lookup (`lookup`), per FieldEmbedding and step: this rank's unique ids; one `hvd.alltoall` of
(id, occurrences) pairs (int32 while the table's ids fit) to the owners (one for all the layer's
tables, which share their rows); unique again on the owner, whose occurrence sums are the global
batch's counts; one gather per table of the owned rows; one alltoall of the tables' rows (packed
side by side) back; gathered to the batch positions. The backward pass is the mirror, by Horovod's
alltoall gradient: each rank's row gradients, divided by P, return to the owner and are summed per
id by the gather's gradient, so a shard's gradient holds one row per id the global batch looked up
there: the gradient of the global batch's mean loss (each rank's loss is the mean over its B/P
examples), summed in rank order as the allgather exchange sums the replicated tables' rows.
tfscale.exchanges.sharded keeps it out of every allreduce. Sharded tables are never broadcast:
every rank initialises its rows from (seed, global id) (tfscale.initializers.RowSeededNormal), so
the tables equal the whole ones a replicated model starts from, whatever P."""

import dataclasses

import keras
import numpy as np
import tensorflow as tf

from tfscale import dedup, distributed, placement
from tfscale.errors import UserError
from tfscale.optimizers.capabilities import wrapped_optimizers
from tfscale.tables import is_embedding_table, lookup_rows

SHARDINGS = ("replicated", "row")


@dataclasses.dataclass(frozen=True)
class RowShard:
    """Which rows of a table of `total_rows` rank `index` of `num_shards` owns."""

    total_rows: int
    num_shards: int
    index: int

    @property
    def rows(self):
        """The number of rows this rank owns (0 when the table has fewer rows than ranks)."""
        return max(0, -(-(self.total_rows - self.index) // self.num_shards))

    def global_ids(self):
        """The global ids of this rank's rows, in local-row order (int64 numpy array)."""
        return np.arange(self.index, self.total_rows, self.num_shards, dtype=np.int64)


def shard_of(variable):
    """The RowShard of a sharded table variable, or None."""
    return getattr(variable, "_tfscale_row_shard", None)


def describe(model):
    """How `model`'s embedding tables are held, with their rows and bytes (tables and their
    optimizer state, which this builds) on this rank."""
    model.optimizer.build(model.trainable_variables)
    tables = [v for v in model.trainable_variables if is_embedding_table(v)]
    held = tables + optimizer_state(model.optimizer, tables)
    megabytes = sum(int(np.prod(v.shape)) * tf.as_dtype(v.dtype).size for v in held) / 1e6
    rows = sum(int(v.shape[0]) for v in tables)
    shards = [shard_of(v) for v in tables if shard_of(v) is not None]
    if not shards:
        return f"tables replicated: {rows:,} rows, {megabytes:,.0f} MB with optimizer state"
    return (f"tables row-sharded over {shards[0].num_shards} ranks: {rows:,} rows, "
            f"{megabytes:,.0f} MB with optimizer state per rank")


def local_variables(model):
    """`model`'s row-sharded tables and their per-row state in its (built) optimizer: the
    variables that differ between ranks (and are never broadcast). A UserError when the
    optimizer keeps other state of a shard that it does not declare (see `mark_whole_table`)."""
    shards = [v for v in model.variables if shard_of(v) is not None]
    local = []
    for shard in shards:
        rows = per_row_state(model.optimizer, shard)
        for slot in optimizer_state(model.optimizer, [shard]):
            if not (len(slot.shape) == 0 or getattr(slot, "_tfscale_whole_table", False)
                    or any(slot is row for row in rows)):
                raise UserError(
                    f"{type(model.optimizer).__name__} keeps {slot.path} of shape "
                    f"{tuple(slot.shape)} for the row-sharded table {shard.path}: state that is "
                    "neither per row nor summed over the shards by the optimizer; use an "
                    "optimizer tfscale shards (Adam, RowSparseAdam, CowClip, CAME, SGD), or "
                    "replicated tables")
        local += [shard] + rows
    return local


def mark_per_row(slot):
    """Declares that optimizer variable `slot`, whose shape is not its table's, holds one entry
    per row of its table (e.g. CAME's row statistics): it is sharded and checkpointed with the
    table's rows."""
    slot._tfscale_per_row = True


def mark_whole_table(slot):
    """Declares that optimizer variable `slot` spans every row of its table and that its
    optimizer sums it over the shards itself (e.g. CAME's column statistics): every rank holds
    it whole, the same, and it is broadcast and checkpointed as a whole."""
    slot._tfscale_whole_table = True


def per_row_state(optimizer, table):
    """The variables of `optimizer` with one entry per row of `table`: those of the table's
    shape (Adam's moments) and those marked by `mark_per_row`."""
    return [slot for slot in optimizer_state(optimizer, [table])
            if tuple(slot.shape) == tuple(table.shape) or getattr(slot, "_tfscale_per_row", False)]


def optimizer_state(optimizer, variables):
    """The variables of `optimizer` (built; a loss scaler's or a MultiOptimizer's inner ones
    too) holding state of `variables`. A Keras optimizer keeps each kind of state in a list
    aligned with the variables it was built on (Adam's `_momentums`, Adafactor's `_r`, CAME's
    `_rows`, ...): this reads those lists, not the slots' names, which Keras does not make
    unique (Adafactor names its factors after the variable alone)."""
    wanted = {id(v) for v in variables}
    state = []
    for inner in wrapped_optimizers(optimizer):
        built_on = list(getattr(inner, "_trainable_variables", []))
        for value in vars(inner).values():
            if not (isinstance(value, list) and value and len(value) == len(built_on)
                    and all(s is None or isinstance(s, keras.Variable) for s in value)):
                continue
            state += [slot for variable, slot in zip(built_on, value)
                      if slot is not None and slot is not variable and id(variable) in wanted]
    return state


@keras.saving.register_keras_serializable(package="tfscale")
class ShardedTable(keras.layers.Layer):
    """This rank's rows of a [total_rows, dim] table, as the variable `embeddings` [owned rows,
    dim] (float32, host memory), initialised by `initializer.rows(global ids)` or, for a
    row-independent Keras initializer (zeros, constants), by the initializer itself.

    Call: local rows (int64 [n]) -> their values (float32 [n, dim]), read as its optimizer
    updates it (tfscale.tables.lookup_rows), in float32 whatever the model's dtype policy (the
    variable is not autocast)."""

    def __init__(self, total_rows, dim, initializer, **kwargs):
        kwargs["dtype"] = "float32"
        super().__init__(**kwargs)
        self.total_rows = int(total_rows)
        self.dim = int(dim)
        self.initializer = initializer

    def build(self, input_shape=None):
        shard = RowShard(self.total_rows, distributed.size(), distributed.rank())
        if hasattr(self.initializer, "rows"):
            initializer = lambda shape, dtype=None: self.initializer.rows(  # noqa: E731
                shard.global_ids(), self.dim, dtype)
        else:
            initializer = self.initializer
        with tf.device(placement.embedding_device()):
            self.embeddings = self.add_weight(shape=(shard.rows, self.dim),
                                              initializer=initializer, dtype="float32",
                                              autocast=False, name="embeddings")
        # On the Keras variable and on the tf.Variable it holds, which Keras's TensorFlow
        # optimizers hand to `update_step`.
        self.embeddings._tfscale_row_shard = self.embeddings.value._tfscale_row_shard = shard

    def call(self, local_rows):
        return lookup_rows(self.embeddings, local_rows)


def lookup(tables, rows, name, scalars=None):
    """The rows `rows` (int64, any shape, global ids) of each of `tables` (built ShardedTables of
    one total size), as [*rows.shape, dim] tensors; recorded for the step (tfscale.dedup) with
    each owned row's global occurrence count. `name` must be the same on every rank. With
    `scalars` (a StepScalars), the step's alltoall bytes (payload, both passes) and the
    lookup's seconds are recorded."""
    shard = shard_of(tables[0].embeddings)
    if shard.num_shards != distributed.size():
        raise UserError(
            f"{tables[0].embeddings.path} was built as {shard.num_shards} row shard(s) but the job "
            f"has {distributed.size()} Horovod ranks (was the model built before Horovod "
            "started?): call tfscale.distributed.init() before building a model with "
            "`sharding=row`")
    flat = tf.reshape(rows, [-1])
    unique_ids, position, counts = tf.unique_with_counts(flat, out_idx=tf.int64)
    if shard.num_shards == 1:
        per_unique = _gather_owned(tables, unique_ids, counts, shard)
    elif scalars is None:
        per_unique = _through_owners(tables, unique_ids, counts, shard, name)
    else:
        per_unique, seconds = scalars.timed(unique_ids, lambda: _through_owners(
            tables, unique_ids, counts, shard, name, scalars))
        scalars.record("sharding/lookup_seconds", seconds)
    vectors = tf.gather(per_unique, position)
    shape = tf.shape(rows, out_type=tf.int64)
    return [tf.reshape(part, tf.concat([shape, [table.dim]], axis=0))
            for part, table in zip(tf.split(vectors, [t.dim for t in tables], axis=1), tables)]


def _through_owners(tables, unique_ids, counts, shard, name, scalars=None):
    """[len(unique_ids), sum of dims]: each id's rows, fetched from its owner by alltoall."""
    hvd = distributed.runtime.horovod()
    owner = tf.cast(unique_ids % shard.num_shards, tf.int32)
    order = tf.argsort(owner, stable=True)
    splits = tf.math.bincount(owner, minlength=shard.num_shards, maxlength=shard.num_shards,
                              dtype=tf.int32)
    id_dtype = _id_dtype(shard.total_rows)
    outgoing = tf.stack([tf.cast(tf.gather(unique_ids, order), id_dtype),
                         tf.cast(tf.gather(counts, order), id_dtype)], axis=1)
    incoming, incoming_splits = hvd.alltoall(outgoing, splits=splits, name=f"{name}_ids")
    incoming = tf.cast(incoming, tf.int64)
    owned, owned_position = tf.unique(incoming[:, 0], out_idx=tf.int64)
    owned_counts = tf.math.unsorted_segment_sum(incoming[:, 1], owned_position, tf.size(owned))
    rows = tf.gather(_gather_owned(tables, owned, owned_counts, shard), owned_position)
    returned, _ = hvd.alltoall(rows, splits=incoming_splits, name=f"{name}_rows")
    if scalars is not None:
        _record_bytes(scalars, splits, incoming_splits, shard.index,
                      2 * id_dtype.size, 4 * sum(table.dim for table in tables))
    return tf.gather(_gradient_divided_by(shard.num_shards)(returned),
                     tf.math.invert_permutation(order))


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


def _gradient_divided_by(num_ranks):
    """The identity, whose gradient is divided by `num_ranks` (a division, as Horovod's
    average divides)."""

    @tf.custom_gradient
    def identity(rows):
        return tf.identity(rows), lambda gradient: tf.convert_to_tensor(gradient) / num_ranks

    return identity


def _gather_owned(tables, owned_ids, counts, shard):
    """[len(owned_ids), sum of dims]: this rank's rows of `owned_ids` (unique, all owned here),
    each table's lookup recorded with the ids' counts."""
    local_rows = owned_ids // shard.num_shards
    parts = []
    for table in tables:
        dedup.record(table.embeddings, local_rows, counts)
        parts.append(table(local_rows))
    return tf.concat(parts, axis=1)
