"""The guard against training one model per rank with a plain `keras.Model`: under horovodrun
only tfscale's train step (tfscale.training.train_step.TrainStep) averages the gradients over the
ranks before the optimizer. Keras's own step hands each rank's gradients to the optimizer as
they are, and the ranks drift apart silently. TrainStep applies its exchanged gradients inside
`averaged_over_ranks()`; every tfscale optimizer's `apply` refuses, when it is traced, gradients
applied outside it in a job of several ranks.

Refused rather than averaged here: a plain model would still start from different weights on
each rank, report per-rank metrics and write its files from every rank; TrainStep does all of
that (docs/own_model.md), so the error points there."""

import contextlib
import os
import threading

from tfscale.errors import UserError

_applying = threading.local()


@contextlib.contextmanager
def averaged_over_ranks():
    """The gradients applied inside this block were averaged over the Horovod ranks."""
    outer = getattr(_applying, "averaged", False)
    _applying.averaged = True
    try:
        yield
    finally:
        _applying.averaged = outer


class RefusesUnaveragedGradients:
    """Mixin of tfscale's optimizers (first in the bases): `apply` raises a UserError under a
    horovodrun job of two or more ranks unless the gradients come from `averaged_over_ranks`."""

    def apply(self, grads, trainable_variables=None):
        if int(os.environ.get("HOROVOD_SIZE", "1")) > 1 and \
                not getattr(_applying, "averaged", False):
            raise UserError(
                f"{type(self).__name__} was given gradients that no rank averaged: under "
                "horovodrun a plain keras.Model trains one separate model per rank. Build the "
                "model as `tfscale.FunctionalTrainStepModel(inputs, outputs)` (or subclass "
                "`tfscale.TrainStepModel`), which averages the gradients, starts every rank from "
                "rank 0's weights and reports metrics over all ranks")
        return super().apply(grads, trainable_variables)
