"""The refusals that a launcher's variables alone trigger, checked in one process (a job of
tests/multiworker/jobs.py, not in pytest's process, whose variables its background launches
inherit), for each engine: with horovodrun's HOROVOD_RANK and HOROVOD_SIZE=2, or tfscale.run's
TF_CONFIG of two workers, set and no engine started, building tables and compiling a
TrainStepModel are refused with the line to add; a plain keras.Model's step with a tfscale
optimizer is refused, and taken without them. Prints one "<check> ok" line each."""

import contextlib
import json
import os

import keras
import numpy as np

import tfscale
from tfscale.errors import UserError
from tfscale.optimizers import RowSparseAdam


@contextlib.contextmanager
def environment(**values):
    """os.environ with `values` set (None: unset) inside the block, as it was after it."""
    saved = {name: os.environ.get(name) for name in values}
    try:
        for name, value in values.items():
            os.environ.pop(name, None) if value is None else os.environ.update({name: value})
        yield
    finally:
        for name, value in saved.items():
            os.environ.pop(name, None) if value is None else os.environ.update({name: value})


def readme_model():
    ids = keras.Input((3,), dtype="int64")
    vectors = tfscale.FieldEmbedding([5, 5, 5], embedding_dim=2)(ids)
    return tfscale.FunctionalTrainStepModel(
        ids, keras.layers.Dense(1, activation="sigmoid")(keras.layers.Flatten()(vectors)))


def expect_refusal(action, message):
    try:
        action()
    except UserError as error:
        assert message in str(error), error
        return
    raise AssertionError(f"not refused: expected {message!r}")


def plain_model():
    inputs = keras.Input((2,))
    model = keras.Model(inputs, keras.layers.Dense(1)(inputs))
    model.compile(optimizer=RowSparseAdam(), loss="mse")
    return model


# Each launcher's variables for rank 0 of a job of two processes.
LAUNCHED = {
    "horovodrun": dict(HOROVOD_RANK="0", HOROVOD_SIZE="2", TF_CONFIG=None),
    "tfscale.run": dict(HOROVOD_RANK=None, HOROVOD_SIZE=None, TF_CONFIG=json.dumps(
        {"cluster": {"worker": ["localhost:1", "localhost:2"]},
         "task": {"type": "worker", "index": 0}})),
}
NOT_LAUNCHED = dict(HOROVOD_RANK=None, HOROVOD_SIZE=None, TF_CONFIG=None)
NOT_STARTED = "in a job of 2 processes before its engine started: add " \
    "`tfscale.distributed.init()` at the top of the script"


def main():
    for launcher, variables in LAUNCHED.items():
        with environment(**variables):
            expect_refusal(readme_model, NOT_STARTED)
        for sharding in ("row", "dynamic"):  # tables sized by the ranks: built once known
            with environment(**variables):
                expect_refusal(lambda: tfscale.FieldEmbedding([5, 5], sharding=sharding).build(),
                               NOT_STARTED)
        model = readme_model()
        with environment(**variables):
            expect_refusal(lambda: model.compile(optimizer=RowSparseAdam(),
                                                 loss="binary_crossentropy"),
                           f"compiling FunctionalTrainStepModel {NOT_STARTED}")
        print(f"{launcher}: init before building ok", flush=True)

        x, y = np.ones((4, 2), np.float32), np.ones((4, 1), np.float32)
        with environment(**variables):
            expect_refusal(lambda: plain_model().fit(x, y, verbose=0),
                           "RowSparseAdam was given gradients that no rank averaged")
        with environment(**NOT_LAUNCHED):
            plain_model().fit(x, y, verbose=0)
        print(f"{launcher}: plain model refused ok", flush=True)
    return 0
