"""What an optimizer declares about itself, read by the train step at `compile`.

`TakesRowSlices` marks optimizers that want embedding-table gradients as row slices
(IndexedSlices; tfscale.row_gradients.CountedSlices after de-duplicated lookups), not densified:
RowSparseAdam, which updates only those rows. `TakesCountedSlices` marks those that also need
each id's occurrence count over the global batch, which only some exchanges carry: CowClip,
which clips each id by its count. Every other optimizer gets dense gradients (the train step
densifies them once; see tfscale.train_step)."""

import keras


class TakesRowSlices:
    """Mixin of optimizers whose `apply` takes embedding-table gradients as row slices."""

    def updates_rows_in_place(self, variable):
        """Whether row slices of `variable` update only their rows (scatters), not the whole
        variable; tfscale.tables reads the table's rows to match."""
        raise NotImplementedError


class TakesCountedSlices(TakesRowSlices):
    """Mixin of optimizers whose `apply` takes embedding-table gradients as row slices with
    per-id occurrence counts over the global batch."""


def innermost(optimizer):
    """The optimizer a keras LossScaleOptimizer wraps (itself otherwise)."""
    while isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        optimizer = optimizer.inner_optimizer
    return optimizer


def updates_rows_in_place(optimizer, variable):
    """Whether `optimizer` (or the optimizer a loss scaler wraps) updates `variable` row by row
    given its row slices."""
    optimizer = innermost(optimizer)
    return isinstance(optimizer, TakesRowSlices) and optimizer.updates_rows_in_place(variable)


def takes_row_slices(optimizer):
    """Whether `optimizer` (or the optimizer a loss scaler wraps) is a TakesRowSlices."""
    return isinstance(innermost(optimizer), TakesRowSlices)


def takes_counted_slices(optimizer):
    """Whether `optimizer` (or the optimizer a loss scaler wraps) is a TakesCountedSlices."""
    return isinstance(innermost(optimizer), TakesCountedSlices)
