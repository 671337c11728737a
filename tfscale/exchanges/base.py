"""The embedding-exchange interface: how one train step's gradients reach the optimizer, averaged
over the Horovod ranks (the dense weights' always by allreduce; the embedding tables' by the
exchange's own method), what per-rank state it keeps, what it reports, and what it can do.

A train step (tfscale.training.train_step) calls, in this order:
    step = exchange.begin_step(variables, optimizer)   # before the forward pass
    gradients = step.exchange(gradients, variables)    # after tape.gradient
    optimizer.apply(gradients, variables)
    step.finish(gradients)                             # after the update
Two kinds: a `SynchronousExchange` does all its work once the gradients are known, in its
`exchange(gradients, variables, optimizer)`; an exchange that starts before the forward pass
(the stale one, tfscale.exchanges.stale) implements `begin_step` and returns its own
StepExchange, which can overlap the forward and backward pass and queue the step's own
gradients in `finish`.

To add an exchange: subclass SynchronousExchange (or EmbeddingExchange with a StepExchange) in
a new module of this package (set `name` and the capabilities) and add the class to
`EXCHANGES` in tfscale/exchanges/__init__.py."""

import abc
from typing import ClassVar

import keras
import tensorflow as tf

from tfscale.step_scalars import StepScalars


class EmbeddingExchange(abc.ABC):
    """One way of exchanging a train step's gradients between ranks.

    Capabilities (class attributes, read by `TrainStep.compile`):
        carries_counts: table gradients reach the optimizer as slices with global per-id
            occurrence counts, which CowClip needs.
        can_run_stale: table gradients may be applied T steps late
            (tfscale.exchanges.stale.StaleExchange wraps it).
        acts_in_one_process: it changes the gradients without Horovod too (e.g. top-k
            sparsification), so the train step needs it (and runs without XLA) in one process.

    Example:
        ```python
        exchange = tfscale.exchanges.get("allgather")
        # True True False:
        exchange.carries_counts, exchange.can_run_stale, exchange.acts_in_one_process
        ```
    """

    name: ClassVar[str]
    carries_counts: ClassVar[bool] = False
    can_run_stale: ClassVar[bool] = False
    acts_in_one_process: ClassVar[bool] = False

    def __init__(self):
        self.scalars = StepScalars()

    def __repr__(self):
        return self.name

    def per_rank_states(self):
        """The tfscale.distributed.per_rank.PerRankState objects this exchange keeps (none).

        Returns:
            A list of PerRankState."""
        return []

    def summary_scalars(self):
        """{name: value} of the last step: bytes sent and received, exchange seconds, ...

        Returns:
            A dict from scalar name to value, for TensorBoard."""
        return self.scalars.summary_scalars()

    @abc.abstractmethod
    def begin_step(self, variables, optimizer):
        """Called before the forward pass with the model's trainable `variables` and optimizer;
        returns the step's StepExchange.

        Args:
            variables: the model's trainable variables.
            optimizer: the model's optimizer, before this step's update.

        Returns:
            The step's StepExchange."""


class StepExchange(abc.ABC):
    """One train step's exchange, as `begin_step` started it.

    Example:
        ```python
        step = exchange.begin_step(model.trainable_variables, model.optimizer)  # a StepExchange
        ```
    """

    @abc.abstractmethod
    def exchange(self, gradients, variables):
        """The gradients (aligned with `variables`, None for unconnected ones) to hand to the
        optimizer.

        Args:
            gradients: this rank's gradients, one per variable (None for unconnected ones).
            variables: the model's trainable variables.

        Returns:
            A list of gradients aligned with `variables`, averaged over the ranks."""

    def finish(self, applied_gradients):
        """Called after the optimizer took `applied_gradients`; nothing by default.

        Args:
            applied_gradients: the gradients this step's `exchange` received."""


class SynchronousExchange(EmbeddingExchange):
    """An exchange that does all its work once the step's gradients are known.

    Example:
        ```python
        class Mine(tfscale.exchanges.SynchronousExchange):
            name = "mine"
            def exchange(self, gradients, variables, optimizer):
                return gradients  # average over tfscale.distributed.size() ranks here
        ```
    """

    def begin_step(self, variables, optimizer):
        del variables
        return _SynchronousStep(self, optimizer)

    @abc.abstractmethod
    def exchange(self, gradients, variables, optimizer):
        """`gradients` averaged over the ranks as this exchange does it.

        Args:
            gradients: this rank's gradients, aligned with `variables` (None for unconnected
                ones).
            variables: the model's trainable variables.
            optimizer: the model's (for its step count and loss scale); it has not applied
                this step yet.

        Returns:
            A list of gradients aligned with `variables`."""


class _SynchronousStep(StepExchange):
    """A step of a SynchronousExchange: its `exchange`, with the model's optimizer."""

    def __init__(self, exchange, optimizer):
        self._exchange = exchange
        self._optimizer = optimizer

    def exchange(self, gradients, variables):
        return self._exchange.exchange(gradients, variables, self._optimizer)


def loss_scale(optimizer, variables):
    """The factor this step's gradients carry: the loss scaler's current scale (read before the
    optimizer changes it; a scaler not built yet is built on `variables` first), or None without
    a scaler."""
    if not isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return None
    if not optimizer.built:
        optimizer.build(variables)
    return tf.identity(optimizer.dynamic_scale)
