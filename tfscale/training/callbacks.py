"""Keras callbacks for a training run: the progress line and TensorBoard training scalars,
periodic atomic checkpoints that record the exact data position (`PeriodicCheckpoint`, driven by
tfscale.training.run), checkpoints of a user's own `fit` resumed on every rank (`Checkpoint`),
a stop-after-N-steps switch
(used to simulate an interrupted run), the guard that stops a run gone non-finite, and the
catch-up of rows a row-sparse Adam has left behind (tfscale.optimizers.row_sparse_adam).

Why not keras.callbacks.TensorBoard: its batch counter restarts at every `fit` call (the launcher
calls `fit` once per epoch so a run can resume mid-epoch) and it logs neither examples/s nor the
learning rate of each optimizer of a MultiOptimizer; ours keys every scalar by the optimizer's
global step instead.
"""

import math
import time

import keras
import tensorflow as tf

from tfscale import distributed
from tfscale.errors import NonFiniteTraining, UserError
from tfscale.optimizers.capabilities import wrapped_optimizers
from tfscale.optimizers.loss_scaling import LossScaleOptimizer
from tfscale.optimizers.row_sparse_adam import RowSparseAdam
from tfscale.step_scalars import ReportsProgress, scalars_of
from tfscale.training import distributed_fit
from tfscale.checkpoints.store import CheckpointStore

# What `tfscale.callbacks` offers (the rest of this module serves them and the run).
__all__ = ["CatchUpRows", "Checkpoint", "NonFiniteGuard", "PeriodicCheckpoint", "ProfileSteps",
           "StopAfterSteps", "TrainingMonitor"]


def learning_rates(optimizer):
    """{name: current learning rate} for an optimizer, each optimizer inside a MultiOptimizer, or
    the optimizer inside a LossScaleOptimizer."""
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return learning_rates(optimizer.inner_optimizer)
    if isinstance(optimizer, keras.optimizers.MultiOptimizer):
        rates = {}
        for sub_optimizer in optimizer.optimizers:
            rates.update(learning_rates(sub_optimizer))
        return rates
    return {optimizer.name: float(keras.ops.convert_to_numpy(optimizer.learning_rate))}


class TrainingMonitor(keras.callbacks.Callback):
    """Every `every_steps` global steps: prints a progress line and, if `writer` is given,
    writes loss, the metrics in the logs (e.g. streaming AUC), learning rates, examples/s, step
    time and the optimizer's and the model's `summary_scalars()` if they have them. Throughput
    excludes each `fit` call's first step, which includes tracing.

    Args:
        global_batch_size: the batch of one step over all ranks (for examples/s).
        every_steps: global steps between progress lines.
        writer: a tf.summary writer for the scalars, or None.
        steps_per_epoch: batches per epoch, shown in the progress line, which is also printed
            at an epoch's last batch; None: not known.
        print_fn: called with each progress line.
        unit: what a `fit` call's epoch is in the progress line ("day" when each is one day of
            online training).

    Raises:
        ValueError: `every_steps` is below 1.

    Example:
        ```python
        writer = tf.summary.create_file_writer("run/logs/train")
        model.fit(train, epochs=5, callbacks=[
            tfscale.callbacks.TrainingMonitor(65536, every_steps=100, writer=writer)])
        ```
    """

    def __init__(self, global_batch_size, every_steps, writer=None, steps_per_epoch=None,
                 print_fn=print, unit="epoch"):
        super().__init__()
        if every_steps < 1:
            raise ValueError("every_steps must be at least 1")
        self.global_batch_size = global_batch_size
        self.every_steps = every_steps
        self.writer = writer
        self.steps_per_epoch = steps_per_epoch
        self.print_fn = print_fn
        self.unit = unit
        self._epoch = 0
        self._window_start = None  # (global step, time) the current measuring window began at

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch
        self._window_start = None

    def on_train_batch_end(self, batch, logs=None):
        step = int(self.model.optimizer.iterations)
        now = time.perf_counter()
        if self._window_start is None:
            self._window_start = (step, now)
            return
        start_step, start_time = self._window_start
        steps = step - start_step
        if steps < self.every_steps and not self._is_epoch_end(batch):
            return
        if steps == 0:
            return
        step_time = (now - start_time) / steps
        metrics = {name: float(value) for name, value in (logs or {}).items()}
        self._print(step, batch, metrics, step_time)
        if self.writer is not None:
            scalars = dict(metrics, examples_per_second=self.global_batch_size / step_time,
                           step_time_seconds=step_time)
            scalars.update({f"learning_rate/{name}": rate
                            for name, rate in learning_rates(self.model.optimizer).items()})
            # The optimizer's (e.g. CowClip's clipped fraction per table, the loss scale) and
            # the model's (e.g. the gradient exchange's bytes per step).
            scalars.update(scalars_of(self.model.optimizer, self.model))
            with self.writer.as_default(step=step):
                for name, value in scalars.items():
                    tf.summary.scalar(name, value)
        self._window_start = (step, now)

    def _is_epoch_end(self, batch):
        return self.steps_per_epoch is not None and batch + 1 >= self.steps_per_epoch

    def _print(self, step, batch, metrics, step_time):
        of_total = f"/{self.steps_per_epoch}" if self.steps_per_epoch else ""
        shown = ", ".join(f"{name} {value:.4f}" for name, value in metrics.items())
        if isinstance(self.model.optimizer, ReportsProgress):
            shown += f", {self.model.optimizer.progress_text()}"
        self.print_fn(
            f"{self.unit} {self._epoch + 1} batch {batch + 1}{of_total} step {step}: {shown}, "
            f"{self.global_batch_size / step_time:,.0f} examples/s, {step_time * 1000:.1f} ms/step")


