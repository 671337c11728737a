"""The training run: epochs of `model.fit` over a CTRSource, exact test evaluation after each
epoch, TensorBoard scalars, periodic atomic checkpoints, and resuming mid-epoch from the last
checkpoint so that a stopped-and-resumed run ends with the same weights as an uninterrupted one.

`model.fit` is called once per epoch (each epoch's dataset starts at the right batch when
resuming), by the epoch loop it shares with online training (tfscale.training.epochs); the model
must be compiled before `train` is called.

Under Horovod (tfscale.distributed) every rank runs `train`: each reads its own shard of the
training split at batch_size / P, all run the same number of steps per epoch, all start from
rank 0's (possibly restored) variables, and the test AUC is computed on the union of the ranks'
test shards. Only rank 0 prints, writes TensorBoard logs and checkpoints (every rank hands it
its per-rank state, such as the top-k exchanges' residuals)."""

import dataclasses
import os

import numpy as np
import tensorflow as tf

from tfscale import distributed
from tfscale.checkpoints.store import CheckpointStore
from tfscale.errors import UserError
from tfscale.training import callbacks as tfs_callbacks
from tfscale.training import distributed_fit
from tfscale.training.epochs import EpochLoop, Pass
from tfscale.training.evaluation import evaluate_exact
from tfscale.training.train_step import TrainStep


# The progress key of a checkpoint of tfscale.training.progressive (a run trained day by day):
# the days it has finished.
DAYS_DONE = "days_done"


@dataclasses.dataclass
class TrainingConfig:
    """How to run training; see `train`.

    Args:
        batch_size: the global batch: the ranks of a Horovod job share it.
        epochs: the number of epochs to train.
        log_every_steps: global steps between progress lines (and TensorBoard scalars).
        logdir: TensorBoard event files go to logdir/train and logdir/test; None: none.
        checkpoint_dir: where checkpoints are written and resumed from; None: no checkpoints.
        checkpoint_every_steps: global steps between checkpoints; 0: only at the end of each
            epoch.
        resume: continue the run in `checkpoint_dir` (from scratch when it holds none yet);
            False refuses a `checkpoint_dir` that holds a checkpoint.
        stop_after_steps: stop as an interrupted run would (tests, preemption drills); None:
            never.
        profile_steps: (first, last): TensorFlow's profile of these global steps, written to
            logdir/train for TensorBoard's Profile tab (tfscale.callbacks.ProfileSteps; rank 0's
            steps); None: no profile.

    Example:
        ```python
        config = tfscale.training.TrainingConfig(batch_size=65536, epochs=5, logdir="run/logs",
                                                 checkpoint_dir="run/checkpoints", resume=True)
        ```
    """

    batch_size: int  # global: the ranks of a Horovod job share it
    epochs: int
    log_every_steps: int = 100
    logdir: str = None  # TensorBoard event files go to logdir/train and logdir/test
    checkpoint_dir: str = None
    checkpoint_every_steps: int = 0  # 0: only at the end of each epoch
    resume: bool = False
    stop_after_steps: int = None  # stop as an interrupted run would (tests, preemption drills)
    profile_steps: tuple = None  # (first, last) global steps profiled into logdir/train


@dataclasses.dataclass
class TrainingResult:
    """What a run did.

    Args:
        epochs: per-epoch test metrics (dicts with epoch, auc, logloss, examples,
            train_seconds, examples_per_second).
        global_step: the final global step.
        stopped_early: whether it stopped early (`stop_after_steps`).
        finished_before: whether its checkpoint had finished every epoch already (nothing was
            trained).

    Example:
        ```python
        result = tfscale.training.train(model, source, config)
        result.final  # the last epoch's {"auc", "logloss", ...}
        ```
    """

    epochs: list
    global_step: int
    stopped_early: bool
    finished_before: bool = False

    @property
    def final(self):
        """The last epoch's metrics (a dict of `epochs`), or None when there is none."""
        return self.epochs[-1] if self.epochs else None


def build_model_and_optimizer(model, schema):
    """Creates every model and optimizer variable by calling the model on a one-row batch of
    `schema` and building the optimizer, so checkpoints can be restored into them.

    Args:
        model: a compiled Keras model taking {"dense", "categorical"} features.
        schema: the data's FeatureSchema (a CTRSource's `schema`).

    Example:
        ```python
        tfscale.training.build_model_and_optimizer(model, source.schema)  # before restoring weights
        ```
    """
    dummy = {
        "dense": tf.zeros([1, schema.num_dense], tf.float32),
        "categorical": tf.zeros([1, schema.num_categorical], tf.int64),
    }
    model(dummy, training=False)
    model.optimizer.build(model.trainable_variables)


