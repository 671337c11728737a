"""Each Horovod rank its part of the data, in batches of its share of the global batch:
`rank_batches(data, global_batch_size)` for numpy arrays, a `tf.data.Dataset` of single examples
or a CTRSource, as a dataset to give `model.fit` or `model.evaluate`.

How the rows are split: row i of the data goes to rank i mod P and each rank batches its rows by
B/P, so step s of every rank together reads rows [s*B, (s+1)*B): the global batch a single
process reads at step s. A P-rank run then sees the same rows at each step as a one-process run
at the same global batch (CTRSources keep their own split: `train_batches`' shards).

Uneven parts: for training (`drop_remainder=True`) every rank stops at the same step. With a
known length, each epoch is the N // B full global batches and the rest is left out (said once
when the dataset is made). With an unknown length (a filtered dataset, a file source that cannot
count its lines), the ranks agree before every batch whether all of them still have one (a
one-integer allreduce), and the epoch ends at the first rank that has none; the rows the others
had left are reported at that point. Horovod's `join` cannot do this here: it does not cover the
allgather of row gradients. For evaluation every row counts: `padded_to_longest` passes empty
batches on the ranks whose part has ended until no rank has one left, for models whose forward
pass is a collective (tables spread over the ranks)."""

import logging
import weakref

import tensorflow as tf

from tfscale.data.source import CTRSource
from tfscale.distributed import broadcast, runtime
from tfscale.distributed.batch_split import local_batch_size
from tfscale.errors import UserError

LOG = logging.getLogger("tfscale")
# The datasets `agreed_batches` made: not agreed again (by `fit`, for one).
_AGREED = weakref.WeakSet()


def rank_batches(data, global_batch_size, *, drop_remainder=True, shuffle_seed=None, split="train",
                 epoch=0):
    """This rank's batches of `data` as a tf.data.Dataset of (features, labels[, weights]).

    Args:
        data: numpy arrays (a tuple `(x, y)` or `(x, y, sample_weight)`, each an array or a dict
            of arrays with the same first dimension), a tf.data.Dataset of single examples
            (not yet batched), or a tfscale.data CTRSource.
        global_batch_size: the batch of one step over all ranks; each rank takes
            global_batch_size / P.
        drop_remainder: True (training): every rank runs the same number of steps and the rows
            that do not fill a global batch are left out. False (evaluation): every row, the
            last batch of each rank short, ranks possibly one batch apart (fine for models whose
            forward pass has no collectives; row-sharded and dynamic tables evaluate with
            tfscale.training.evaluate_exact).
        shuffle_seed: numpy arrays only: reshuffle the rows every epoch, the same permutation on
            every rank (so the ranks still split one global batch); None keeps their order.
        split: a CTRSource's split, "train" or "test".
        epoch: the epoch a CTRSource's training order is drawn for.

    Returns:
        A tf.data.Dataset of this rank's batches of global_batch_size / P rows.

    Raises:
        UserError: `global_batch_size` is not divisible by P, or (training) more than the rows
            of `data`; `data` is not one of the kinds above, or its arrays have different
            numbers of rows; `shuffle_seed` with a tf.data.Dataset; `split` is neither "train"
            nor "test".

    Example:
        ```python
        train = tfscale.data.rank_batches((features, labels), 65536, shuffle_seed=0)
        model.fit(train, epochs=5)  # the same line in one process and under horovodrun
        ```
    """
    batch = local_batch_size(global_batch_size)
    rank, ranks = runtime.rank(), runtime.size()
    if isinstance(data, CTRSource):
        return _source_batches(data, global_batch_size, batch, drop_remainder, split, epoch)
    if shuffle_seed is not None and isinstance(data, tf.data.Dataset):
        raise UserError("`shuffle_seed` shuffles numpy arrays; shuffle a tf.data.Dataset "
                        "yourself before `rank_batches`, with the same seed on every rank")
    if isinstance(data, tf.data.Dataset):
        examples = int(data.cardinality())
        rows = data.shard(ranks, rank)
    else:
        examples, rows = _array_rows(data, shuffle_seed, rank, ranks)
    batches = rows.batch(batch, drop_remainder=drop_remainder)
    if not drop_remainder:
        return _with_known_length(batches, examples, batch, rank, ranks)
    if examples == tf.data.INFINITE_CARDINALITY:
        return batches  # fit's `steps_per_epoch` then bounds every rank's epoch alike
    if examples == tf.data.UNKNOWN_CARDINALITY:
        return agreed_batches(batches)
    steps = examples // global_batch_size
    if steps == 0:
        raise UserError(f"`global_batch_size={global_batch_size}` is more than the {examples:,} "
                        "rows of `data`: not one full batch per epoch")
    _report_left_out(examples, steps, global_batch_size)
    return _steps(batches, steps)


