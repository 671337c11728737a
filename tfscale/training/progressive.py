"""Online (progressive) training over an ordered list of days: each day is first scored by the
model as it stands (progressive validation: exact AUC and log loss of the whole day, which the
model has not seen yet), then trained on in one pass, then checkpointed; a resumed run continues
with the first day not done, or part-way through a day from a checkpoint taken within it.

`train_progressively(model, days, config)` takes the days as (name, CTRSource) pairs in order. A
day's test split is what is scored and its train split what is trained on: both are the whole
day for tfscale.data.drifting_days.DriftingDay, and for a file reader (CriteoTSV, AvazuCSV) of
the day's file with `test_fraction=None` (no line held out). The names identify the days in checkpoints: a resumed run must list the
days its checkpoint has done (and the one it is part-way through) first and in the same order;
more days may follow them (tomorrow's file).

Under Horovod every rank runs it, as `train`: each scores and trains on its shard of each day at
batch_size / P, all run the smallest shard's steps, a day's metrics are those of the union of the
shards (tfscale.training.evaluation), and rank 0 alone prints, logs and checkpoints. TensorBoard:
logdir/train per global step, as `train` writes it, and logdir/progressive ("auc", "logloss")
with the day's number (1-based) as the step. The days are trained by the epoch loop `train` uses
too (tfscale.training.epochs), each day one pass."""

import dataclasses
import os

import numpy as np
import tensorflow as tf

from tfscale import distributed
from tfscale.checkpoints.store import CheckpointStore
from tfscale.errors import UserError
from tfscale.optimizers import table_state
from tfscale.training import callbacks as tfs_callbacks
from tfscale.training.epochs import EpochLoop, Pass
from tfscale.training.evaluation import evaluate_exact
from tfscale.training.run import (DAYS_DONE, build_model_and_optimizer,
                                  check_test_split_is_labelled, progress_to_resume)
from tfscale.training.train_step import TrainStep

_IN_PROGRESS = "day_in_progress"  # progress key: the score of the day being trained on


@dataclasses.dataclass
class ProgressiveConfig:
    """How to run `train_progressively`: one pass over each day, so no epochs.

    Args:
        batch_size: the global batch: the ranks of a Horovod job share it.
        log_every_steps: global steps between progress lines (and TensorBoard scalars).
        logdir: TensorBoard: logdir/train (per step) and logdir/progressive (per day); None:
            none.
        checkpoint_dir: where checkpoints are written and resumed from; None: no checkpoints.
        checkpoint_every_steps: global steps between checkpoints; 0: only at the end of each
            day.
        resume: continue the run in `checkpoint_dir` (from scratch when it holds none yet);
            False refuses a `checkpoint_dir` that holds a checkpoint.
        stop_after_steps: stop as an interrupted run would (tests, preemption drills); None:
            never.

    Example:
        ```python
        config = tfscale.training.ProgressiveConfig(batch_size=16384, logdir="run/logs",
                                                    checkpoint_dir="run/checkpoints")
        ```
    """

    batch_size: int  # global: the ranks of a Horovod job share it
    log_every_steps: int = 100
    logdir: str = None  # TensorBoard: logdir/train (per step) and logdir/progressive (per day)
    checkpoint_dir: str = None
    checkpoint_every_steps: int = 0  # 0: only at the end of each day
    resume: bool = False
    stop_after_steps: int = None  # stop as an interrupted run would (tests, preemption drills)


@dataclasses.dataclass
class ProgressiveResult:
    """What a run did.

    Args:
        days: one dict per day done, in order (day: its number from 1, name, and the
            progressive validation's auc, logloss and examples, measured before training on the
            day; steps, train_seconds, examples_per_second of its training).
        global_step: the final global step.
        stopped_early: whether it stopped early (`stop_after_steps`).
        finished_before: whether its checkpoint had done every day already.

    Example:
        ```python
        result = tfscale.training.train_progressively(model, days, config)
        [day["auc"] for day in result.days]  # progressive AUC, day by day
        ```
    """

    days: list
    global_step: int
    stopped_early: bool
    finished_before: bool = False


@dataclasses.dataclass
class _Start:
    """Where a run starts: the day (index) and its batches already trained, the days done, the
    score of the day in progress when resuming within it, and whether a checkpoint was read."""

    day: int
    batches_done: int
    days_done: list
    in_progress: dict
    restored: bool


