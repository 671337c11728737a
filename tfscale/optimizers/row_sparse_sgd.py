"""`RowSparseSGD`: Keras's SGD whose tables' row gradients update only their rows
(tfscale.optimizers.row_updates). Without momentum and `table_l2` this is SGD on the densified
gradient; with momentum, a row's velocity changes only when the row is in the batch (lazy
momentum, as PyTorch's sparse SGD), a different algorithm from momentum on every row."""

import keras
import tensorflow as tf

from tfscale.embedding import table_names
from tfscale.optimizers.averaged import RefusesUnaveragedGradients
from tfscale.optimizers.row_updates import RowUpdates


@keras.saving.register_keras_serializable(package="tfscale")
class RowSparseSGD(RefusesUnaveragedGradients, RowUpdates, keras.optimizers.SGD):
    """`keras.optimizers.SGD` (same arguments) plus `table_l2`; tables updated by row.

    Args:
        *args: keras.optimizers.SGD's arguments (`learning_rate`, ...).
        table_l2: L2 on the tables' rows a batch touches (tfscale.optimizers.row_updates).
        **kwargs: keras.optimizers.SGD's keyword arguments.

    Raises:
        ValueError: `table_l2` is negative or not finite.
        UserError: at `apply`, in a horovodrun job of two or more ranks, for gradients that
            tfscale's train step did not average (a plain keras.Model).
    """

    row_state = ("momentum",)

    def update_rows(self, variable, ids, gradient_rows, weight_rows, learning_rate):
        gradient_rows = self.with_table_l2(gradient_rows, weight_rows)
        step = learning_rate * gradient_rows
        if self.momentum == 0:
            self.write_rows(variable, ids, weight_rows - step)
            return
        velocity = self.momentums[self._get_variable_index(variable)]
        momentum = tf.cast(self.momentum, gradient_rows.dtype)
        velocity_rows = momentum * table_names.gather_rows(velocity, ids, in_place=True) - step
        self.assign(velocity, tf.IndexedSlices(velocity_rows, ids))
        change = momentum * velocity_rows - step if self.nesterov else velocity_rows
        self.write_rows(variable, ids, weight_rows + change)
