"""Bounded-staleness embedding updates (docs/persia.md): `StaleExchange` wraps an exchange that
can run stale (allgather, dense, or either around row-sharded tables) so that each embedding
table's gradient of step t is exchanged (a shard's needs none) and applied at step t + T, while
step t + T computes; the dense part stays synchronous.

`StalenessQueues` holds, per embedding table and per rank, a queue of the last T steps' local
gradients (rows, row ids and, for CowClip, occurrence counts), unscaled, in host memory. A step
`pop`s the oldest in `begin_step` (before its forward pass, so their exchange overlaps the
forward and backward pass: nothing in them depends on this step's batch), hands them to the
optimizer beside this step's dense gradients, and `push`es this step's table gradients behind
the others in `finish`. The tables a forward pass reads therefore lack exactly the updates of the
last T steps, and the first T steps update no table. A step the loss scaler skips (non-finite
gradients) neither consumes the oldest gradients nor queues its own, so a skipped step delays the
queue instead of losing or poisoning it.

The queues are per-rank state (checkpoints keep each rank's); a gradient's rows vary in number
from step to step, so the queue variables have an unknown first dimension."""

import keras
import tensorflow as tf

from tfscale import distributed
from tfscale.distributed.per_rank import PerRankState
from tfscale.embedding import placement
from tfscale.embedding.strategies import is_table
from tfscale.embedding.table import shard_of
from tfscale.errors import UserError
from tfscale.exchanges.base import EmbeddingExchange, StepExchange, loss_scale
from tfscale.exchanges.sharded import RowShardedExchange, finite_everywhere, nan_unless, times
from tfscale.row_gradients import CountedSlices, occurrence_counts
from tfscale.step_scalars import eager_variable


class _TableQueue:
    """One table's pending gradients: rows stacked in step order, `lengths[i]` rows per step."""

    def __init__(self, table, staleness, with_counts):
        width = table.shape[-1]
        self.table = table
        self.with_counts = with_counts
        self.values = eager_variable(tf.zeros([0, width]), shape=tf.TensorShape([None, width]))
        self.indices = eager_variable(tf.zeros([0], tf.int64), shape=tf.TensorShape([None]))
        self.counts = eager_variable(tf.zeros([0]), shape=tf.TensorShape([None])) \
            if with_counts else None
        self.lengths = eager_variable(tf.zeros([staleness], tf.int64))

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
            return CountedSlices(values, self.indices[:rows], shape, self.counts[:rows])
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
            self.counts.assign(tf.concat([self.counts[rows:], occurrence_counts(gradient)],
                                         axis=0))
        self.lengths.assign(tf.concat([self.lengths[1:], tf.shape(values, tf.int64)[:1]], axis=0))


class StalenessQueues(PerRankState):
    """The queues of every embedding table's last `staleness` steps of gradients.

    Args:
        staleness: T >= 1, the number of steps by which embedding updates lag.
        with_counts: queue occurrence counts and return CountedSlices (for CowClip).
    """

    def __init__(self, staleness, with_counts=False):
        if int(staleness) < 1:
            raise ValueError(f"`staleness={staleness}`: give at least 1 step (0 is the "
                             "synchronous step, which needs no queues)")
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
                if is_table(variable):
                    self._queues[variable.path] = _TableQueue(variable, self.staleness,
                                                             self.with_counts)
            self._origin_steps = eager_variable(tf.fill([self.staleness],
                                                        tf.constant(-1, tf.int64)))

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
                        "regularizer, or use `embedding_staleness=0`")
                queue.replace_oldest(gradient, scale)
            self._origin_steps.assign(tf.concat([self._origin_steps[1:],
                                                 tf.reshape(tf.cast(step, tf.int64), [1])], 0))
            return tf.constant(True)

        with tf.device(placement.embedding_device()):
            tf.cond(tf.convert_to_tensor(applied), replace, lambda: tf.constant(False))

    def per_rank_variables(self):
        """{name: tf.Variable} of the queues, which differ between ranks (for checkpoints). A
        row-sharded table's queue holds local rows, so its names say over how many ranks: a
        checkpoint resumes only into the same sharding."""
        named = {"staleness/origin_steps": self._origin_steps}
        for path, queue in self._queues.items():
            shard = shard_of(queue.table)
            if shard is not None:
                path = f"{path}/row-sharded-over-{shard.num_shards}"
            for part, variable in queue.variables().items():
                named[f"staleness/{path}/{part}"] = variable
        return named


