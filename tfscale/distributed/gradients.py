"""The gradient exchange of a data-parallel train step, between `tape.gradient` and
`optimizer.apply` (so the loss scaler's finite check, CowClip and the optimizer all see the
same reduced gradients on every rank, and take the same decisions).

Each rank's loss is the mean over its B/P examples, so the mean of the P ranks' gradients is the
gradient of the mean loss over the global batch of B. Dense gradients are averaged in one
grouped allreduce. An embedding gradient (IndexedSlices, one row per occurrence) is allgathered,
values and indices with duplicates kept, its values divided by P: the summed rows are then the
global mean's, and per-id counts (CowClip) are counts over the global batch.
`hvd.grouped_allreduce(op=Average)` does both."""

from tfscale.distributed import runtime


def exchange_gradients(gradients):
    """`gradients` (a list aligned with the variables, None for unconnected ones) averaged over
    all ranks; IndexedSlices stay IndexedSlices. Call only when `runtime.is_active()`."""
    hvd = runtime.horovod()
    present = [g for g in gradients if g is not None]
    reduced = iter(hvd.grouped_allreduce(present, op=hvd.Average,
                                         compression=runtime.gradient_compression(),
                                         name="tfscale_gradients"))
    return [None if g is None else next(reduced) for g in gradients]
