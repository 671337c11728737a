"""`RowUpdates`: what tfscale's row-sparse optimizers (RowSparseAdam, RowSparseAdagrad,
RowSparseSGD) share. Given an embedding table's gradient as rows (IndexedSlices, as the train
step hands them over: tfscale.optimizers.capabilities), they sum each id's rows, add the table's
L2 to those rows only (`table_l2`: 2 * l2 * w, the gradient of a Keras L2 regularizer, on the
batch's rows), and update only those rows of the table and of its per-row state (gathers and
scatters), so a step costs O(rows in the batch), not O(table rows). Which variables are tables
is tfscale.embedding.strategies.table_of's answer (a strategy's tables, whatever their variable's
name, and keras.layers.Embedding's). Any other variable, or a dense gradient, takes the
optimizer's own dense update.

Why not a Keras regularizer or `weight_decay` on a table: both touch every row every step (the
regularizer's gradient is dense, and Keras's weight decay rewrites every variable whole), so
tables are excluded from `weight_decay` here and take `table_l2` instead.

The per-row state of a table updated by row whose rows are written when given to ids (a dynamic
table: tfscale.embedding.table.hands_out_rows) starts unwritten, taking memory for the rows in
use only; the train step resets a row's state when the row is handed out
(tfscale.optimizers.table_state.reset_rows).

A table stored in half precision (tfscale.embedding.table_dtypes) is updated by row only: its
rows are read as float32, the update is computed in float32 with float32 state, and the new rows
are written back rounded stochastically (`write_rows`; tfscale.optimizers.stochastic_rounding)
from a stateless random stream of (`rounding_seed`, the table, the step): every rank rounds a
replicated table's rows alike, and a run is reproducible."""

import math
import zlib

import tensorflow as tf

from tfscale.embedding.strategies import is_table
from tfscale.embedding.table import hands_out_rows, unwritten
from tfscale.embedding.table_names import gather_rows
from tfscale.embedding.table_dtypes import arithmetic_dtype, is_half
from tfscale.errors import UserError
from tfscale.optimizers.capabilities import TakesRowSlices
from tfscale.optimizers.stochastic_rounding import stochastically_rounded
from tfscale.row_gradients import densify, sum_duplicate_rows


class RowUpdates(TakesRowSlices):
    """Mixin placed before a Keras optimizer class in the bases; the subclass implements
    `update_rows` and writes rows with `write_rows`. Adds the keyword arguments `table_l2` (L2
    strength on the embedding tables' rows a batch touches; 0 by default) and `rounding_seed`
    (the seed of half-precision tables' stochastic rounding; 0 by default, the same on every
    rank). `row_state`: the names of the Keras slots it keeps per row of a table (created
    through `add_variable_from_reference`; float32 for a half-precision table)."""

    row_state = ()
    keeps_half_precision_rows = True

    def __init__(self, *args, table_l2=0.0, rounding_seed=0, **kwargs):
        super().__init__(*args, **kwargs)
        table_l2 = float(table_l2)
        if not (math.isfinite(table_l2) and table_l2 >= 0):
            raise ValueError(f"`table_l2={table_l2}`: give a finite number of 0 or more")
        self.table_l2 = table_l2
        self.rounding_seed = int(rounding_seed)

    def updates_rows_in_place(self, variable):
        return is_table(variable)

    def state_initializer(self, variable, initializer="zeros"):
        """How the per-row state of `variable` starts: `initializer`, or unwritten for a table
        updated by row that hands out rows (module docstring)."""
        if self.updates_rows_in_place(variable) and hands_out_rows(variable):
            return unwritten
        return initializer

    def add_variable_from_reference(self, reference_variable, name=None, initializer="zeros"):
        if name not in self.row_state:
            return super().add_variable_from_reference(reference_variable, name, initializer)
        initializer = self.state_initializer(reference_variable, initializer)
        return self.add_variable(
            shape=reference_variable.shape, initializer=initializer,
            dtype=arithmetic_dtype(reference_variable.dtype),
            name=f"{reference_variable.path.replace('/', '_')}_{name}")

    def _built_on(self, variable):
        """The Keras variable of `variable` (Keras hands `update_step` the tf.Variable it holds,
        which has no path)."""
        return self._trainable_variables[self._get_variable_index(variable)]

    def update_rows(self, variable, ids, gradient_rows, weight_rows, learning_rate):
        """Updates rows `ids` (unique, int64) of `variable` and of its state, given their summed
        gradient (without the L2: `with_table_l2`) and their current values, both
        [len(ids), dim] in the update's dtype (the variable's; float32 for a half-precision
        table), and the learning rate in it too. Writes the rows with `write_rows`."""
        raise NotImplementedError

    def write_rows(self, variable, ids, rows):
        """Writes `rows` (in the update's dtype: float32 for a half-precision table) into rows
        `ids` of `variable`, rounded stochastically for a half-precision table (module
        docstring)."""
        if is_half(variable.dtype):
            salt = zlib.crc32(self._built_on(variable).path.encode()) ^ self.rounding_seed
            seed = tf.stack([tf.constant(salt, tf.int64), tf.cast(self.iterations, tf.int64)])
            rows = stochastically_rounded(rows, variable.dtype, seed)
        self.assign(variable, tf.IndexedSlices(rows, ids))

    def with_table_l2(self, gradient_rows, weight_rows):
        """`gradient_rows` plus the gradient of the tables' L2 at `weight_rows`."""
        if not self.table_l2:
            return gradient_rows
        return gradient_rows + 2 * self.table_l2 * weight_rows

    def update_step(self, gradient, variable, learning_rate):
        keras_variable = self._built_on(variable)
        if isinstance(gradient, tf.IndexedSlices) and self.updates_rows_in_place(keras_variable):
            dtype = arithmetic_dtype(variable.dtype)
            ids, rows, _ = sum_duplicate_rows(gradient)
            weight_rows = gather_rows(variable, ids, in_place=True)
            return self.update_rows(variable, ids, tf.cast(rows, dtype),
                                    tf.cast(weight_rows, dtype), tf.cast(learning_rate, dtype))
        if is_half(variable.dtype):
            raise UserError(
                f"{keras_variable.path} stores its rows in {variable.dtype.name} and got a dense "
                f"gradient: {type(self).__name__} updates a half-precision table by row only; "
                "give it row gradients (`embedding_exchange` allgather or sharded, not dense) or "
                "store the table in float32 (`table_dtype`)")
        gradient = densify(gradient)
        if self.table_l2 and is_table(keras_variable):  # dense: every row
            gradient = (tf.cast(gradient, variable.dtype)
                        + 2 * self.table_l2 * tf.convert_to_tensor(variable))
        return self.update_whole(gradient, variable, learning_rate)

    def update_whole(self, gradient, variable, learning_rate):
        """Updates every row of `variable` and of its state, given its dense gradient (the
        tables' L2 in it): the Keras optimizer's own update unless the subclass keeps the state
        of a table updated by row in other slots."""
        return super().update_step(gradient, variable, learning_rate)

    def _use_weight_decay(self, variable):
        return (not is_table(self._built_on(variable))
                and super()._use_weight_decay(variable))

    def get_config(self):
        return {**super().get_config(), "table_l2": self.table_l2,
                "rounding_seed": self.rounding_seed}
