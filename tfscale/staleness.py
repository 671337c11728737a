"""Bounded-staleness embedding updates (persia.md): each embedding table's gradient of step t is
exchanged and applied at step t + T, while step t + T computes, and the dense part stays
synchronous.

`StaleEmbeddingUpdates` holds, per embedding table and per rank, a queue of the last T steps'
local gradients (rows, row ids and, for CowClip, occurrence counts), unscaled, in host memory.
A train step `pop`s the oldest (before its forward pass, so their exchange overlaps the forward
and backward pass: nothing in them depends on this step's batch), hands them to the optimizer
beside this step's dense gradients, and `push`es this step's table gradients behind the others.
The tables a forward pass reads therefore lack exactly the updates of the last T steps, and the
first T steps update no table. A step the loss scaler skips (non-finite gradients) neither
consumes the oldest gradients nor queues its own, so a skipped step delays the queue instead of
losing or poisoning it. At T = 0 the train step does not use this class at all.

The queues are per-rank state (tfscale.checkpoints saves and restores them with each rank's
slice); a gradient's rows vary in number from step to step, so the queue variables have an
unknown first dimension."""

import tensorflow as tf

from tfscale import dedup, embeddings, placement
from tfscale.errors import UserError


class _TableQueue:
    """One table's pending gradients: rows stacked in step order, `lengths[i]` rows per step."""

    def __init__(self, table, staleness, with_counts):
        width = table.shape[-1]
        self.table = table
        self.with_counts = with_counts
        self.values = tf.Variable(tf.zeros([0, width]), shape=tf.TensorShape([None, width]),
                                  trainable=False)
        self.indices = tf.Variable(tf.zeros([0], tf.int64), shape=tf.TensorShape([None]),
                                   trainable=False)
        self.counts = tf.Variable(tf.zeros([0]), shape=tf.TensorShape([None]),
                                  trainable=False) if with_counts else None
        self.lengths = tf.Variable(tf.zeros([staleness], tf.int64), trainable=False)

    def variables(self):
        named = {"values": self.values, "indices": self.indices, "lengths": self.lengths}
        if self.with_counts:
            named["counts"] = self.counts
        return named

    def oldest(self, scale):
        """The oldest step's gradient (times `scale`), an IndexedSlices or CountedSlices."""
        rows = self.lengths[0]
        values = self.values[:rows]
        if scale is not None:
            values = values * scale
        shape = tf.shape(self.table, out_type=tf.int64)
        if self.with_counts:
            return dedup.CountedSlices(values, self.indices[:rows], shape, self.counts[:rows])
        return tf.IndexedSlices(values, self.indices[:rows], shape)

    def replace_oldest(self, gradient, scale):
        """Drops the oldest step's rows and appends `gradient`'s (divided by `scale`)."""
        rows = self.lengths[0]
        values = tf.cast(gradient.values, tf.float32)
        if scale is not None:
            values = values / scale
        self.values.assign(tf.concat([self.values[rows:], values], axis=0))
        self.indices.assign(tf.concat([self.indices[rows:], tf.cast(gradient.indices, tf.int64)],
                                      axis=0))
        if self.with_counts:
            self.counts.assign(tf.concat([self.counts[rows:], dedup.occurrence_counts(gradient)],
                                         axis=0))
        self.lengths.assign(tf.concat([self.lengths[1:], tf.shape(values, tf.int64)[:1]], axis=0))


class StaleEmbeddingUpdates:
    """The queues of every embedding table's last `staleness` steps of gradients.

    Args:
        staleness: T >= 1, the number of steps by which embedding updates lag.
        with_counts: queue occurrence counts and return CountedSlices (for CowClip).
    """

    def __init__(self, staleness, with_counts=False):
        if int(staleness) < 1:
            raise ValueError(f"staleness must be at least 1 (0 is the synchronous train step), "
                             f"got {staleness}")
        self.staleness = int(staleness)
        self.with_counts = bool(with_counts)
        self._queues = {}  # table path -> _TableQueue
        self._origin_steps = None  # optimizer step at which each queued gradient was computed

    def build(self, variables):
        """Creates the empty queues of the embedding tables among `variables` (once)."""
        if self._origin_steps is not None:
            return
        with tf.init_scope(), tf.device(placement.embedding_device()):
            for variable in variables:
                if embeddings.is_row_table(variable):
                    self._queues[variable.path] = _TableQueue(variable, self.staleness,
                                                             self.with_counts)
            self._origin_steps = tf.Variable(tf.fill([self.staleness], tf.constant(-1, tf.int64)),
                                             trainable=False)

    def pop(self, variables, scale=None):
        """The oldest queued gradient of each queued table, times `scale` (the loss scale this
        step's gradients carry, or None), aligned with `variables` (None for the others), and the
        number of optimizer steps since it was computed (0 while the queue fills)."""
        self.build(variables)
        with tf.device(placement.embedding_device()):
            oldest = [self._queues[v.path].oldest(scale)
                      if v.path in self._queues else None for v in variables]
        return oldest, self._origin_steps[0]

    def push(self, gradients, variables, applied, scale, step):
        """After the optimizer step `step` (int64, counted before it): when `applied`, replaces
        each table's oldest gradient by its gradient in `gradients` (divided by `scale`); when
        the step was skipped, keeps every queue as it was."""

        def replace():
            for gradient, variable in zip(gradients, variables):
                queue = self._queues.get(variable.path)
                if queue is None:
                    continue
                if not isinstance(gradient, tf.IndexedSlices):
                    raise UserError(
                        f"a stale embedding update needs the gradient of {variable.path} as rows "
                        "(IndexedSlices), got a dense tensor: give the embedding tables no "
                        "regularizer (e.g. --l2=0), or use --embedding_staleness=0")
                queue.replace_oldest(gradient, scale)
            self._origin_steps.assign(tf.concat([self._origin_steps[1:],
                                                 tf.reshape(tf.cast(step, tf.int64), [1])], 0))
            return tf.constant(True)

        with tf.device(placement.embedding_device()):
            tf.cond(tf.convert_to_tensor(applied), replace, lambda: tf.constant(False))

    def per_rank_variables(self):
        """{name: tf.Variable} of the queues, which differ between ranks (for checkpoints)."""
        named = {"staleness/origin_steps": self._origin_steps}
        for path, queue in self._queues.items():
            for part, variable in queue.variables().items():
                named[f"staleness/{path}/{part}"] = variable
        return named
