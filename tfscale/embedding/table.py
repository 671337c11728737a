"""`Table`: one embedding table, as the rest of tfscale sees it: its name, its global
shape, the strategy holding it (tfscale.embedding.strategy), the rows this rank holds, how its
optimizer updates it, and the lookup of the step being traced. This module keeps the registry of
Tables by their variable (optimizers and exchanges are handed variables, so tables are found by
them): `Table.attach` registers a Table, `table_of(variable)` finds it, `tables_of(variables)`
those of a variable list, `model_tables(model)` those of a model's layers (also before they are
built). Everything outside tfscale.embedding asks tfscale.embedding.strategies.table_of, which
also registers a user's keras.layers.Embedding tables; the strategy-specific answers here
(`shard_of`, `hands_out_rows`, `written_rows`, `row_indexes_of`) are the same for those tables
whether registered yet or not.

Why a lookup is read by its update: a variable that the optimizer updates by row (scatters)
must be read by row in place (ResourceGather): once a variable is scattered into, TensorFlow
copies the whole buffer on every whole-variable read (its copy-on-read mode), and a whole read
still alive at the scatter is copied too. A variable updated whole (a fused Adam over every row)
must be read whole: an in-place row read would put it in copy-on-read mode and the whole update
would copy it. Either mismatch costs a copy of the table per step, more than a 1K batch's
arithmetic. The train step sets each table's update (`set_updated_by_row`) before tracing the
forward pass.

A table whose rows are written only when given to ids (TableStrategy.hands_out_rows) and its
per-row optimizer state are created `unwritten`: allocated, not written, so not resident until
rows are written (docs/dynamic.md). Nothing reads a row of them before it was written:
`written_rows` says how many leading rows have been."""

import dataclasses
import weakref

import numpy as np
import tensorflow as tf

from tfscale.embedding import table_names
from tfscale.embedding.table_dtypes import as_float32

# id(keras.Variable or the tf.Variable it holds) -> (a weak reference to it, its Table).
_BY_VARIABLE = {}


