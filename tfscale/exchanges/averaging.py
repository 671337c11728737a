"""What the allgather and dense exchanges share: every gradient averaged over the ranks in one
grouped collective (tfscale.distributed.gradients), the bytes it moves recorded, and its wall
time. They differ in how a table's row gradient travels (`_prepare`) and what that costs
(`_one_way_bytes`). In one process they change nothing."""

import abc

import tensorflow as tf

from tfscale import distributed
from tfscale.distributed.gradients import average_over_ranks
from tfscale.exchanges.base import SynchronousExchange


class AveragingExchange(SynchronousExchange):
    """Base of the exchanges that average every gradient in one grouped collective."""

    can_run_stale = True

    def exchange(self, gradients, variables, optimizer):
        del variables, optimizer
        if not distributed.is_active():
            return gradients
        self.record_bytes(gradients)
        averaged, seconds = self.scalars.timed(gradients, lambda: self.average(gradients))
        self.scalars.record("exchange/seconds", seconds)
        return averaged

    def average(self, gradients, name_suffix=""):
        """`gradients` averaged over the ranks, without recording anything (StaleExchange
        averages a step's gradients in two parts). Call only under Horovod."""
        return average_over_ranks([None if g is None else self._prepare(g) for g in gradients],
                                  name_suffix)

    def record_bytes(self, gradients):
        """Records the modelled bytes this rank sends and receives to average `gradients`."""
        one_way = self.modelled_bytes(gradients, distributed.size(),
                                      distributed.gradient_compression_name()) / 2
        self.scalars.record("exchange/bytes_sent", one_way)
        self.scalars.record("exchange/bytes_received", one_way)

    def modelled_bytes(self, gradients, num_ranks, compression="none"):
        """Bytes one rank sends plus receives (float64 scalar tensor) to average `gradients`
        over `num_ranks` ranks (tfscale.distributed.traffic's model); `compression="fp16"`: the
        allreduced tensors travel as float16."""
        one_way = tf.constant(0.0, tf.float64)
        for gradient in gradients:
            if gradient is not None:
                one_way += self._one_way_bytes(gradient, num_ranks, compression)
        return 2 * one_way

    @abc.abstractmethod
    def _prepare(self, gradient):
        """`gradient` as it enters the collective."""

    @abc.abstractmethod
    def _one_way_bytes(self, gradient, num_ranks, compression):
        """One direction's bytes of averaging `gradient`."""
