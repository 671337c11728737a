"""The `dynamic` table strategy (docs/dynamic.md): tables whose rows are given to ids as they arrive
in training, for id spaces that grow (online training on a daily stream).

Ids are 64-bit keys `field << 56 | id` (a field's ids are any ints in [0, 2**56): raw integers,
or a string's fingerprint: tfscale.data). The owner of key k is rank k mod P, as for row-sharded
tables (tfscale.embedding.row_sharding), which also lends its alltoall. Each rank holds a
fixed-capacity table per kind (an ordinary float32 Keras variable, so every row-sparse optimizer
updates it unchanged) and the map of which id each row holds (tfscale.embedding.id_rows.IdRows:
admission after `min_count` occurrences, least-recently-used eviction at `capacity`). An id
without a row reads its field's shared unknown row (a small replicated [fields, width] variable
per table, averaged over the ranks as dense weights are). A row given to a new id starts from the
initializer's row for that id (RowSeededNormal.keyed_rows) and the train step resets its
optimizer state (Table.record_lookup's `fresh_rows`). The tables start unwritten
(tfscale.embedding.table.unwritten), so a rank's memory follows the rows handed out, not the
capacity; a table updated whole (every row read every step) has its other rows written with
zeros first (`updated_whole`). Evaluation and prediction look ids up without counting or
admitting them. A SavedModel holds the rows in use only, in compact tables
(tfscale.embedding.dynamic_serving)."""

import dataclasses

import keras
import tensorflow as tf

from tfscale import distributed
from tfscale.distributed.owner_routing import rows_from_owners
from tfscale.embedding import placement
from tfscale.embedding.by_id_checkpoint import BY_ID
from tfscale.embedding.dynamic_serving import served_tables
from tfscale.embedding.id_rows import IdRows, write_rows_from
from tfscale.embedding.initializers import keyed_rows, with_rank_0_seed
from tfscale.embedding.row_sharding import check_partitioned_arguments
from tfscale.embedding.strategy import TableStrategy
from tfscale.embedding.table import RowShard, Table, unwritten
from tfscale.errors import UserError

FIELD_BITS = 56  # a key is field << FIELD_BITS | id
MAX_FIELDS = 127  # fields that fit above the id bits of a non-negative int64
MAX_DEFAULT_CAPACITY = 1 << 31  # the vocabulary sizes' sum taken as capacity at most


@dataclasses.dataclass(frozen=True)
class DynamicTables(TableStrategy):
    """The `dynamic` strategy: `FieldEmbedding(sharding="dynamic")` with the defaults, or
    `sharding=DynamicTables(capacity=..., min_count=...)`.

    Args:
        capacity: rows in use at most, summed over the ranks (None: the sum of the
            FieldEmbedding's `vocabulary_sizes`). Memory follows the rows handed out: per row,
            width x 4 bytes per table, the optimizer's state of the row and 32 bytes of IdRows
            (plus its id map), up to capacity rows (10% more at P > 1: IdRows).
        min_count: occurrences in training batches before an id gets a row (1: at once).
        evict_fraction: the share of capacity one eviction frees (evictions are batched).
        expire_after_steps: also free rows unseen for this many training steps (checked every
            that many steps), or None.
        sketch_width: admission counters per sketch row (with min_count > 1; 8 bytes each).
    """

    capacity: int = None
    min_count: int = 1
    evict_fraction: float = 0.1
    expire_after_steps: int = None
    sketch_width: int = 1 << 20

    name = "dynamic"
    description = "dynamic (rows given to ids as they arrive)"
    partitioned = True
    lookups_span_ranks = True
    takes_any_ids = True
    checkpoint_format = BY_ID
    hands_out_rows = True
    # A row evicted and given to another id within the staleness window would take the old
    # id's late gradient.
    takes_late_gradients = False

    def __post_init__(self):
        if self.capacity is not None and int(self.capacity) < 1:
            raise UserError(f"`capacity={self.capacity}`: give the dynamic tables at least 1 row")
        if int(self.min_count) < 1:
            raise UserError(f"`min_count={self.min_count}`: an id is admitted after at least 1 "
                            "occurrence; give 1 (at once) or more")
        if not 0 < float(self.evict_fraction) < 1:
            raise UserError(f"`evict_fraction={self.evict_fraction}`: give a share in (0, 1)")
        if self.expire_after_steps is not None and int(self.expire_after_steps) < 1:
            raise UserError(f"`expire_after_steps={self.expire_after_steps}`: give a number of "
                            "steps >= 1, or None")
        if int(self.sketch_width) < 5:
            raise UserError(f"`sketch_width={self.sketch_width}`: give at least 5 counters")

    def get_config(self):
        return {"name": self.name, **dataclasses.asdict(self)}

    def check(self, embedding):
        check_partitioned_arguments(embedding, self.name)
        if embedding.num_fields > MAX_FIELDS:
            raise UserError(f"`vocabulary_sizes` has {embedding.num_fields} fields; dynamic "
                            f"tables key ids by field and hold at most {MAX_FIELDS}")

    def id_limits(self, vocabulary_sizes):
        return [1 << FIELD_BITS] * len(vocabulary_sizes)

    def table_ids(self, ids, offsets):
        fields = tf.range(tf.shape(ids)[-1], dtype=tf.int64)
        return tf.bitwise.bitwise_or(tf.bitwise.left_shift(fields, FIELD_BITS), ids)

    def make_row_index(self, embedding):
        capacity = int(self.capacity or sum(embedding.vocabulary_sizes))
        if capacity > MAX_DEFAULT_CAPACITY and self.capacity is None:
            raise UserError(f"the vocabulary sizes sum to {capacity:,} rows, more than a dynamic "
                            "table holds by default: give DynamicTables a `capacity` (the rows "
                            "in use at most)")
        return IdRows(capacity, min_count=self.min_count, sketch_width=self.sketch_width,
                      evict_fraction=self.evict_fraction,
                      expire_after_steps=self.expire_after_steps, name="id_rows")

    def make_table(self, name, rows, width, initializer, regularizer, dtype):
        return Table(name, rows, width, self, DynamicTable(width, initializer, table_dtype=dtype,
                                                           name=name))

    def build(self, table, embedding):
        row_index = embedding.row_index
        if not row_index.built:
            row_index.build()
        table.layer.build(row_index.rows, embedding.num_fields)
        table.attach(table.layer.embeddings, RowShard(row_index.rows * distributed.size(),
                                                      distributed.size(), distributed.rank()),
                     row_index)

    def updated_whole(self, table):
        """Writes zeros into the rows of `table` never handed out (once, eagerly): an optimizer
        updating it whole reads every row."""
        if not table.layer.written_whole:
            with tf.init_scope():
                write_rows_from(table.variable, self.written_rows(table), 0.0)
            table.layer.written_whole = True

    def written_rows(self, table):
        return int(table.row_index.next_row.numpy())

    def served(self, tables):
        """The rows in use, copied into compact tables (tfscale.embedding.dynamic_serving)."""
        return served_tables(tables)

    def lookup(self, tables, keys, embedding, training=False):
        # The Tables' row index, not the layer's: a served Table reads through its own.
        return lookup(tables, keys, tables[0].row_index, training,
                      name=f"tfscale_{embedding.name}", scalars=embedding.scalars)