class StaleExchange(EmbeddingExchange):
    """`exchange` with the embedding tables' gradients applied `staleness` steps late.

    Row-sharded tables (`exchange` a RowShardedExchange): the owner queues its shards' gradients,
    which already hold every rank's rows, and applies them `staleness` steps later while that
    step looks up and computes; they need no exchange. Their finite decision is global (one
    4-byte allreduce), and a step whose shard gradients are non-finite on any rank hands the
    optimizer NaN gradients, so that every rank skips it and keeps its queues.

    Args:
        exchange: the EmbeddingExchange to wrap, one with `can_run_stale` (allgather, dense, or
            a RowShardedExchange over one of them).
        staleness: T >= 1, the number of steps by which embedding updates lag.
        with_counts: the optimizer takes counted slices (CowClip).

    Raises:
        ValueError: `exchange` cannot run stale, or `staleness` is less than 1.

    Example:
        ```python
        # compile builds it from `embedding_staleness`:
        model.compile(optimizer=tfscale.optimizers.RowSparseAdam(1e-3), loss="binary_crossentropy",
                      embedding_exchange="allgather", embedding_staleness=1)
        model.embedding_exchange  # StaleExchange over the allgather exchange
        ```
    """

    acts_in_one_process = True

    def __init__(self, exchange, staleness, with_counts=False):
        super().__init__()
        if not exchange.can_run_stale:
            raise ValueError(f"`exchange={exchange.name!r}` cannot run stale; give an exchange "
                             "with can_run_stale (allgather, dense)")
        self.inner = exchange
        self.queues = StalenessQueues(staleness, with_counts)
        self.name = exchange.name
        self.carries_counts = exchange.carries_counts

    def __repr__(self):
        return f"{self.inner!r}, {self.queues.staleness} step(s) stale"

    @property
    def averaging(self):
        """The AveragingExchange that moves the gradients which travel between ranks."""
        return self.inner.inner if isinstance(self.inner, RowShardedExchange) else self.inner

    def per_rank_states(self):
        return [self.queues]

    def summary_scalars(self):
        return {**self.inner.summary_scalars(), **self.scalars.summary_scalars()}

    def begin_step(self, variables, optimizer):
        """Pops the oldest queued table gradients and starts the exchange of those of replicated
        tables, which this step's forward pass does not wait for.

        Args:
            variables: the model's trainable variables.
            optimizer: the model's optimizer, before this step's update.

        Returns:
            The step's StepExchange.

        Raises:
            ValueError: `variables` is empty (the model is not built)."""
        if not variables:
            raise ValueError("build the model before training it with stale embedding updates "
                             "(the queues need its embedding tables before the first step)")
        scale = loss_scale(optimizer, variables)
        step = tf.identity(optimizer.iterations)
        queued, origin = self.queues.pop(variables, scale)
        self.scalars.record("embedding/staleness",
                            tf.where(origin >= 0, tf.cast(step, tf.int64) - origin, 0))
        travelling = [q if shard_of(v) is None else None for q, v in zip(queued, variables)]
        pending = queued
        if distributed.is_active() and any(t is not None for t in travelling):
            averaged, seconds = self.scalars.timed(travelling, lambda: self.averaging.average(
                travelling, name_suffix="_stale_embeddings"))
            pending = [a if t is not None else q for a, t, q in zip(averaged, travelling, queued)]
            self.scalars.record("exchange/embedding_seconds", seconds)
        return _StaleStep(self, optimizer, scale, step, queued, pending)


class _StaleStep(StepExchange):
    """One step of a StaleExchange: its queued table gradients (exchanged since begin_step) and
    this step's other gradients go to the optimizer; its own table gradients are queued."""

    def __init__(self, exchange, optimizer, scale, step, queued, pending):
        self._exchange, self._optimizer = exchange, optimizer
        self._scale, self._step = scale, step
        self._queued, self._pending = queued, pending
        self._fresh = self._variables = None

    def exchange(self, gradients, variables):
        self._fresh, self._variables = gradients, variables
        averaging = self._exchange.averaging
        others = [None if q is not None else g for g, q in zip(gradients, self._queued)]
        if distributed.is_active():
            averaging.record_bytes([None if shard_of(v) is not None else q if q is not None
                                    else g for g, q, v in zip(gradients, self._queued, variables)])
            others = averaging.average(others)
        applied = [p if p is not None else g for g, p in zip(others, self._pending)]
        shards = [g for g, v in zip(gradients, variables)
                  if g is not None and shard_of(v) is not None]
        if shards:
            factor = nan_unless(finite_everywhere(shards))
            applied = [times(g, factor) for g in applied]
        return applied

    def finish(self, applied_gradients):
        """Queues this step's table gradients, unless the loss scaler skipped the step."""
        optimizer = self._optimizer
        applied = optimizer.check_finite(applied_gradients) \
            if isinstance(optimizer, keras.optimizers.LossScaleOptimizer) else True
        self._exchange.queues.push(self._fresh, self._variables, applied, self._scale,
                                   self._step)
