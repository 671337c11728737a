"""`RowSparseAdam`: Adam that, given a table's row gradient, updates only the rows it holds, in
the table and in its two moments ("lazy" Adam, as TF1's LazyAdamOptimizer and PyTorch's
SparseAdam; tfscale.optimizers.row_updates). Rows absent from the batch keep their weights and
moments, so a step costs O(rows in the batch) instead of O(table rows). This is a different
algorithm from Adam on the densified gradient (where absent rows' moments decay and the rows
keep moving); other variables and dense gradients take FusedAdam's dense update. Keras has no
row-sparse optimizer update."""

import keras
import tensorflow as tf

from tfscale import tables
from tfscale.optimizers.fused_adam import FusedAdam
from tfscale.optimizers.row_updates import RowUpdates


@keras.saving.register_keras_serializable(package="tfscale")
class RowSparseAdam(RowUpdates, FusedAdam):
    """FusedAdam whose tables' row gradients update only their rows; `table_l2`: L2 on those
    rows (tfscale.optimizers.row_updates). amsgrad updates tables whole."""

    def updates_rows_in_place(self, variable):
        return not self.amsgrad and super().updates_rows_in_place(variable)

    def update_rows(self, variable, ids, gradient_rows, weight_rows, learning_rate):
        dtype = variable.dtype
        index = self._get_variable_index(variable)
        m, v = self._momentums[index], self._velocities[index]
        beta_1, beta_2 = tf.cast(self.beta_1, dtype), tf.cast(self.beta_2, dtype)
        local_step = tf.cast(self.iterations + 1, dtype)
        alpha = learning_rate * tf.sqrt(1 - tf.pow(beta_2, local_step)) / (
            1 - tf.pow(beta_1, local_step))

        m_rows = beta_1 * tables.gather_rows(m, ids, in_place=True) + (1 - beta_1) * gradient_rows
        v_rows = (beta_2 * tables.gather_rows(v, ids, in_place=True)
                  + (1 - beta_2) * tf.square(gradient_rows))
        self.assign(m, tf.IndexedSlices(m_rows, ids))
        self.assign(v, tf.IndexedSlices(v_rows, ids))
        step = alpha * m_rows / (tf.sqrt(v_rows) + tf.cast(self.epsilon, dtype))
        # Read, subtract, write back: TensorFlow's CPU scatter-subtract costs several times a
        # gather plus a scatter-assign of the same rows (the same subtraction, bitwise).
        self.assign(variable, tf.IndexedSlices(weight_rows - step, ids))