def train_progressively(model, days, config, print_fn=print):
    """Trains the compiled `model` day by day on `days` as `config` says, scoring each day
    before training on it, and returns a ProgressiveResult. Every day is checked (its rows, its
    schema) before anything is trained or written.

    Args:
        model: a compiled Keras model taking the days' {"dense", "categorical"} features.
        days: (name, CTRSource) pairs in order; a resumed run's checkpoint names the days it
            has done, which must come first.
        config: a ProgressiveConfig.
        print_fn: called with rank 0's progress lines.

    Returns:
        A ProgressiveResult.

    Raises:
        UserError: `days` fails `check_days`; `checkpoint_dir` holds a checkpoint and `resume`
            is False, or holds a run trained by epochs, or one whose days do not open `days`
            in order, or one that does not match the model; `resume` without a
            `checkpoint_dir`.
        tfscale.errors.NonFiniteTraining: training stopped being finite (a UserError; see
            tfscale.callbacks.NonFiniteGuard).

    Example:
        ```python
        days = [(path, tfscale.data.CriteoTSV([path], test_fraction=None)) for path in day_files]
        config = tfscale.training.ProgressiveConfig(batch_size=16384)
        result = tfscale.training.train_progressively(model, days, config)
        ```
    """
    days, steps_per_day = check_days(days, config.batch_size)
    chief = distributed.is_chief()
    if not chief:
        print_fn = _silent
    local_batch_size = distributed.local_batch_size(config.batch_size)
    shard = distributed.data_shard()
    build_model_and_optimizer(model, days[0][1].schema)
    per_rank_variables = model.per_rank_variables() if isinstance(model, TrainStep) else {}
    store = CheckpointStore(config.checkpoint_dir, model=model, optimizer=model.optimizer,
                            per_rank_variables=per_rank_variables) \
        if config.checkpoint_dir else None
    # Rank 0 alone reads the checkpoint directory; the others get its position and variables.
    start = distributed.broadcast_from_chief(
        lambda: _starting_point(store, config, [name for name, _ in days], print_fn),
        name="tfscale_progressive_start")
    distributed.broadcast_model_and_optimizer(model, local=table_state.local_variables(model))
    if start.restored:
        store.finish_restore()
    days_done = list(start.days_done)
    if start.day >= len(days):
        print_fn(f"the run finished its {len(days)} days at global step "
                 f"{int(model.optimizer.iterations)}; nothing left to do")
        return ProgressiveResult(days_done, int(model.optimizer.iterations), stopped_early=False,
                                 finished_before=True)

    writers = _summary_writers(config.logdir) if chief else {}
    record = {DAYS_DONE: days_done, _IN_PROGRESS: start.in_progress}
    monitor = None
    if chief:
        monitor = tfs_callbacks.TrainingMonitor(config.batch_size, config.log_every_steps,
                                                writers.get("train"), None, print_fn, unit="day")
    checkpointer = None
    if store is not None:
        checkpointer = _DayCheckpoint(
            store, config.checkpoint_every_steps or np.iinfo(np.int64).max,
            lambda: {DAYS_DONE: list(record[DAYS_DONE]), _IN_PROGRESS: record[_IN_PROGRESS]})
    loop = EpochLoop.with_callbacks(model, [monitor] if monitor else [], checkpointer,
                                    config.stop_after_steps, local_batch_size, shard, print_fn)

    def scored(day):
        name = days[day.index][0]
        if record[_IN_PROGRESS] is None:
            record[_IN_PROGRESS] = _score_day(model, day.index, len(days), name, day.source,
                                              shard, local_batch_size, writers, print_fn)
        else:
            _print_score(print_fn, day.index, len(days), name, record[_IN_PROGRESS],
                         "scored before the interruption")
        if monitor is not None:
            monitor.steps_per_epoch = day.steps

    def recorded(day, trained_steps, train_seconds):
        examples_per_second = (trained_steps * config.batch_size / train_seconds
                               if train_seconds > 0 else 0.0)
        days_done.append(dict(record[_IN_PROGRESS], day=day.index + 1, steps=day.steps,
                              train_seconds=train_seconds,
                              examples_per_second=examples_per_second))
        record[_IN_PROGRESS] = None
        print_fn(f"day {day.index + 1}/{len(days)}: trained {trained_steps} steps in "
                 f"{train_seconds:.1f} s ({examples_per_second:,.0f} examples/s)")
        return {}  # the days done: _DayCheckpoint records them

    stopped = loop.run([Pass(index, days[index][1], steps_per_day[index])
                        for index in range(start.day, len(days))],
                       start.batches_done, after=recorded, before=scored)
    for writer in writers.values():
        writer.flush()
    return ProgressiveResult(days_done, int(model.optimizer.iterations), stopped_early=stopped)


class _DayCheckpoint(tfs_callbacks.PeriodicCheckpoint):
    """A PeriodicCheckpoint whose every save also records `record()`: the days done and the
    score of the day in progress (its position is the day's index as the epoch, and the
    batches of it done)."""

    def __init__(self, store, every_steps, record):
        super().__init__(store, every_steps)
        self._record = record

    def save(self, step, epoch, batches_done, **extra):
        super().save(step, epoch, batches_done, **self._record(), **extra)


