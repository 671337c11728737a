"""`RowShardedExchange`: the gradients of partitioned tables (tfscale.embedding.table;
row-sharded: tfscale.embedding.row_sharding) stay on this rank, which owns their rows; every other
gradient goes through the wrapped averaging exchange (allgather or dense).

A shard's gradient already holds every rank's contribution for its rows (the lookup's alltoall
carried them back, each divided by P): it is the gradient of the global batch's mean loss, so P
ranks at B/P take the step one process takes at B. It never enters an allreduce or allgather.
Each rank's shards differ, so the loss scaler's finite check would differ between ranks: one
4-byte allreduce makes it global (`finite_everywhere`), and a step non-finite on any rank hands
every rank NaN shard gradients, which every loss scaler skips (without a scaler, NonFiniteGuard
stops the run). It can run stale (tfscale.exchanges.stale): the owner queues its shards'
gradients, which need no exchange when their turn comes."""

import tensorflow as tf

from tfscale import distributed
from tfscale.embedding.table import shard_of
from tfscale.errors import UserError
from tfscale.exchanges.averaging import AveragingExchange
from tfscale.exchanges.base import SynchronousExchange
from tfscale.row_gradients import with_values


class RowShardedExchange(SynchronousExchange):
    """`exchange` for the model's other gradients; shards stay local.

    Args:
        exchange: the AveragingExchange (allgather or dense) for the other gradients.
        held: how the tables are held (their strategy's description), for messages.

    Raises:
        UserError: `exchange` is not an AveragingExchange (e.g. a top-k exchange)."""

    can_run_stale = True

    def __init__(self, exchange, held="row-sharded"):
        super().__init__()
        if not isinstance(exchange, AveragingExchange):
            raise UserError(f"`embedding_exchange={exchange.name}` cannot be used with {held} "
                            "tables, whose gradients stay on their owners: use "
                            "`embedding_exchange=allgather` or dense for the other gradients")
        self.held = held
        self.inner = exchange
        self.name = exchange.name
        self.carries_counts = exchange.carries_counts

    def __repr__(self):
        return f"{self.inner!r} ({self.held} tables stay on their owners)"

    def summary_scalars(self):
        return {**self.inner.summary_scalars(), **self.scalars.summary_scalars()}

    def exchange(self, gradients, variables, optimizer):
        sharded = [g is not None and shard_of(v) is not None
                   for g, v in zip(gradients, variables)]
        result = self.inner.exchange([None if s else g for g, s in zip(gradients, sharded)],
                                     variables, optimizer)
        if not any(sharded):
            return result
        factor = nan_unless(finite_everywhere(
            [g for g, s in zip(gradients, sharded) if s]))
        return [times(g, factor) if s else r for g, r, s in zip(gradients, result, sharded)]


def finite_everywhere(gradients):
    """Whether every one of `gradients` (this rank's shard gradients) is finite on every rank:
    the same boolean on every rank, by one 4-byte allreduce."""
    finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(_values(g))) for g in gradients])
    return distributed.true_on_every_rank(finite, "tfscale_shards_finite")


def nan_unless(finite):
    """1.0 where `finite`, NaN otherwise: a factor that hands a skip decision to the loss
    scaler."""
    return tf.where(finite, tf.constant(1.0), tf.constant(float("nan")))


def times(gradient, factor):
    """`gradient` (a tensor, IndexedSlices or CountedSlices, or None) times `factor`."""
    if gradient is None:
        return None
    if isinstance(gradient, tf.IndexedSlices):
        return with_values(gradient, gradient.values * tf.cast(factor, gradient.values.dtype))
    return gradient * tf.cast(factor, gradient.dtype)


def _values(gradient):
    return gradient.values if isinstance(gradient, tf.IndexedSlices) else gradient
