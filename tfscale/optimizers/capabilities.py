"""What an optimizer declares about itself, read by the train step at `compile`.

`TakesCountedSlices` marks optimizers that want embedding-table gradients as row slices with
per-id occurrence counts (tfscale.row_gradients.CountedSlices), not as dense tensors: CowClip,
which clips each id by its count. Every other optimizer gets dense gradients (the train step
densifies them once; see tfscale.train_step).

`NeedsWholeTables` marks optimizers whose update of a row reads statistics over the whole
table (CAME's column factors and RMS clip), which a row shard alone does not have."""

import keras


class TakesCountedSlices:
    """Mixin of optimizers whose `apply` takes embedding-table gradients as (counted) slices."""


class NeedsWholeTables:
    """Mixin of optimizers whose update needs statistics over every row of a variable."""


def innermost(optimizer):
    """The optimizer a keras LossScaleOptimizer wraps (itself otherwise)."""
    while isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        optimizer = optimizer.inner_optimizer
    return optimizer


def takes_counted_slices(optimizer):
    """Whether `optimizer` (or the optimizer a loss scaler wraps) is a TakesCountedSlices."""
    return isinstance(innermost(optimizer), TakesCountedSlices)


def needs_whole_tables(optimizer):
    """Whether `optimizer`, the optimizer a loss scaler wraps, or any optimizer of a
    MultiOptimizer (CowClip's included) is a NeedsWholeTables."""
    optimizer = innermost(optimizer)
    if isinstance(optimizer, keras.optimizers.MultiOptimizer):
        return any(needs_whole_tables(inner) for inner in optimizer.optimizers)
    return isinstance(optimizer, NeedsWholeTables)
