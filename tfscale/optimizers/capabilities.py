"""What an optimizer declares about itself, read by the train step at `compile`.

`TakesRowSlices` marks optimizers that want embedding-table gradients as row slices (IndexedSlices;
tfscale.row_gradients.CountedSlices after de-duplicated lookups), not densified: the row-sparse
optimizers (tfscale.optimizers.row_updates), which update only those rows. A Keras MultiOptimizer
is asked per variable: each gradient goes as its own optimizer takes it. `TakesCountedSlices` marks
those that also need each id's occurrence count over the global batch, which only some exchanges
carry: CowClip, which clips each id by its count. Every other optimizer gets dense gradients (the
train step densifies them once; see tfscale.training.train_step). `DeclaresTableState` marks
optimizers that say which of their variables hold state of an embedding table, and how
(`TableState`): how its rows are sharded and checkpointed with the table's
(tfscale.embedding.row_sharding, tfscale.embedding.by_row_checkpoint)."""

import dataclasses

import keras


class TakesRowSlices:
    """Mixin of optimizers whose `apply` takes embedding-table gradients as row slices.

    Example:
        ```python
        optimizer = tfscale.optimizers.RowSparseAdam(1e-3)
        isinstance(optimizer, tfscale.optimizers.TakesRowSlices)  # True
        ```
    """

    def updates_rows_in_place(self, variable):
        """Whether row slices of `variable` update only their rows (scatters), not the whole
        variable; the table's lookups read its rows to match (tfscale.embedding.table).

        Args:
            variable: a variable this optimizer updates.

        Returns:
            A bool."""
        raise NotImplementedError


class TakesCountedSlices(TakesRowSlices):
    """Mixin of optimizers whose `apply` takes embedding-table gradients as row slices with
    per-id occurrence counts over the global batch.

    Example:
        ```python
        isinstance(tfscale.optimizers.CowClip(), tfscale.optimizers.TakesCountedSlices)  # True
        ```
    """


@dataclasses.dataclass(frozen=True)
class TableState:
    """An optimizer's state of one embedding table: `per_row` variables hold one entry per row
    of the table (sharded, checkpointed and restored by row with it); `whole` variables span
    every row and the optimizer sums them over the shards itself (held whole on every rank)."""

    per_row: tuple = ()
    whole: tuple = ()
    # Per `per_row` variable, the value a row given to a new id starts from (a dynamic table's
    # reused row); zeros when empty.
    fresh: tuple = ()


class DeclaresTableState:
    """Mixin of optimizers that declare their state of each embedding table."""

    def table_state(self, table):
        """The TableState of `table`, a Keras variable this optimizer was built on."""
        raise NotImplementedError


def innermost(optimizer):
    """The optimizer a keras LossScaleOptimizer wraps (itself otherwise)."""
    while isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        optimizer = optimizer.inner_optimizer
    return optimizer


def wrapped_optimizers(optimizer):
    """`optimizer` and every optimizer it wraps (loss scalers, MultiOptimizers, CowClip),
    innermost last."""
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return [optimizer, *wrapped_optimizers(optimizer.inner_optimizer)]
    if isinstance(optimizer, keras.optimizers.MultiOptimizer):
        return [optimizer] + [o for inner in optimizer.optimizers
                              for o in wrapped_optimizers(inner)]
    return [optimizer]


def optimizer_for(optimizer, variable):
    """The optimizer that applies `variable`'s gradient: through loss scalers and Keras
    MultiOptimizers (not into CowClip, which takes every table's row slices itself)."""
    optimizer = innermost(optimizer)
    if (isinstance(optimizer, keras.optimizers.MultiOptimizer)
            and not isinstance(optimizer, TakesRowSlices)):
        # Keras keeps the map private: an OptimizerMap or a callable, variable -> optimizer.
        return optimizer._optimizer_map(variable)
    return optimizer


def updates_rows_in_place(optimizer, variable):
    """Whether `optimizer` (through loss scalers and MultiOptimizers) updates `variable` row by
    row given its row slices."""
    optimizer = optimizer_for(optimizer, variable)
    return isinstance(optimizer, TakesRowSlices) and optimizer.updates_rows_in_place(variable)


def keeps_half_precision_rows(optimizer, variable):
    """Whether `optimizer` (through loss scalers and MultiOptimizers) updates table `variable`
    by row and writes half-precision rows back (tfscale.optimizers.row_updates)."""
    return (updates_rows_in_place(optimizer, variable)
            and getattr(optimizer_for(optimizer, variable), "keeps_half_precision_rows", False))


def takes_row_slices(optimizer, variable):
    """Whether the optimizer applying `variable`'s gradient (`optimizer_for`) takes row
    slices."""
    return isinstance(optimizer_for(optimizer, variable), TakesRowSlices)


def takes_counted_slices(optimizer):
    """Whether `optimizer` (or the optimizer a loss scaler wraps) is a TakesCountedSlices."""
    return isinstance(innermost(optimizer), TakesCountedSlices)
