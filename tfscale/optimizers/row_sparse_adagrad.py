"""`RowSparseAdagrad`: Keras's Adagrad whose tables' row gradients update only their rows and
accumulators (tfscale.optimizers.row_updates). Adagrad leaves a row with a zero gradient
unchanged, so without `table_l2` this is Adagrad on the densified gradient, at the cost of the
batch's rows. A row given to a new id (a dynamic table's) starts from `initial_accumulator_value`,
as every row of a fixed table does."""

import keras
import tensorflow as tf

from tfscale.embedding import table_names
from tfscale.optimizers.averaged import RefusesUnaveragedGradients
from tfscale.optimizers.capabilities import DeclaresTableState, TableState
from tfscale.optimizers.row_updates import RowUpdates


@keras.saving.register_keras_serializable(package="tfscale")
class RowSparseAdagrad(RefusesUnaveragedGradients, DeclaresTableState, RowUpdates,
                       keras.optimizers.Adagrad):
    """`keras.optimizers.Adagrad` (same arguments) plus `table_l2`; tables updated by row.

    Args:
        *args: keras.optimizers.Adagrad's arguments (`learning_rate`, ...).
        table_l2: L2 on the tables' rows a batch touches (tfscale.optimizers.row_updates).
        **kwargs: keras.optimizers.Adagrad's keyword arguments.

    Raises:
        ValueError: `table_l2` is negative or not finite.
        UserError: at `apply`, in a horovodrun job of two or more ranks, for gradients that
            tfscale's train step did not average (a plain keras.Model).
    """

    row_state = ("accumulator",)

    def table_state(self, table):
        """Per row: the accumulator, which starts at `initial_accumulator_value`.

        Args:
            table: an embedding table this optimizer was built on.

        Returns:
            A tfscale.optimizers.capabilities.TableState."""
        accumulator = self._accumulators[self._get_variable_index(table)]
        return TableState(per_row=(accumulator,), fresh=(self.initial_accumulator_value,))

    def update_rows(self, variable, ids, gradient_rows, weight_rows, learning_rate):
        gradient_rows = self.with_table_l2(gradient_rows, weight_rows)
        accumulator = self._accumulators[self._get_variable_index(variable)]
        accumulated = (table_names.gather_rows(accumulator, ids, in_place=True)
                       + tf.square(gradient_rows))
        self.assign(accumulator, tf.IndexedSlices(accumulated, ids))
        step = learning_rate * gradient_rows / tf.sqrt(
            accumulated + tf.cast(self.epsilon, gradient_rows.dtype))
        self.write_rows(variable, ids, weight_rows - step)