def check_days(days, batch_size):
    """(`days` as a list of (name, CTRSource), this rank's steps of each day at the global
    `batch_size`), refused with a UserError unless there is at least one day, each named once,
    all of one schema, each with a labelled test split and at least one full batch on every
    rank. `train_progressively` checks its days so; call it first to check them before writing
    anything else.

    Args:
        days: (name, CTRSource) pairs in order.
        batch_size: the global batch.

    Returns:
        The pairs as a list (names as str) and the list of this rank's steps of each day, as
        a tuple.

    Raises:
        UserError: `days` is empty, names a day twice or mixes feature schemas; a day's test
            split has no labels, or it has less than one full batch on a rank or cannot tell
            its batches; `batch_size` does not divide over the ranks.

    Example:
        ```python
        days, steps_per_day = tfscale.training.check_days(days, batch_size=16384)
        ```
    """
    days = [(str(name), source) for name, source in days]
    if not days:
        raise UserError("`days` is empty: give at least one (name, source) pair")
    names = [name for name, _ in days]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise UserError(f"`days` names {repeated[0]!r} more than once: each day is trained on "
                        "once, so give it once")
    first_name, first = days[0]
    for name, source in days:
        if source.schema != first.schema:
            raise UserError(f"day {name!r} has another feature schema than day {first_name!r} "
                            f"({source.schema} against {first.schema}): one model trains on "
                            "every day, so their fields and rows per field must be the same")
        check_test_split_is_labelled(source)
    local_batch_size = distributed.local_batch_size(batch_size)
    shard = distributed.data_shard()
    return days, [_steps_of_day(name, source, batch_size, local_batch_size, shard)
                  for name, source in days]


def _steps_of_day(name, source, batch_size, local_batch_size, shard):
    """Full batches of this rank's shard of a day; a UserError when it has none (an empty day,
    or one smaller than a batch) or cannot tell."""
    steps = source.train_steps_per_epoch(local_batch_size, shard["num_shards"])
    if steps is None:
        raise UserError(f"day {name!r}: {source.describe()} cannot tell its batches in advance, "
                        "which online training needs to refuse an empty day before training")
    if steps == 0:
        raise UserError(f"day {name!r} has less than one full batch of `batch_size={batch_size}`"
                        f"{'' if shard['num_shards'] == 1 else ' on one of its shards'}: an "
                        "empty or too short day; give days of at least one batch, or a smaller "
                        "`batch_size`")
    return steps


def _starting_point(store, config, names, print_fn):
    """The _Start of a run over the days `names`: the checkpoint's position when resuming
    (refused unless the days it has done open `names`, in order), else day 0."""
    progress = progress_to_resume(store, config, print_fn, progressive=True)
    if progress is None:
        return _Start(0, 0, [], None, restored=False)
    in_progress = progress.get(_IN_PROGRESS)
    recorded = [day["name"] for day in progress[DAYS_DONE]] + (
        [in_progress["name"]] if in_progress else [])
    for index, name in enumerate(recorded):
        if index >= len(names) or names[index] != name:
            given = f"{names[index]!r} there" if index < len(names) else f"only {len(names)} days"
            raise UserError(
                f"`checkpoint_dir={config.checkpoint_dir}` holds a run whose day {index + 1} was "
                f"{name!r}; the days given now have {given}: resume with the days it has "
                f"trained on ({len(recorded)}) first, in the same order (more may follow them)")
    store.restore_latest()
    day, batches_done = progress["epoch"], progress["batches_done"]
    if day < len(names):
        print_fn(f"resumed from global step {progress['global_step']}: day {day + 1} "
                 f"({names[day]}), batch {batches_done}")
    return _Start(day, batches_done, progress[DAYS_DONE], in_progress, restored=True)


def _score_day(model, index, num_days, name, source, shard, local_batch_size, writers, print_fn):
    """The progressive validation of day `index`: {"name", "auc", "logloss", "examples"} of the
    model as it stands on the whole day, printed and written to TensorBoard."""
    score = evaluate_exact(model, source.test_batches(local_batch_size, **shard))
    score = {"name": name, "auc": float(score["auc"]), "logloss": float(score["logloss"]),
             "examples": int(score["examples"])}
    _print_score(print_fn, index, num_days, name, score, "scored before training on it")
    if "progressive" in writers:
        with writers["progressive"].as_default(step=index + 1):
            tf.summary.scalar("auc", score["auc"])
            tf.summary.scalar("logloss", score["logloss"])
        writers["progressive"].flush()
    return score


def _print_score(print_fn, index, num_days, name, score, when):
    print_fn(f"day {index + 1}/{num_days}: progressive AUC {score['auc']:.4f}, logloss "
             f"{score['logloss']:.4f} on {score['examples']:,} examples, {when} ({name})")


def _summary_writers(logdir):
    if not logdir:
        return {}
    return {split: tf.summary.create_file_writer(os.path.join(logdir, split))
            for split in ("train", "progressive")}


def _silent(line):
    """The print_fn of ranks other than 0."""