def _with_known_length(batches, examples, batch, rank, ranks):
    """`batches` of every row of this rank's part, their number stated when `examples` is
    known (so Keras does not read past the end to find it)."""
    if examples < 0:
        return batches
    rows = len(range(rank, examples, ranks))
    return batches.apply(tf.data.experimental.assert_cardinality(-(-rows // batch)))


def _array_rows(data, shuffle_seed, rank, ranks):
    """(number of rows, dataset of this rank's rows of the numpy structure `data`)."""
    leaves = tf.nest.flatten(data)
    if not leaves or any(not hasattr(leaf, "shape") or not leaf.shape for leaf in leaves):
        raise UserError("`data`: give numpy arrays (a tuple (x, y) of arrays or dicts of "
                        "arrays), a tf.data.Dataset of single examples or a CTRSource")
    counts = {int(leaf.shape[0]) for leaf in leaves}
    if len(counts) > 1:
        raise UserError(f"`data`: its arrays have different numbers of rows {sorted(counts)}; "
                        "every array must hold one row per example")
    examples = counts.pop()
    tensors = tf.nest.map_structure(tf.convert_to_tensor, data)
    order = tf.data.Dataset.range(examples)
    if shuffle_seed is not None:
        order = order.shuffle(examples, seed=shuffle_seed, reshuffle_each_iteration=True)
    # Indices first, rows gathered per batch: one copy of the arrays, however they are shuffled.
    rows = order.shard(ranks, rank).batch(1 << 16).map(
        lambda index: tf.nest.map_structure(lambda t: tf.gather(t, index), tensors)).unbatch()
    return examples, rows


def _source_batches(source, global_batch_size, batch, drop_remainder, split, epoch):
    shard = {"shard_index": runtime.rank(), "num_shards": runtime.size()}
    if split == "test":
        return source.test_batches(batch, **shard)
    if split != "train":
        raise UserError(f"`split={split!r}`: give \"train\" or \"test\"")
    batches = source.train_batches(batch, epoch=epoch, **shard)
    steps = source.train_steps_per_epoch(batch, shard["num_shards"])
    if steps is None:
        return agreed_batches(batches) if drop_remainder else batches
    if steps == 0:
        raise UserError(f"`global_batch_size={global_batch_size}` is larger than the training "
                        f"split ({source.describe()}): not one full batch per epoch")
    return _steps(batches, steps)


def _steps(batches, steps):
    """The first `steps` of `batches`, their number stated (Keras then counts no extra step)."""
    return batches.take(steps).apply(tf.data.experimental.assert_cardinality(steps))


def _report_left_out(examples, steps, global_batch_size):
    left_out = examples - steps * global_batch_size
    message = (f"{examples:,} rows at global batch {global_batch_size:,} over "
               f"{runtime.size()} rank(s): {steps:,} steps an epoch, {left_out:,} rows left out "
               "each epoch (the last incomplete global batch)")
    if runtime.is_chief():
        (LOG.warning if left_out else LOG.info)(message)


def agreed_batches(batches):
    """`batches` (this rank's) ending on every rank at the first step where some rank has none
    left (module docstring); unchanged in one process or when already agreed. `fit` agrees a
    dataset of unknown length itself.

    Args:
        batches: this rank's tf.data.Dataset of batches.

    Returns:
        A tf.data.Dataset of the same element structure."""
    if not runtime.is_active() or batches in _AGREED:
        return batches
    agreed = tf.data.Dataset.from_generator(lambda: _agreed(batches),
                                            output_signature=batches.element_spec)
    _AGREED.add(agreed)
    return agreed


def _agreed(batches):
    """Yields this rank's batches while every rank has one; then reports what was left out."""
    engine = runtime.engine()
    step = 0
    for batch in _with_end(batches):
        everyone = int(engine.allreduce(tf.constant(int(batch is not None)), "min",
                                        "tfscale_rank_batches_left"))
        if not everyone:
            _report_uneven_end(engine, step, batch)
            return
        yield batch
        step += 1


def _with_end(batches):
    yield from batches
    yield None  # "none left": the agreement then ends every rank's epoch at this step


def _report_uneven_end(engine, step, batch):
    left = 0 if batch is None else int(tf.shape(tf.nest.flatten(batch)[0])[0])
    lefts = engine.allgather_object(left, "tfscale_rank_batches_left_out")
    if engine.rank == 0:
        ended = [r for r, rows in enumerate(lefts) if rows == 0]
        (LOG.warning if len(ended) < len(lefts) else LOG.info)(  # info: every rank ended
            f"the epoch ended after {step:,} steps, when rank(s) {ended} ran out of data; "
            f"left out: {sum(lefts):,} rows of the batches the other ranks had ready "
            f"({dict(enumerate(lefts))} by rank) and whatever their parts held after them")


def padded_to_longest(batches):
    """Yields `batches` (this rank's, a tf.data.Dataset), then, in a Horovod job, empty batches
    of the same structure until no rank has a batch left: every rank runs as many forward
    passes, which a model whose lookups are collectives needs to evaluate every row.

    Args:
        batches: this rank's tf.data.Dataset of batches.

    Yields:
        This rank's batches, then empty batches (zero rows) of the same structure."""
    if not runtime.is_active():
        yield from batches
        return
    empty = zero_batch(batches.element_spec, rows=0)
    remaining = iter(batches)
    while True:
        batch = next(remaining, None)
        if not broadcast.any_rank(batch is not None, name="tfscale_eval_batches_left"):
            return
        yield empty if batch is None else batch


def padded_dataset(batches):
    """`padded_to_longest(batches)` as a tf.data.Dataset (for Keras's `evaluate`).

    Args:
        batches: this rank's tf.data.Dataset of batches.

    Returns:
        A tf.data.Dataset of the same element structure."""
    return tf.data.Dataset.from_generator(lambda: padded_to_longest(batches),
                                          output_signature=batches.element_spec)


def zero_batch(specs, rows):
    """A batch of `rows` rows of zeros (empty strings) for the structure of tf.TensorSpecs
    `specs` (unknown inner sizes: 1).

    Args:
        specs: a structure of tf.TensorSpecs, batch dimension first.
        rows: the batch's rows (0 for an empty batch).

    Returns:
        The structure of `specs` with a tensor of zeros for each spec."""
    def zeros(spec):
        shape = [rows, *[1 if d is None else d for d in spec.shape[1:]]]
        return tf.fill(shape, "") if spec.dtype == tf.string else tf.zeros(shape, spec.dtype)

    return tf.nest.map_structure(zeros, specs)