def check_test_split_is_labelled(source):
    """Refuses a source whose test split has no labels (a competition test file given as the
    test split): training evaluates that split by AUC after every epoch."""
    if not getattr(source, "test_has_labels", True):
        raise UserError(
            f"{source.describe()}: the test split has no label column, and training evaluates "
            "it by AUC after every epoch; give labelled `test_paths`, or none to hold out "
            "`test_fraction` of the training lines (unlabelled files are scored after training, "
            "by tfscale.serving.prediction.FilePredictions)")


def train(model, source, config, print_fn=print):
    """Trains the compiled `model` on `source` as `config` says and returns a TrainingResult.

    Args:
        model: a compiled Keras model taking the source's {"dense", "categorical"} features.
        source: a tfscale.data CTRSource: its train split is trained on, its test split
            evaluated after every epoch.
        config: a TrainingConfig.
        print_fn: called with rank 0's progress lines.

    Returns:
        A TrainingResult.

    Raises:
        UserError: the test split has no labels; `config.batch_size` does not divide over the
            ranks or is more than the training split; `checkpoint_dir` holds a checkpoint and
            `resume` is False, or holds a run trained day by day, or one that does not match
            the model; `resume` without a `checkpoint_dir`; under Horovod, a source that cannot
            tell its batches per epoch; `profile_steps` without a `logdir`.
        tfscale.errors.NonFiniteTraining: training stopped being finite (a UserError; see
            tfscale.callbacks.NonFiniteGuard).

    Example:
        ```python
        source = tfscale.data.CriteoTSV("train.txt", hash_buckets=1_000_000)
        config = tfscale.training.TrainingConfig(batch_size=65536, epochs=5,
                                                 checkpoint_dir="run/checkpoints")
        # model: compiled, takes the features
        result = tfscale.training.train(model, source, config)
        ```
    """
    check_test_split_is_labelled(source)
    if config.profile_steps and not config.logdir:
        raise UserError("`profile_steps` writes a profile into `logdir`: give a `logdir`")
    chief = distributed.is_chief()
    if not chief:
        print_fn = _silent
    local_batch_size = distributed.local_batch_size(config.batch_size)
    shard = distributed.data_shard()
    build_model_and_optimizer(model, source.schema)
    per_rank_variables = model.per_rank_variables() if isinstance(model, TrainStep) else {}
    store = CheckpointStore(config.checkpoint_dir, model=model, optimizer=model.optimizer,
                            per_rank_variables=per_rank_variables) \
        if config.checkpoint_dir else None
    # Rank 0 alone reads the checkpoint directory; the others get its position and its
    # (restored or freshly initialised) variables, and their own slice of the per-rank state.
    start_epoch, skip_batches, restored = distributed.broadcast_from_chief(
        lambda: _starting_position(store, config, print_fn), name="tfscale_start_position")
    if restored:  # a fresh start is set to rank 0's by fit (TrainStep.fit)
        distributed_fit.broadcast_from_rank_0(model)
        store.finish_restore()
    if restored and start_epoch >= config.epochs:  # a finished run: nothing left to train
        return _finished_result(store, config, print_fn)

    writers = _summary_writers(config.logdir) if chief else {}
    steps_per_epoch = source.train_steps_per_epoch(local_batch_size, shard["num_shards"])
    if steps_per_epoch == 0:
        raise UserError(f"`batch_size={config.batch_size}` is larger than the training split "
                        f"({source.describe()}): not one full batch per epoch")
    if steps_per_epoch is None and distributed.is_active():
        raise UserError(f"{source.describe()} cannot tell its batches per epoch in advance, which "
                        "Horovod needs so that every rank runs the same number of steps")
    reporting = []
    if chief:
        reporting.append(tfs_callbacks.TrainingMonitor(
            config.batch_size, config.log_every_steps, writers.get("train"), steps_per_epoch,
            print_fn))
        if config.profile_steps:
            reporting.append(tfs_callbacks.ProfileSteps(
                os.path.join(config.logdir, "train"), *config.profile_steps))
    checkpointer = None
    if store is not None:
        checkpointer = tfs_callbacks.PeriodicCheckpoint(
            store, config.checkpoint_every_steps or np.iinfo(np.int64).max)
    loop = EpochLoop.with_callbacks(model, reporting, checkpointer, config.stop_after_steps,
                                    local_batch_size, shard, print_fn)

    epoch_results = []

    def evaluated(epoch, steps, train_seconds):
        result = _evaluate_epoch(model, source, config, epoch.index, steps, train_seconds,
                                 writers, print_fn, local_batch_size)
        epoch_results.append(result)
        return {"test_auc": result["auc"], "test_logloss": result["logloss"]}

    stopped = loop.run([Pass(epoch, source, steps_per_epoch)
                        for epoch in range(start_epoch, config.epochs)],
                       skip_batches, after=evaluated)
    for writer in writers.values():
        writer.flush()
    return TrainingResult(epoch_results, int(model.optimizer.iterations), stopped_early=stopped)