@keras.saving.register_keras_serializable(package="tfscale")
class DynamicTable(keras.layers.Layer):
    """One kind's dynamic table on this rank: `embeddings` [rows, dim] (of `table_dtype`, host
    memory, rows given to ids by IdRows) and `unknown` [fields, dim] (float32), the rows of ids
    without one (one a field, replicated). Read through its Table."""

    def __init__(self, dim, initializer, table_dtype="float32", **kwargs):
        kwargs["dtype"] = "float32"
        super().__init__(**kwargs)
        self.table_dtype = table_dtype
        self.dim = int(dim)
        self.initializer = initializer
        self.written_whole = False  # every row written (DynamicTables.updated_whole)

    def build(self, rows, num_fields):
        self.initializer = with_rank_0_seed(self.initializer)
        with tf.device(placement.embedding_device()):
            self.embeddings = self.add_weight(shape=(rows, self.dim), initializer=unwritten,
                                              dtype=self.table_dtype, autocast=False,
                                              name="embeddings")
            self.unknown = self.add_weight(
                shape=(num_fields, self.dim), dtype="float32", autocast=False, name="unknown",
                initializer=lambda shape, dtype=None: keyed_rows(
                    self.initializer, tf.range(shape[0], dtype=tf.int64) | (1 << 62), shape[1]))


def lookup(tables, keys, row_index, training, name, scalars=None):
    """The rows of `keys` (int64 field-salted ids, any shape) in each of `tables` (one
    FieldEmbedding's dynamic Tables, sharing `row_index`), as [*keys.shape, width] tensors. In
    training, new ids are counted and admitted and each table's lookup is recorded on it with
    its fresh rows."""
    flat = tf.reshape(keys, [-1])
    unique_keys, position, counts = tf.unique_with_counts(flat, out_idx=tf.int64)
    widths = [t.width for t in tables]
    if distributed.size() == 1:
        held = _owned_rows(tables, row_index, unique_keys, counts, training, scalars)
    else:
        held = _through_owners(tables, row_index, unique_keys, counts, training, name, scalars)
    found = held[:, -1:] > 0
    fields = tf.bitwise.right_shift(unique_keys, FIELD_BITS)
    unknown = tf.concat([tf.gather(t.layer.unknown, fields) for t in tables], axis=1)
    vectors = tf.gather(tf.where(found, held[:, :-1], unknown), position)
    shape = tf.shape(keys, out_type=tf.int64)
    return [tf.reshape(part, tf.concat([shape, [width]], axis=0))
            for part, width in zip(tf.split(vectors, widths, axis=1), widths)]


def _through_owners(tables, row_index, unique_keys, counts, training, name, scalars):
    """_owned_rows of each key, fetched from its owner (rank key mod P)."""
    return rows_from_owners(unique_keys, counts, lambda owned, owned_counts: _owned_rows(
        tables, row_index, owned, owned_counts, training, scalars), name).rows


def _owned_rows(tables, row_index, keys, counts, training, scalars):
    """[len(keys), sum of widths + 1]: each table's row of each of `keys` (unique, owned here)
    side by side, and a last column 1 where the id has a row (0, and zero rows, where not)."""
    if training:
        rows, fresh, fresh_keys = row_index.rows_for_step(keys, counts, scalars)
        for table in tables:
            table.variable.value.scatter_update(tf.IndexedSlices(tf.cast(
                keyed_rows(table.layer.initializer, fresh_keys, table.width),
                table.variable.dtype), fresh))
    else:
        rows, fresh = row_index.rows_of(keys), None
    held = tf.where(rows >= 0)[:, 0]
    held_rows = tf.gather(rows, held)
    if training:
        for table in tables:
            table.record_lookup(held_rows, tf.gather(counts, held), fresh)
    values = tf.concat([table.read_rows(held_rows) for table in tables]
                       + [tf.ones([tf.size(held_rows), 1])], axis=1)
    return tf.scatter_nd(held[:, None], values,
                         tf.stack([tf.size(keys, out_type=tf.int64),
                                   sum(t.width for t in tables) + 1]))
