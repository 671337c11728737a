"""The data-parallel average of a step's gradients over the ranks, in one grouped collective.

Each rank's loss is the mean over its B/P examples, so the mean of the P ranks' gradients is the
gradient of the mean loss over the global batch of B. Dense tensors are averaged by a ring
allreduce. A row gradient (IndexedSlices) is allgathered by the same `hvd.grouped_allreduce(op=
Average)`, values and indices with duplicates kept, its values divided by P: the summed rows are
then the global mean's, and per-id counts are counts over the global batch. A CountedSlices
(one row per unique id and rank) also allgathers its counts, in rank order like its rows."""

from tfscale.distributed import runtime
from tfscale.row_gradients import CountedSlices


def average_over_ranks(gradients, name_suffix=""):
    """`gradients` (a list with None for unconnected variables) averaged over all ranks;
    IndexedSlices stay IndexedSlices, CountedSlices keep (allgathered) counts. `name_suffix`
    tells apart the collectives of two calls in one step. Call only when `runtime.is_active()`."""
    hvd = runtime.horovod()
    present = [g for g in gradients if g is not None]
    reduced = hvd.grouped_allreduce(present, op=hvd.Average,
                                    compression=runtime.gradient_compression(),
                                    name=f"tfscale_gradients{name_suffix}")
    reduced = iter([_gather_counts(hvd, local, result, name_suffix, i)
                    for i, (local, result) in enumerate(zip(present, reduced))])
    return [None if g is None else next(reduced) for g in gradients]


def _gather_counts(hvd, local, reduced, name_suffix, i):
    """`reduced` as a CountedSlices carrying every rank's counts when `local` carried this
    rank's."""
    if not isinstance(local, CountedSlices):
        return reduced
    counts = hvd.allgather(local.counts, name=f"tfscale_counts{name_suffix}_{i}")
    return CountedSlices(reduced.values, reduced.indices, reduced.dense_shape, counts)
