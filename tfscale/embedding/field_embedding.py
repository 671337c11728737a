"""The categorical-feature embedding layer shared by all CTR models: one concatenated table per
embedding kind (a deep [total_vocabulary, dim] table, optionally a 1-wide linear "wide" table),
per-field row offsets, rows stored in float32 or half precision (tfscale.embedding.table_dtypes),
an in-graph range check of the ids, tables and lookups in host memory
(tfscale.embedding.placement), de-duplicated lookups (tfscale.embedding.dedup), with
`sharding="row"` tables split by rows over the ranks (tfscale.embedding.row_sharding), and with
`sharding="dynamic"` tables whose rows are given to ids as they arrive
(tfscale.embedding.dynamic). Each table is a tfscale.embedding.table.Table, held by the strategy
`sharding` names (tfscale.embedding.strategies). The tables' names are
tfscale.embedding.table_names', by which a user's keras.optimizers.OptimizerMap or CowClip's
`embedding_tables` tells the two apart."""

import keras
import numpy as np
import tensorflow as tf

from tfscale import distributed
from tfscale.embedding import placement, strategies, table_dtypes
from tfscale.embedding.initializers import RowSeededNormal
from tfscale.embedding.table_names import DEEP_TABLE_NAME, WIDE_TABLE_NAME
from tfscale.errors import DATA_ERROR_MARKER
from tfscale.step_scalars import StepScalars


