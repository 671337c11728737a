"""What an optimizer declares about itself, read by the train step at `compile`.

`TakesCountedSlices` marks optimizers that want embedding-table gradients as row slices with
per-id occurrence counts (tfscale.row_gradients.CountedSlices), not as dense tensors: CowClip,
which clips each id by its count. Every other optimizer gets dense gradients (the train step
densifies them once; see tfscale.train_step)."""

import keras


class TakesCountedSlices:
    """Mixin of optimizers whose `apply` takes embedding-table gradients as (counted) slices."""


def innermost(optimizer):
    """The optimizer a keras LossScaleOptimizer wraps (itself otherwise)."""
    while isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        optimizer = optimizer.inner_optimizer
    return optimizer


def takes_counted_slices(optimizer):
    """Whether `optimizer` (or the optimizer a loss scaler wraps) is a TakesCountedSlices."""
    return isinstance(innermost(optimizer), TakesCountedSlices)
