"""The guard against training one model per rank with a plain `keras.Model`: in a job of
several processes only tfscale's train step (tfscale.training.train_step.TrainStep) averages the
gradients over the ranks before the optimizer. Keras's own step hands each rank's gradients to
the optimizer as they are, and the ranks drift apart silently. `TrainStep.compile` marks the
optimizers it drives (`averaged_by_train_step`); every tfscale optimizer's `apply` refuses, in a
job of several ranks, while it is unmarked.

Refused rather than averaged here: a plain model would still start from different weights on
each rank, report per-rank metrics and write its files from every rank; TrainStep does all of
that (docs/own_model.md), so the error points there."""

from tfscale.distributed import runtime
from tfscale.errors import UserError


def averaged_by_train_step(optimizers):
    """Marks `optimizers` (an optimizer and those it wraps) as driven by a TrainStep, which
    hands them gradients averaged over the ranks."""
    for optimizer in optimizers:
        optimizer.gradients_averaged_over_ranks = True


class RefusesUnaveragedGradients:
    """Mixin of tfscale's optimizers (first in the bases): `apply` raises a UserError in a job of
    two or more ranks unless a TrainStep drives the optimizer (`averaged_by_train_step`)."""

    gradients_averaged_over_ranks = False

    def apply(self, grads, trainable_variables=None):
        if runtime.announced_size() > 1 and not self.gradients_averaged_over_ranks:
            raise UserError(
                f"{type(self).__name__} was given gradients that no rank averaged: in a job of "
                "several processes a plain keras.Model trains one separate model per rank. "
                "Build the model as `tfscale.FunctionalTrainStepModel(inputs, outputs)` (or "
                "subclass `tfscale.TrainStepModel`), which averages the gradients, starts every "
                "rank from rank 0's weights and reports metrics over all ranks")
        return super().apply(grads, trainable_variables)
