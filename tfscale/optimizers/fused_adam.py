"""`FusedAdam`: Keras's Adam with each variable's update done by TensorFlow's fused ApplyAdam
kernel (one pass over variable, first and second moment) instead of Keras's dozen element-wise
ops, each a pass over memory. The formula is Keras's own; on CTR models, where Adam updates
every row of multi-million-row embedding tables each step, this is a large part of the step.
Why not Keras's Adam: it has no fused path, and given IndexedSlices it squares each occurrence
of an id instead of the id's summed gradient (see tfscale.training.train_step)."""

import keras
import tensorflow as tf

from tfscale.optimizers.averaged import RefusesUnaveragedGradients
from tfscale.row_gradients import densify


@keras.saving.register_keras_serializable(package="tfscale")
class FusedAdam(RefusesUnaveragedGradients, keras.optimizers.Adam):
    """Drop-in `keras.optimizers.Adam` (same arguments, same update); amsgrad falls back to
    Keras's implementation.

    Raises:
        UserError: at `apply`, in a horovodrun job of two or more ranks, for gradients that
            tfscale's train step did not average (a plain keras.Model).

    Example:
        ```python
        model.compile(optimizer=tfscale.optimizers.FusedAdam(1e-3), loss="binary_crossentropy")
        ```
    """

    def update_step(self, gradient, variable, learning_rate):
        if self.amsgrad:
            return super().update_step(gradient, variable, learning_rate)
        dtype = variable.dtype
        local_step = tf.cast(self.iterations + 1, dtype)
        index = self._get_variable_index(variable)
        tf.raw_ops.ResourceApplyAdam(
            var=_handle(variable),
            m=_handle(self._momentums[index]),
            v=_handle(self._velocities[index]),
            beta1_power=tf.pow(tf.cast(self.beta_1, dtype), local_step),
            beta2_power=tf.pow(tf.cast(self.beta_2, dtype), local_step),
            lr=tf.cast(learning_rate, dtype),
            beta1=tf.cast(self.beta_1, dtype),
            beta2=tf.cast(self.beta_2, dtype),
            epsilon=tf.cast(self.epsilon, dtype),
            grad=tf.cast(densify(gradient), dtype),
            use_locking=False,
        )


def _handle(variable):
    """The resource handle of a Keras variable (or of a tf.Variable passed through)."""
    if isinstance(variable, keras.Variable):
        variable = variable.value
    return variable.handle