@dataclasses.dataclass(frozen=True)
class RowShard:
    """Which rows of a table of `total_rows` rank `index` of `num_shards` holds: the global ids
    index, index + num_shards, ... (every row: shard 0 of 1)."""

    total_rows: int
    num_shards: int
    index: int

    @property
    def rows(self):
        """The number of rows this rank holds (0 when the table has fewer rows than ranks)."""
        return max(0, -(-(self.total_rows - self.index) // self.num_shards))

    def global_ids(self):
        """The global ids of this rank's rows, in local-row order (int64 numpy array)."""
        return np.arange(self.index, self.total_rows, self.num_shards, dtype=np.int64)


@dataclasses.dataclass(frozen=True)
class StepLookup:
    """A table's de-duplicated lookup in one step: the rows its gradient will hold (unique,
    in order), how many ids each stands for in the global batch, and the rows given to new ids
    in this step (`fresh_rows`; None for fixed tables), whose optimizer state the train step
    resets."""

    unique_rows: tf.Tensor
    counts: tf.Tensor
    fresh_rows: tf.Tensor = None


class Table:
    """One embedding table of `rows` x `width` (global), held by `strategy` (a TableStrategy)
    in the variable of the Keras layer `layer` (None for a keras.layers.Embedding's table:
    tfscale.embedding.strategies.table_of).

    `variable` (set by `attach` when the layer is built) holds this rank's rows, `shard` says
    which; `partitioned` tables hold different rows on each rank (never broadcast, averaged or
    written whole by one rank). `row_index` is the strategy's own state of this rank's rows
    that differs between ranks (a dynamic table's id map, tfscale.embedding.id_rows.IdRows),
    or None. While a SavedModel is written, a strategy's `served` form may stand in for both
    (TableStrategy.served)."""

    def __init__(self, name, rows, width, strategy, layer):
        self.name = name
        self.layer = layer
        self.rows = int(rows)
        self.width = int(width)
        self.strategy = strategy
        self.variable = None
        self.shard = None
        self.row_index = None
        self.updated_by_row = False  # read whole until the train step says otherwise
        self._lookups = []  # this trace's StepLookups: the last two, enough to see a second one
        self._lookup_graph = None

    def __repr__(self):
        return (f"Table({self.name!r}, {self.rows} x {self.width}, {self.strategy.name}, "
                f"{'by row' if self.updated_by_row else 'whole'})")

    @property
    def partitioned(self):
        return self.strategy.partitioned

    def attach(self, variable, shard, row_index=None):
        """Records the variable holding this rank's rows (`shard`), and the strategy's
        `row_index` of them if any, and makes the table findable by `table_of`."""
        self.variable, self.shard, self.row_index = variable, shard, row_index
        for held in (variable, variable.value):
            key = id(held)
            # The registry is bound to the callback: at exit it may run after module teardown.
            _BY_VARIABLE[key] = (weakref.ref(held, lambda _, key=key, registry=_BY_VARIABLE:
                                             registry.pop(key, None)), self)

    def set_updated_by_row(self, by_row):
        """Whether the optimizer updates this table row by row (read by `read_rows`); a table
        updated whole is told to its strategy (TableStrategy.updated_whole)."""
        self.updated_by_row = bool(by_row)
        if not by_row:
            self.strategy.updated_whole(self)

    def read_rows(self, local_rows):
        """Rows `local_rows` (int, any shape) of this rank's variable as float32, read as the
        optimizer updates it (module docstring); their gradient is float32 row slices (a
        half-precision table's too: tfscale.embedding.table_dtypes)."""
        return as_float32(table_names.gather_rows(self.variable, local_rows,
                                                  in_place=self.updated_by_row))

    def start_step(self):
        """Forgets earlier lookups: the train step calls it before its forward pass."""
        self._lookups, self._lookup_graph = [], None

    def record_lookup(self, unique_rows, counts, fresh_rows=None):
        """Records a de-duplicated lookup (its gradient rows are `unique_rows`, standing for
        `counts` occurrences each; `fresh_rows`: rows given to new ids by it). Lookups traced in
        another graph than the latest (Keras building a subclassed model in a scratch graph) are
        forgotten."""
        graph = None if tf.executing_eagerly() else unique_rows.graph
        if graph is not self._lookup_graph:
            self._lookups, self._lookup_graph = [], graph
        self._lookups = self._lookups[-1:] + [StepLookup(unique_rows, tf.cast(counts, tf.float32),
                                                             fresh_rows)]

    def step_lookup(self):
        """The StepLookup of the step being traced since `start_step` (None if none); a
        ValueError if the table was looked up more than once in it."""
        graph = None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()
        if graph is not self._lookup_graph or not self._lookups:
            return None
        if len(self._lookups) > 1:
            raise ValueError(f"embedding table {self.variable.path} is looked up more than once in "
                             "one step: its gradient rows could not be matched to their counts; "
                             "look all of a step's ids up in one call")
        return self._lookups[0]


def table_of(variable):
    """The registered Table whose rows `variable` (a Keras variable or the tf.Variable it holds)
    holds, or None (module docstring: outside tfscale.embedding, ask
    tfscale.embedding.strategies.table_of)."""
    entry = _BY_VARIABLE.get(id(variable))
    if entry is None or entry[0]() is not variable:
        return None
    return entry[1]


def tables_of(variables):
    """The registered Tables of those of `variables` that hold tables, in order."""
    return [t for t in map(table_of, variables) if t is not None]


def model_tables(model):
    """The Tables of `model`'s layers (FieldEmbedding's `tables`), built or not."""
    return [table for layer in model._flatten_layers() for table in getattr(layer, "tables", ())]


def row_indexes_of(variables):
    """The row indexes (Table.row_index) of the Tables of `variables`, each once."""
    indexes = {id(t.row_index): t.row_index for t in tables_of(variables)
               if t.row_index is not None}
    return list(indexes.values())


def unwritten(shape, dtype=None):
    """An initializer that allocates without writing: a large host buffer then takes no memory
    until its pages are written. Its values are undefined; nothing may read them."""
    return tf.raw_ops.Empty(shape=shape, dtype=tf.as_dtype(dtype or "float32"), init=False)


def hands_out_rows(variable):
    """Whether `variable` is a table whose rows are written when given to ids
    (TableStrategy.hands_out_rows), so its per-row optimizer state can start `unwritten` too."""
    table = table_of(variable)
    return table is not None and table.strategy.hands_out_rows


def written_rows(variable):
    """How many leading rows of table `variable` have been written (eagerly): all of them but
    for a table whose strategy hands out rows (TableStrategy.written_rows)."""
    table = table_of(variable)
    return int(variable.shape[0]) if table is None else table.strategy.written_rows(table)


def shard_of(variable):
    """The RowShard of a partitioned table's variable (a Keras variable or the tf.Variable it
    holds), or None (a replicated table, or not a table)."""
    table = table_of(variable)
    return table.shard if table is not None and table.partitioned else None