def progress_to_resume(store, config, print_fn, progressive=False):
    """The progress dict of the newest checkpoint in `store` when `config` resumes from it, or
    None to start from scratch. Refuses to overwrite an existing run unless resuming, and to
    resume a run trained day by day (its progress records DAYS_DONE) by epochs, or the reverse
    (`progressive`: the caller trains day by day)."""
    progress = None if store is None else store.latest_progress()
    if progress is not None and not config.resume:
        raise UserError(
            f"`checkpoint_dir={config.checkpoint_dir}` already holds a checkpoint (global step "
            f"{progress['global_step']}); give `resume=True` to continue that run, or an empty "
            "`checkpoint_dir`")
    if not config.resume:
        return None
    if store is None:
        raise UserError("`resume=True` needs a `checkpoint_dir`")
    if progress is None:
        print_fn(f"resume: no checkpoint in {config.checkpoint_dir} yet; starting from scratch")
        return None
    if (DAYS_DONE in progress) != progressive:
        trained, other = ("day by day", "by epochs") if DAYS_DONE in progress \
            else ("by epochs", "day by day")
        raise UserError(
            f"`checkpoint_dir={config.checkpoint_dir}` holds a run trained {trained} "
            f"(`train_progressively` trains day by day), not {other}: resume it {trained}, or "
            "give an empty `checkpoint_dir`")
    return progress


def _starting_position(store, config, print_fn):
    """(epoch, batches to skip in it, whether a checkpoint was restored) to start from: the last
    checkpoint's position when resuming, else (0, 0, False)."""
    progress = progress_to_resume(store, config, print_fn)
    if progress is None:
        return 0, 0, False
    store.restore_latest()
    if progress["epoch"] >= config.epochs:
        return progress["epoch"], 0, True
    print_fn(f"resumed from global step {progress['global_step']}: epoch {progress['epoch'] + 1}, "
             f"batch {progress['batches_done']}")
    return progress["epoch"], progress["batches_done"], True


def _finished_result(store, config, print_fn):
    """The TrainingResult of a run whose last checkpoint ends its final epoch, from the test
    metrics that checkpoint recorded."""
    progress = store.latest_progress()
    final = {"epoch": progress["epoch"], "auc": progress.get("test_auc"),
             "logloss": progress.get("test_logloss")}
    print_fn(f"the run finished its {config.epochs} epochs at global step "
             f"{progress['global_step']}; nothing left to do")
    epochs = [final] if final["auc"] is not None else []
    return TrainingResult(epochs, progress["global_step"], stopped_early=False,
                          finished_before=True)


def _silent(line):
    """The print_fn of ranks other than 0."""


def _summary_writers(logdir):
    if not logdir:
        return {}
    return {split: tf.summary.create_file_writer(os.path.join(logdir, split))
            for split in ("train", "test")}


def _evaluate_epoch(model, source, config, epoch, steps, train_seconds, writers, print_fn,
                    local_batch_size):
    metrics = evaluate_exact(
        model, source.test_batches(local_batch_size, **distributed.data_shard()))
    examples_per_second = steps * config.batch_size / train_seconds if train_seconds > 0 else 0.0
    result = dict(metrics, epoch=epoch + 1, train_seconds=train_seconds,
                  examples_per_second=examples_per_second)
    print_fn(f"epoch {epoch + 1}/{config.epochs}: test AUC {metrics['auc']:.4f}, "
             f"logloss {metrics['logloss']:.4f} on {metrics['examples']:,} examples; "
             f"trained {steps} steps in {train_seconds:.1f} s ({examples_per_second:,.0f} examples/s)")
    if "test" in writers:
        with writers["test"].as_default(step=int(model.optimizer.iterations)):
            tf.summary.scalar("auc", metrics["auc"])
            tf.summary.scalar("logloss", metrics["logloss"])
        writers["test"].flush()
    return result
