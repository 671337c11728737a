"""Loss scaling for float16 training (docs/mixed_precision.md): Keras's LossScaleOptimizer, extended
where tfscale needs more than it does.

What Keras's class does and we keep: multiply the loss by the scale, check the gradients, skip the
step and halve the scale on inf/NaN, double it after `dynamic_growth_steps` finite steps in a row,
and hand the unscaled gradients to the wrapped optimizer (so CowClip and CAME see unscaled float32
gradients). What we add, and why:
- IndexedSlices stay IndexedSlices, CountedSlices keep their counts: Keras divides every
  gradient with `ops.divide`, which turns an embedding gradient into a dense table-sized tensor
  (and CowClip needs the slices for its per-id counts);
- a static scale (Keras 3 dropped `dynamic=False`): a fixed scale, the step still skipped on a
  non-finite gradient (never trained through);
- the count of skipped steps and of skipped steps in a row, as variables (checkpointed with the
  optimizer) and in TensorBoard with the scale, the good-step counter and the wrapped
  optimizer's own scalars.

Under data parallelism the gradients reaching `apply` are the reduced ones, so every rank takes
the same skip/scale decision."""

import keras
import tensorflow as tf
from keras import ops

from tfscale.optimizers.averaged import RefusesUnaveragedGradients
from tfscale.row_gradients import with_values
from tfscale.step_scalars import scalars_of

DEFAULT_INITIAL_SCALE = 2.0 ** 15
DEFAULT_GROWTH_STEPS = 2000


@keras.saving.register_keras_serializable(package="tfscale")
class LossScaleOptimizer(RefusesUnaveragedGradients, keras.optimizers.LossScaleOptimizer):
    """Wraps `inner_optimizer` with dynamic (default) or static loss scaling.

    Args:
        inner_optimizer: the optimizer applying the unscaled gradients.
        initial_scale: the first scale (2^15), or the fixed scale when `dynamic=False`.
        dynamic_growth_steps: finite steps in a row after which a dynamic scale doubles.
        dynamic: False keeps the scale fixed (a non-finite step is still skipped).
        name: the optimizer's name.
        **kwargs: keras.optimizers.LossScaleOptimizer's other keyword arguments.

    Raises:
        ValueError: `initial_scale` is not positive, or `dynamic_growth_steps` is below 1.
        UserError: at `apply`, in a horovodrun job of two or more ranks, for gradients that
            tfscale's train step did not average (a plain keras.Model).

    Example:
        ```python
        keras.mixed_precision.set_dtype_policy("mixed_float16")
        optimizer = tfscale.optimizers.LossScaleOptimizer(tfscale.optimizers.RowSparseAdam(1e-3))
        model.compile(optimizer=optimizer, loss="binary_crossentropy")
        ```
    """

    def __init__(self, inner_optimizer, initial_scale=DEFAULT_INITIAL_SCALE,
                 dynamic_growth_steps=DEFAULT_GROWTH_STEPS, dynamic=True, name=None, **kwargs):
        if initial_scale <= 0:
            raise ValueError(f"`initial_scale={initial_scale}`: give a positive scale")
        if dynamic_growth_steps < 1:
            raise ValueError(f"`dynamic_growth_steps={dynamic_growth_steps}`: give at least 1")
        super().__init__(inner_optimizer, initial_scale=initial_scale,
                         dynamic_growth_steps=dynamic_growth_steps, name=name, **kwargs)
        self.dynamic = bool(dynamic)

    def build(self, var_list):
        # Keras's LossScaleOptimizer.build has no `built` guard: a second call (the launcher
        # describes the tables before training builds the optimizer) would add a second scale
        # and step counter, and ranks with different variable lists hang in their broadcast.
        if self.built:
            return
        super().build(var_list)
        self.skipped_steps = self.add_variable(shape=(), dtype="int", name="skipped_steps",
                                               initializer="zeros", aggregation="none")
        self.skipped_in_a_row = self.add_variable(shape=(), dtype="int",
                                                  name="skipped_in_a_row", initializer="zeros",
                                                  aggregation="none")

    def check_finite(self, grads):
        values = [g.values if isinstance(g, tf.IndexedSlices) else g
                  for g in grads if g is not None]
        return ops.all(ops.stack([ops.all(ops.isfinite(v)) for v in values]))

    def _stateful_handle_finite_grads(self, grads, trainable_variables):
        variables = trainable_variables or self._trainable_variables
        inverse_scale = 1.0 / self.dynamic_scale
        unscaled = [g if g is None or self._overwrite_variable_with_gradient(v)
                    else _scaled(g, inverse_scale) for g, v in zip(grads, variables)]
        self.inner_optimizer.apply(unscaled, trainable_variables=trainable_variables)
        self.skipped_in_a_row.assign(0)
        if not self.dynamic:
            self.step_counter.assign_add(1)
            return

        def grow():
            self.step_counter.assign(0)
            self.dynamic_scale.assign(self.dynamic_scale * 2.0)

        def count():
            self.step_counter.assign_add(1)

        ops.cond(ops.equal(self.step_counter, self.dynamic_growth_steps - 1), grow, count)

    def _stateful_handle_non_finite_grads(self):
        self.skipped_steps.assign_add(1)
        self.skipped_in_a_row.assign_add(1)
        self.step_counter.assign(0)
        if self.dynamic:
            self.dynamic_scale.assign(self.dynamic_scale * 0.5)

    def summary_scalars(self):
        """{name: value} for TensorBoard: the scale, skipped steps (in all and in a row), finite
        steps since the scale last changed, and the wrapped optimizer's own scalars.

        Returns:
            A dict from scalar name to float or int."""
        scalars = scalars_of(self.inner_optimizer)
        scalars.update({
            "loss_scale/scale": float(self.dynamic_scale.numpy()),
            "loss_scale/skipped_steps": int(self.skipped_steps.numpy()),
            "loss_scale/skipped_in_a_row": int(self.skipped_in_a_row.numpy()),
            "loss_scale/good_steps": int(self.step_counter.numpy()),
        })
        return scalars

    def progress_text(self):
        """A few words for the progress line.

        Returns:
            A str: the current scale and the steps skipped so far."""
        return (f"loss scale {float(self.dynamic_scale.numpy()):g}, "
                f"skipped {int(self.skipped_steps.numpy())}")

    def get_config(self):
        config = super().get_config()
        config["dynamic"] = self.dynamic
        return config


def _scaled(gradient, factor):
    """`gradient * factor`, keeping IndexedSlices sparse."""
    if isinstance(gradient, tf.IndexedSlices):
        return with_values(gradient, gradient.values * ops.cast(factor, gradient.values.dtype))
    return gradient * ops.cast(factor, gradient.dtype)
