"""The epoch loop that `train` (tfscale.training.run: epochs of one source) and
`train_progressively` (tfscale.training.progressive: one pass over each day) share: for each
pass in order, its `before` step (a day's score), one `model.fit` over the pass's batches on
this rank from the resumed position on, the pass's `after` step (an epoch's evaluation, a day's
record) and its end checkpoint; it stops as `stop_after_steps` says, with the same line either
way."""

import dataclasses
import time

import tensorflow as tf

from tfscale.data.pipeline import staged_on_device
from tfscale.training import callbacks as tfs_callbacks


@dataclasses.dataclass(frozen=True)
class Pass:
    """One epoch (or day): `index` (the epoch `fit` and the checkpoints see), the CTRSource
    whose train split it reads, and its steps on this rank (None: not known in advance)."""

    index: int
    source: object
    steps: int = None


@dataclasses.dataclass(frozen=True)
class EpochLoop:
    """What every pass of a run shares: the compiled `model`, the `callbacks` of its `fit`
    (among them `catch_up`, a CatchUpRows, and when there are any the `checkpointer`, a
    PeriodicCheckpoint, and the `stopper`, a StopAfterSteps), this rank's batch and data shard
    (`local_batch_size`, `shard`: tfscale.distributed.data_shard) and rank 0's `print_fn`."""

    model: object
    callbacks: list
    catch_up: object
    checkpointer: object
    stopper: object
    local_batch_size: int
    shard: dict
    print_fn: object

    @classmethod
    def with_callbacks(cls, model, reporting, checkpointer, stop_after_steps, local_batch_size,
                       shard, print_fn):
        """The loop whose `fit` callbacks are, in order: a NonFiniteGuard (first: a non-finite
        step must not reach the progress line or a checkpoint; on every rank, whose optimizer
        states are identical, so all stop together), `reporting` (rank 0's: a TrainingMonitor,
        a ProfileSteps; none on the other ranks), `checkpointer` (a PeriodicCheckpoint on every
        rank, each contributing its per-rank state to a save, or None), a CatchUpRows (before a
        pass's evaluation and checkpoint; the checkpointer's batch-end saves come first) and,
        with `stop_after_steps`, a StopAfterSteps."""
        catch_up = tfs_callbacks.CatchUpRows()
        stopper = (None if stop_after_steps is None
                   else tfs_callbacks.StopAfterSteps(stop_after_steps))
        callbacks = [tfs_callbacks.NonFiniteGuard(), *reporting, checkpointer, catch_up, stopper]
        return cls(model, [c for c in callbacks if c is not None], catch_up, checkpointer,
                   stopper, local_batch_size, shard, print_fn)

    def run(self, passes, skip_batches, after, before=None):
        """Trains on each of `passes` in order, the first from batch `skip_batches` on.

        Args:
            passes: Pass objects, in order.
            skip_batches: the batches of the first pass a resumed run has done.
            after: called with each Pass, the steps it took and their seconds once it ends;
                returns the entries its end checkpoint records besides the position (a dict).
            before: called with each Pass before it trains (a stop found first skips it), or
                None.

        Returns:
            Whether `stop_after_steps` stopped the run."""
        for one_pass in passes:
            if self._reached_stop():
                break
            if before is not None:
                before(one_pass)
            if self.checkpointer is not None:
                self.checkpointer.start_epoch(one_pass.index, skip_batches)
            first_step = self._step()
            started = time.perf_counter()
            self._fit(one_pass, skip_batches)
            seconds = time.perf_counter() - started
            if self.stopper is not None and self.stopper.stopped:
                self.print_fn(f"stopped after global step {self._step()} (`stop_after_steps`); "
                              "resume with `resume=True`")
                return True
            recorded = after(one_pass, self._step() - first_step, seconds)
            if self.checkpointer is not None:
                self.checkpointer.save(self._step(), epoch=one_pass.index + 1, batches_done=0,
                                       **recorded)
            skip_batches = 0
        return bool(self.stopper and self.stopper.stopped)

    def _step(self):
        return int(self.model.optimizer.iterations)

    def _reached_stop(self):
        return self.stopper is not None and self._step() >= self.stopper.max_steps

    def _fit(self, one_pass, skip_batches):
        """One `model.fit` over `one_pass` from batch `skip_batches` on; with none left (resumed
        from a checkpoint of its last batch, taken before the catch-up that ends a pass), only
        that catch-up."""
        steps = one_pass.steps
        if steps is not None and skip_batches >= steps:
            self.catch_up.set_model(self.model)
            self.catch_up.on_epoch_end(one_pass.index)
            return
        dataset = one_pass.source.train_batches(self.local_batch_size, epoch=one_pass.index,
                                                skip_batches=skip_batches, **self.shard)
        if steps is not None:
            # A known length keeps Keras from counting an extra optimizer iteration when a
            # dataset of unknown length runs out; `take` cuts a larger file shard to the smallest
            # shard's count, so no rank waits for another at the pass's end.
            dataset = dataset.take(steps - skip_batches).apply(
                tf.data.experimental.assert_cardinality(steps - skip_batches))
        staged = staged_on_device(dataset)  # on a GPU: batches copied ahead of the step
        staged_steps = None if staged is dataset else _known_length(dataset)
        self.model.fit(staged, initial_epoch=one_pass.index, epochs=one_pass.index + 1,
                       verbose=0, shuffle=False, callbacks=self.callbacks,
                       steps_per_epoch=staged_steps)


def _known_length(dataset):
    """The batches of `dataset` when tf.data knows them, else None."""
    length = int(dataset.cardinality())
    return length if length >= 0 else None