class PeriodicCheckpoint(keras.callbacks.Callback):
    """Saves a checkpoint through `store` every `every_steps` global steps, with the data
    position needed to resume exactly there. Call `start_epoch` before each `fit` so it knows
    which epoch is running and how many of its batches were skipped.

    Args:
        store: a tfscale.checkpoints.store.CheckpointStore.
        every_steps: global steps between checkpoints.

    Raises:
        ValueError: `every_steps` is below 1.

    Example:
        ```python
        # store: a tfscale.checkpoints.store.CheckpointStore
        periodic = tfscale.callbacks.PeriodicCheckpoint(store, every_steps=1000)
        periodic.start_epoch(0, 0)
        model.fit(train, epochs=1, callbacks=[periodic])
        ```
    """

    def __init__(self, store, every_steps):
        super().__init__()
        if every_steps < 1:
            raise ValueError("every_steps must be at least 1")
        self.store = store
        self.every_steps = every_steps
        self._epoch = 0
        self._skipped_batches = 0
        self.last_saved_step = None

    def start_epoch(self, epoch, skipped_batches):
        """Tells the next `fit` call's position in the data.

        Args:
            epoch: the epoch it runs (0-based).
            skipped_batches: the batches of that epoch it starts after (a resumed run's)."""
        self._epoch = epoch
        self._skipped_batches = skipped_batches

    def on_train_batch_end(self, batch, logs=None):
        step = int(self.model.optimizer.iterations)
        if step % self.every_steps == 0 and step != self.last_saved_step:
            self.save(step, epoch=self._epoch, batches_done=self._skipped_batches + batch + 1)

    def save(self, step, epoch, batches_done, **extra):
        """Writes a checkpoint now: resuming from it starts epoch `epoch` at batch
        `batches_done`.

        Args:
            step: the global step it is taken at.
            epoch: the epoch a resumed run starts.
            batches_done: the batches of that epoch a resumed run skips.
            **extra: other entries for the checkpoint's progress dict (e.g. test metrics)."""
        self.store.save(step, dict(extra, epoch=epoch, batches_done=batches_done))
        self.last_saved_step = step


class StopAfterSteps(keras.callbacks.Callback):
    """Stops training once the optimizer has taken `max_steps` global steps (as an interrupted
    run would stop), setting `stopped` so the caller can tell.

    Args:
        max_steps: the global step at which training stops.

    Example:
        ```python
        stop = tfscale.callbacks.StopAfterSteps(100)
        model.fit(train, epochs=5, callbacks=[stop])
        stop.stopped  # True once 100 steps were taken
        ```
    """

    def __init__(self, max_steps):
        super().__init__()
        self.max_steps = max_steps
        self.stopped = False

    def on_train_batch_end(self, batch, logs=None):
        if int(self.model.optimizer.iterations) >= self.max_steps:
            self.model.stop_training = True
            self.stopped = True