@keras.saving.register_keras_serializable(package="tfscale")
class FieldEmbedding(keras.layers.Layer):
    """Looks up every categorical field of a batch in one concatenated table per kind.

    Field f owns rows [offset_f, offset_f + vocabulary_sizes[f]) of each table, so a batch of ids
    [B, n_fields] costs one gather per table. The tables are stored in `table_dtype` whatever
    the dtype policy, read as float32; the outputs are cast to the layer's compute dtype.

    Args:
        vocabulary_sizes: rows per field (`FeatureSchema.vocabulary_sizes`).
        embedding_dim: width of the deep table.
        use_wide: also build the 1-wide linear table and return the summed linear term.
        embeddings_initializer: deep table initializer; default RowSeededNormal(stddev=0.01),
            seeded from the global seed (`keras.utils.set_random_seed`).
        wide_initializer: wide table initializer (default zeros, as DeepCTR's linear part).
        embeddings_regularizer: e.g. `keras.regularizers.L2(l)`, applied to the whole deep
            table (the CowClip paper's L2).
        wide_regularizer: the same for the wide table.
        check_ids: assert in the graph that field f's ids lie in [0, vocabulary_sizes[f]); an id
            out of range would otherwise silently read the next field's rows. The assertion is a
            no-op inside XLA-compiled functions.
        deduplicate: look each table up once per unique row of the batch and gather back
            (tfscale.embedding.dedup); the gradients then hold one row per unique id. False: one
            gathered row per occurrence (the same outputs and summed gradients).
        sharding: the table strategy (tfscale.embedding.strategies): "replicated" (every rank
            holds the whole tables), "row" (each Horovod rank holds the rows id mod P == rank
            and looks the others up by alltoall; de-duplicated, so not with
            `deduplicate=False`; the initializers must be row-independent: RowSeededNormal,
            zeros, constants; no regularizers) or "dynamic" (rows given to ids as they arrive
            in training, for ids that are any ints in [0, 2**56) per field; as "row" in what it
            takes; `vocabulary_sizes` sums to the rows in use at most, or give
            `tfscale.embedding.DynamicTables(capacity=..., min_count=...)`), or a
            TableStrategy.
        table_dtype: what the tables store their rows in: "float32", or "bfloat16" / "float16"
            (half the bytes a row; read as float32, updated in float32 by a tfscale row-sparse
            optimizer and written back with stochastic rounding: tfscale.embedding.table_dtypes).
        **kwargs: keras.layers.Layer's keyword arguments (`name`, `dtype`, ...).

    Raises:
        ValueError: `vocabulary_sizes` is empty or has a field of fewer than 1 row,
            `sharding` names no table strategy, or `table_dtype` is not one of "float32",
            "bfloat16", "float16".
        UserError: the table strategy cannot hold an argument (`sharding="row"` or "dynamic"
            with `deduplicate=False`, a row-dependent initializer or a regularizer; "dynamic"
            with more fields than it keys ids by, or more rows than it holds by default without
            a `capacity`); at build, under horovodrun before `tfscale.distributed.init()`.

    The tables live in host memory (tfscale.embedding.placement.embedding_device), where their
    lookups run. `tables` are their Tables (tfscale.embedding.table); `row_index` is the
    strategy's state they share on this rank (a dynamic table's id map), or None.

    Call: int ids [B, n_fields] -> embeddings [B, n_fields, embedding_dim], and with `use_wide`
    the tuple (embeddings, linear term [B, 1]).

    Example:
        ```python
        ids = keras.Input((3,), dtype="int64")                   # 3 categorical fields
        vectors, linear = tfscale.FieldEmbedding([40, 30, 50], embedding_dim=4, use_wide=True)(ids)
        logit = keras.layers.Dense(1)(keras.layers.Flatten()(vectors)) + linear
        model = tfscale.FunctionalTrainStepModel(ids, keras.layers.Activation("sigmoid")(logit))
        ```
    """

    def __init__(
        self,
        vocabulary_sizes,
        embedding_dim=10,
        use_wide=False,
        embeddings_initializer=None,
        wide_initializer="zeros",
        embeddings_regularizer=None,
        wide_regularizer=None,
        check_ids=True,
        deduplicate=True,
        sharding="replicated",
        table_dtype="float32",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.vocabulary_sizes = tuple(int(s) for s in vocabulary_sizes)
        if not self.vocabulary_sizes or min(self.vocabulary_sizes) < 1:
            raise ValueError(f"need at least one field of at least 1 row, got {vocabulary_sizes}")
        self.embedding_dim = int(embedding_dim)
        self.use_wide = bool(use_wide)
        self.check_ids = bool(check_ids)
        self.deduplicate = bool(deduplicate)
        self.strategy = strategies.get(sharding)
        self.table_dtype = table_dtypes.checked(table_dtype)
        self.scalars = StepScalars()
        # XLA has no kernels for its lookups (UniqueWithCounts, Horovod's alltoall): Keras's
        # "auto" then keeps XLA off, also on a GPU host.
        self.supports_jit = False
        # Tables are read as variables (Table.read_rows), never autocast: the
        # outputs are cast to the compute dtype instead.
        self.autocast = False
        if embeddings_initializer is None:
            embeddings_initializer = RowSeededNormal(stddev=0.01)
        self.embeddings_initializer = keras.initializers.get(embeddings_initializer)
        self.wide_initializer = keras.initializers.get(wide_initializer)
        self.embeddings_regularizer = keras.regularizers.get(embeddings_regularizer)
        self.wide_regularizer = keras.regularizers.get(wide_regularizer)

        self.strategy.check(self)

        sizes = np.array(self.vocabulary_sizes, dtype=np.int64)
        self._id_limits = np.array(self.strategy.id_limits(self.vocabulary_sizes), dtype=np.int64)
        self._offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        total = int(sizes.sum())
        self.row_index = self.strategy.make_row_index(self)
        self.tables = [self.strategy.make_table(DEEP_TABLE_NAME, total, self.embedding_dim,
                                                self.embeddings_initializer,
                                                self.embeddings_regularizer, self.table_dtype)]
        if self.use_wide:
            self.tables.append(self.strategy.make_table(WIDE_TABLE_NAME, total, 1,
                                                        self.wide_initializer,
                                                        self.wide_regularizer, self.table_dtype))
        # The Keras layers owning the tables' variables (their paths: tfscale.embedding.table_names).
        self.deep_table = self.tables[0].layer
        self.wide_table = self.tables[1].layer if self.use_wide else None

    @property
    def num_fields(self):
        return len(self.vocabulary_sizes)

    @property
    def offsets(self):
        """First row of each field in the concatenated tables (int64 [n_fields])."""
        return self._offsets.copy()

    def build(self, input_shape=None):
        distributed.require_started(f"building FieldEmbedding {self.name!r}")
        for table in self.tables:
            self.strategy.build(table, self)
        if self.strategy.partitioned:
            self.scalars.record("sharding/table_bytes", sum(
                tf.as_dtype(table.variable.dtype).size * np.prod(table.variable.shape)
                for table in self.tables))

    def summary_scalars(self):
        """{name: value} of a layer with partitioned tables: its tables' bytes on this rank, and
        the last step's alltoall bytes and lookup seconds; {} when replicated.

        Returns:
            A dict from scalar name to value, for TensorBoard."""
        return self.scalars.summary_scalars()

    def call(self, ids, training=None):
        with tf.device(placement.embedding_device()):
            ids = tf.cast(ids, tf.int64)
            if self.check_ids:
                # The lookups wait for the check, so a bad id reports this message, not the
                # gather's.
                check = self._assert_ids_in_range(ids)
                with tf.control_dependencies([check] if check is not None else []):
                    ids = tf.identity(ids)
            looked_up = self.strategy.lookup(self.tables,
                                             self.strategy.table_ids(ids, self._offsets), self,
                                             training=bool(training))
            embeddings = tf.cast(looked_up[0], self.compute_dtype)
            if self.wide_table is None:
                return embeddings
            # [B, n_fields, 1] -> [B, 1]
            linear = tf.reduce_sum(looked_up[1], axis=1)
            return embeddings, tf.cast(linear, self.compute_dtype)

    def _assert_ids_in_range(self, ids):
        column_ok = tf.reduce_all((ids >= 0) & (ids < self._id_limits), axis=0)
        column = tf.argmin(tf.cast(column_ok, tf.int32), output_type=tf.int64)
        values = tf.gather(ids, column, axis=1)
        # Only string literals and numbers as data, so the op also compiles (as a no-op) in XLA.
        # Returns the assert op in a graph, None when run eagerly (it has raised already).
        return tf.debugging.Assert(
            tf.reduce_all(column_ok),
            [
                DATA_ERROR_MARKER + "a categorical id is outside the embedding rows of its field (size "
                "the vocabulary from the full data, train and test, or map unseen ids to row 0); "
                "column, smallest id, largest id, rows:",
                column,
                tf.reduce_min(values),
                tf.reduce_max(values),
                tf.gather(self._id_limits, column),
            ],
        )

    def compute_output_shape(self, input_shape):
        embeddings = (*input_shape, self.embedding_dim)
        if self.wide_table is None:
            return embeddings
        return embeddings, (input_shape[0], 1)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "vocabulary_sizes": list(self.vocabulary_sizes),
                "embedding_dim": self.embedding_dim,
                "use_wide": self.use_wide,
                "embeddings_initializer": keras.initializers.serialize(self.embeddings_initializer),
                "wide_initializer": keras.initializers.serialize(self.wide_initializer),
                "embeddings_regularizer": keras.regularizers.serialize(self.embeddings_regularizer),
                "wide_regularizer": keras.regularizers.serialize(self.wide_regularizer),
                "check_ids": self.check_ids,
                "deduplicate": self.deduplicate,
                "sharding": self.strategy.get_config(),
                "table_dtype": self.table_dtype,
            }
        )
        return config
