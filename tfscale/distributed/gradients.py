"""The data-parallel average of a step's gradients over the ranks, in one grouped collective.

Each rank's loss is the mean over its B/P examples, so the mean of the P ranks' gradients is the
gradient of the mean loss over the global batch of B. Dense tensors are averaged by a ring
allreduce (sent as float16 with `init(gradient_compression="fp16")`, as Horovod's fp16
compressor does). A row gradient (IndexedSlices) is allgathered by the same grouped collective,
values and indices with duplicates kept, its values divided by P: the summed rows are then the
global mean's, and per-id counts are counts over the global batch. A CountedSlices (one row per
unique id and rank) also allgathers its counts, in rank order like its rows."""

import tensorflow as tf

from tfscale.distributed import runtime
from tfscale.row_gradients import CountedSlices


def average_over_ranks(gradients, name_suffix=""):
    """`gradients` (a list with None for unconnected variables) averaged over all ranks;
    IndexedSlices stay IndexedSlices, CountedSlices keep (allgathered) counts. `name_suffix`
    tells apart the collectives of two calls in one step. Call only when `runtime.is_active()`."""
    engine = runtime.engine()
    present = [g for g in gradients if g is not None]
    compressed = [_compressed(g) for g in present]
    reduced = engine.grouped_allreduce([g for g, _ in compressed], "average",
                                       f"tfscale_gradients{name_suffix}")
    reduced = iter([_gather_counts(engine, local, restore(result), name_suffix, i)
                    for i, (local, (_, restore), result)
                    in enumerate(zip(present, compressed, reduced))])
    return [None if g is None else next(reduced) for g in gradients]


def _compressed(gradient):
    """(what travels for `gradient`, the function that restores its dtype): dense float32
    gradients as float16 under fp16 compression, anything else as it is."""
    if runtime.gradient_compression_name() != "fp16" or isinstance(gradient, tf.IndexedSlices) \
            or gradient.dtype != tf.float32:
        return gradient, lambda reduced: reduced
    return tf.cast(gradient, tf.float16), lambda reduced: tf.cast(reduced, tf.float32)


def _gather_counts(engine, local, reduced, name_suffix, i):
    """`reduced` as a CountedSlices carrying every rank's counts when `local` carried this
    rank's."""
    if not isinstance(local, CountedSlices) or isinstance(reduced, CountedSlices):
        return reduced  # no counts, or the engine gathered them with the rows
    counts = engine.allgather(local.counts, f"tfscale_counts{name_suffix}_{i}")
    return CountedSlices(reduced.values, reduced.indices, reduced.dense_shape, counts)