class ProfileSteps(keras.callbacks.Callback):
    """Records TensorFlow's profile of global steps `first_step` to `last_step` (the optimizer's
    iterations, counted from 1; a resumed run counts on) into `logdir`, for TensorBoard's
    Profile tab (`tensorboard --logdir LOGDIR`, with the tensorboard-plugin-profile package):
    the trace viewer's timeline of every op, the input pipeline's beside the step's, and op
    statistics. A window that an epoch's end cuts stops there (evaluation is not profiled).

    Why not keras.callbacks.TensorBoard(profile_batch=...): it counts the batches of each `fit`
    call, and a run that calls `fit` once per epoch (tfscale.training.train) would profile the
    first epoch's batches, whatever the step.

    Args:
        logdir: the directory TensorBoard reads; the profile goes to logdir/plugins/profile.
        first_step: the first global step profiled (>= 1). Skip the first steps: they trace
            and compile the train step.
        last_step: the last global step profiled (>= first_step); a few steps are enough, a
            trace grows by the op.

    Raises:
        ValueError: `first_step` is below 1 or `last_step` below `first_step`.

    Example:
        ```python
        import tempfile

        import keras
        import numpy as np
        import tfscale

        ids = keras.Input((3,), dtype="int64")
        vectors = tfscale.FieldEmbedding([10, 10, 10], embedding_dim=4)(ids)
        outputs = keras.layers.Dense(1, activation="sigmoid")(keras.layers.Flatten()(vectors))
        model = tfscale.FunctionalTrainStepModel(ids, outputs)
        model.compile(optimizer=tfscale.optimizers.RowSparseAdam(1e-3),
                      loss="binary_crossentropy")
        logdir = tempfile.mkdtemp()
        model.fit(np.random.randint(0, 10, (640, 3)), np.random.randint(0, 2, (640, 1)),
                  batch_size=64, verbose=0,
                  callbacks=[tfscale.callbacks.ProfileSteps(logdir, first_step=4, last_step=6)])
        # logdir/plugins/profile/<time>/<host>.xplane.pb: open logdir in TensorBoard
        ```
    """

    def __init__(self, logdir, first_step, last_step):
        super().__init__()
        if first_step < 1 or last_step < first_step:
            raise ValueError(f"`first_step={first_step}`, `last_step={last_step}`: give "
                             "1 <= first_step <= last_step")
        self.logdir = logdir
        self.first_step = int(first_step)
        self.last_step = int(last_step)
        self._steps_before_fit = 0
        self._profiling = False
        self._done = False

    def on_train_begin(self, logs=None):
        self._steps_before_fit = int(self.model.optimizer.iterations)

    def on_train_batch_begin(self, batch, logs=None):
        step = self._steps_before_fit + batch + 1  # the step this batch takes
        if not (self._profiling or self._done) and self.first_step <= step <= self.last_step:
            tf.profiler.experimental.start(self.logdir)
            self._profiling = True

    def on_train_batch_end(self, batch, logs=None):
        if self._profiling and self._steps_before_fit + batch + 1 >= self.last_step:
            self._stop()

    def on_train_end(self, logs=None):
        if self._profiling:
            self._stop()

    def _stop(self):
        tf.profiler.experimental.stop()
        self._profiling = False
        self._done = True  # once: a later `fit` does not profile again


class NonFiniteGuard(keras.callbacks.Callback):
    """Raises NonFiniteTraining (before any later callback, such as a checkpoint, runs) when
    training stops being finite: with a loss scaler (tfscale.optimizers.LossScaleOptimizer) after
    `max_skipped_in_a_row` skipped steps in a row; without one at the first non-finite loss,
    since the optimizer has already applied those gradients.

    Args:
        max_skipped_in_a_row: skipped steps in a row a loss scaler may take before training
            stops.

    Raises:
        ValueError: `max_skipped_in_a_row` is below 1.
        tfscale.errors.NonFiniteTraining: at a batch's end, when training stopped being finite
            (a UserError).

    Example:
        ```python
        guard = tfscale.callbacks.NonFiniteGuard(max_skipped_in_a_row=50)
        model.fit(train, epochs=5, callbacks=[guard])
        ```
    """

    def __init__(self, max_skipped_in_a_row=50):
        super().__init__()
        if max_skipped_in_a_row < 1:
            raise ValueError("max_skipped_in_a_row must be at least 1")
        self.max_skipped_in_a_row = max_skipped_in_a_row

    def on_train_batch_end(self, batch, logs=None):
        optimizer = self.model.optimizer
        step = int(optimizer.iterations)
        if isinstance(optimizer, LossScaleOptimizer):
            in_a_row = optimizer.skipped_in_a_row
            if int(in_a_row.numpy()) >= self.max_skipped_in_a_row:
                raise NonFiniteTraining(
                    f"the last {int(in_a_row.numpy())} steps (after global step {step}) all had "
                    f"inf/NaN gradients, down to loss scale {float(optimizer.dynamic_scale.numpy()):g}: "
                    "the data or the model produce non-finite values (check the input for NaN/inf, "
                    "or lower the learning rate)")
            return
        loss = (logs or {}).get("loss")
        if loss is not None and not math.isfinite(float(loss)):
            raise NonFiniteTraining(
                f"the training loss became {float(loss)} at global step {step} (no loss scaler "
                "to skip such steps): check the input for NaN/inf, lower the learning rate, or "
                "train with dynamic loss scaling")


