"""`RowSparseAdam`: Adam that, given a row gradient (IndexedSlices with unique row ids), updates
only those rows of the variable and of its two moments ("lazy" Adam, as TF1's LazyAdamOptimizer).
Rows absent from the batch keep their weights and moments, so a step costs O(rows in the batch)
instead of O(table rows). This is a different algorithm from Adam on the densified gradient
(where absent rows' moments decay and the rows keep moving); dense gradients take FusedAdam's
dense update. Keras has no row-sparse optimizer update."""

import keras
import tensorflow as tf

from tfscale.optimizers.fused_adam import FusedAdam


@keras.saving.register_keras_serializable(package="tfscale")
class RowSparseAdam(FusedAdam):
    """FusedAdam whose IndexedSlices gradients update only their rows; the slices' indices must
    be unique (sum duplicates first, as CowClip does)."""

    def update_step(self, gradient, variable, learning_rate):
        if not isinstance(gradient, tf.IndexedSlices) or self.amsgrad:
            return super().update_step(gradient, variable, learning_rate)
        dtype = variable.dtype
        values = tf.cast(gradient.values, dtype)
        index = self._get_variable_index(variable)
        m, v = self._momentums[index], self._velocities[index]
        beta_1, beta_2 = tf.cast(self.beta_1, dtype), tf.cast(self.beta_2, dtype)
        local_step = tf.cast(self.iterations + 1, dtype)
        alpha = tf.cast(learning_rate, dtype) * tf.sqrt(1 - tf.pow(beta_2, local_step)) / (
            1 - tf.pow(beta_1, local_step))

        m_rows = beta_1 * tf.gather(m, gradient.indices) + (1 - beta_1) * values
        v_rows = beta_2 * tf.gather(v, gradient.indices) + (1 - beta_2) * tf.square(values)
        self.assign(m, tf.IndexedSlices(m_rows, gradient.indices))
        self.assign(v, tf.IndexedSlices(v_rows, gradient.indices))
        step = alpha * m_rows / (tf.sqrt(v_rows) + tf.cast(self.epsilon, dtype))
        self.assign_sub(variable, tf.IndexedSlices(step, gradient.indices))
