"""`RowSparseAdam`: Adam that, given a row gradient (IndexedSlices), updates only the rows it
holds, in the variable and in its two moments ("lazy" Adam, as TF1's LazyAdamOptimizer and
PyTorch's SparseAdam). Rows absent from the batch keep their weights and moments, so a step
costs O(rows in the batch) instead of O(table rows). This is a different algorithm from Adam on
the densified gradient (where absent rows' moments decay and the rows keep moving); dense
gradients take FusedAdam's dense update. Keras has no row-sparse optimizer update.

It takes the tables' gradients as row slices from the train step (TakesRowSlices: not
densified), sums an id's repeated rows first (several ranks' rows, or plain lookups' one row per
occurrence) and reads and writes the rows of the variable and moments in place (gathers and
scatters: tfscale.tables)."""

import keras
import tensorflow as tf

from tfscale import tables
from tfscale.optimizers.capabilities import TakesRowSlices
from tfscale.optimizers.fused_adam import FusedAdam
from tfscale.row_gradients import sum_duplicate_rows


@keras.saving.register_keras_serializable(package="tfscale")
class RowSparseAdam(TakesRowSlices, FusedAdam):
    """FusedAdam whose IndexedSlices gradients update only their rows (an id's repeated rows
    summed first)."""

    def updates_rows_in_place(self, variable):
        return not self.amsgrad and tables.is_row_table(variable)

    def update_step(self, gradient, variable, learning_rate):
        if not isinstance(gradient, tf.IndexedSlices) or self.amsgrad:
            return super().update_step(gradient, variable, learning_rate)
        dtype = variable.dtype
        ids, values, _ = sum_duplicate_rows(gradient)
        values = tf.cast(values, dtype)
        index = self._get_variable_index(variable)
        m, v = self._momentums[index], self._velocities[index]
        beta_1, beta_2 = tf.cast(self.beta_1, dtype), tf.cast(self.beta_2, dtype)
        local_step = tf.cast(self.iterations + 1, dtype)
        alpha = tf.cast(learning_rate, dtype) * tf.sqrt(1 - tf.pow(beta_2, local_step)) / (
            1 - tf.pow(beta_1, local_step))

        m_rows = beta_1 * tables.gather_rows(m, ids, in_place=True) + (1 - beta_1) * values
        v_rows = (beta_2 * tables.gather_rows(v, ids, in_place=True)
                  + (1 - beta_2) * tf.square(values))
        self.assign(m, tf.IndexedSlices(m_rows, ids))
        self.assign(v, tf.IndexedSlices(v_rows, ids))
        step = alpha * m_rows / (tf.sqrt(v_rows) + tf.cast(self.epsilon, dtype))
        # Read, subtract, write back: TensorFlow's CPU scatter-subtract costs several times a
        # gather plus a scatter-assign of the same rows (the same subtraction, bitwise).
        new_rows = tables.gather_rows(variable, ids, in_place=True) - step
        self.assign(variable, tf.IndexedSlices(new_rows, ids))