class CatchUpRows(keras.callbacks.Callback):
    """At each epoch's end and before each evaluation, brings every table row a RowSparseAdam
    (with `catch_up`, its default) has left behind up to date: one pass over each table per
    call, skipped when no step ran since the last (RowSparseAdam.catch_up_every_row).

    Example:
        ```python
        model.fit(train, epochs=5, callbacks=[tfscale.callbacks.CatchUpRows()])
        ```
    """

    def __init__(self):
        super().__init__()
        self._caught_up_at = None

    def on_epoch_end(self, epoch, logs=None):
        self._catch_up()

    def on_test_begin(self, logs=None):
        self._catch_up()

    def _catch_up(self):
        step = int(self.model.optimizer.iterations)
        if step == self._caught_up_at:
            return
        for optimizer in wrapped_optimizers(self.model.optimizer):
            if isinstance(optimizer, RowSparseAdam):
                optimizer.catch_up_every_row()
        self._caught_up_at = step


class Checkpoint(keras.callbacks.Callback):
    """Atomic checkpoints of `fit` in `directory` at each epoch's end, and the newest one
    restored when `fit` starts, on every rank of a Horovod job (tfscale.checkpoints.store:
    tables by row, each rank writing its own rows, so a run resumes at any number of ranks; the
    other state written by rank 0). Resuming starts `fit` at the epoch after the checkpoint's,
    as keras.callbacks.BackupAndRestore does (which restores one rank only).

    The directory is also what tfscale.serving.export_model and `restore_trained_weights` read.

    Args:
        directory: where the checkpoints are written and restored from.
        resume: restore the newest checkpoint when `fit` starts; False refuses a directory that
            already holds a checkpoint, so a new run never replaces an old one.
        keep: how many checkpoints to keep.

    Raises:
        UserError: when `fit` starts: `directory` holds a checkpoint and `resume` is False, or
            holds one that cannot be read or does not match the model (or the job's ranks).
        ValueError: when `fit` starts, `keep` is below 1.

    Example:
        ```python
        model.fit(train, epochs=5, callbacks=[tfscale.callbacks.Checkpoint("run/checkpoints")])
        ```
    """

    def __init__(self, directory, resume=True, keep=2):
        super().__init__()
        self.directory = directory
        self.resume = resume
        self.keep = keep
        self._store = None

    def on_train_begin(self, logs=None):
        model = self.model
        if not model.optimizer.built:
            model.optimizer.build(model.trainable_variables)
        per_rank = model.per_rank_variables() if hasattr(model, "per_rank_variables") else {}
        self._store = CheckpointStore(self.directory, model=model, optimizer=model.optimizer,
                                      keep=self.keep, per_rank_variables=per_rank)
        progress = distributed.broadcast_from_chief(self._restore_on_chief,
                                                    name="tfscale_fit_checkpoint")
        if progress is None:
            return
        distributed_fit.broadcast_from_rank_0(model)
        self._store.finish_restore()
        # Keras's own resume point (keras.callbacks.BackupAndRestore sets it the same way).
        model._initial_epoch = progress["epoch"]

    def _restore_on_chief(self):
        progress = self._store.latest_progress()
        if progress is None:
            return None
        if not self.resume:
            raise UserError(f"`directory={self.directory}` already holds a checkpoint (global "
                            f"step {progress['global_step']}); give `resume=True` to continue "
                            "that run, or an empty directory")
        self._store.restore_latest()
        return progress

    def on_epoch_end(self, epoch, logs=None):
        metrics = {name: float(value) for name, value in (logs or {}).items()}
        self._store.save(int(self.model.optimizer.iterations),
                         dict(metrics=metrics, epoch=epoch + 1, batches_done=0))
