"""The gradient exchange of a data-parallel train step, between `tape.gradient` and
`optimizer.apply` (so the loss scaler's finite check, CowClip and the optimizer all see the
same reduced gradients on every rank, and take the same decisions).

Each rank's loss is the mean over its B/P examples, so the mean of the P ranks' gradients is the
gradient of the mean loss over the global batch of B. Dense gradients are averaged in one
grouped allreduce. An embedding gradient (IndexedSlices, one row per occurrence) is, with the
"allgather" exchange, allgathered, values and indices with duplicates kept, its values divided
by P: the summed rows are then the global mean's, and per-id counts (CowClip) are counts over the
global batch. `hvd.grouped_allreduce(op=Average)` does both. De-duplicated lookups' gradients
(tfscale.dedup.CountedSlices: one row per unique id and rank) also allgather their counts, so
CowClip sums them into global per-id counts. With the "dense" exchange
(Horovod's sparse_as_dense) it is first summed into a whole-table tensor and averaged in the
same allreduce: the same mean gradient, without the per-id counts; its bytes grow with the
table's rows instead of the batch's ids (tfscale.distributed.traffic counts both)."""

import tensorflow as tf

from tfscale import dedup
from tfscale.distributed import runtime


def exchange_gradients(gradients, embedding_exchange="allgather", name_suffix=""):
    """`gradients` (a list aligned with the variables, None for unconnected ones) averaged over
    all ranks; IndexedSlices stay IndexedSlices with the "allgather" exchange (CountedSlices keep
    the counts, allgathered) and become dense tensors with "dense". `name_suffix` tells apart
    the collectives of two calls in one step. Call only when `runtime.is_active()`."""
    if embedding_exchange not in runtime.PLAIN_EXCHANGES:
        raise ValueError(f"exchange_gradients does the allgather and dense exchanges, got "
                         f"{embedding_exchange!r} (the top-k ones are TopKExchange's)")
    hvd = runtime.horovod()
    present = [g for g in gradients if g is not None]
    if embedding_exchange == "dense":
        present = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g
                   for g in present]
    reduced = hvd.grouped_allreduce(present, op=hvd.Average,
                                    compression=runtime.gradient_compression(),
                                    name=f"tfscale_gradients{name_suffix}")
    reduced = iter([_gather_counts(hvd, local, result, name_suffix, i)
                    for i, (local, result) in enumerate(zip(present, reduced))])
    return [None if g is None else next(reduced) for g in gradients]


def _gather_counts(hvd, local, reduced, name_suffix, i):
    """`reduced` as a CountedSlices carrying every rank's counts when `local` carried this
    rank's (the allgather concatenates the ranks' rows in rank order, and so does this one)."""
    if not isinstance(local, dedup.CountedSlices):
        return reduced
    counts = hvd.allgather(local.counts, name=f"tfscale_counts{name_suffix}_{i}")
    return dedup.CountedSlices(reduced.values, reduced.indices, reduced.dense_shape, counts)
