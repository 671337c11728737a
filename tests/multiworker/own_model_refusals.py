"""The refusals that horovodrun's variables alone trigger, checked in one process (a job of
tests/multiworker/jobs.py, not in pytest's process, whose variables its background launches
inherit): with HOROVOD_RANK and HOROVOD_SIZE=2 set and Horovod not started, building tables and
compiling a TrainStepModel are refused with the line to add; with HOROVOD_SIZE=2, a plain
keras.Model's step with a tfscale optimizer is refused, and taken without it. Prints one
"<check> ok" line each."""

import contextlib
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


def main():
    with environment(HOROVOD_RANK="0", HOROVOD_SIZE="2"):
        expect_refusal(readme_model, "building FieldEmbedding 'field_embedding' under "
                       "horovodrun before Horovod started: add `tfscale.distributed.init()` at "
                       "the top of the script")
    for sharding in ("row", "dynamic"):  # tables sized by the ranks: built once they are known
        with environment(HOROVOD_RANK="0", HOROVOD_SIZE="2"):
            expect_refusal(lambda: tfscale.FieldEmbedding([5, 5], sharding=sharding).build(),
                           "under horovodrun before Horovod started: add "
                           "`tfscale.distributed.init()`")
    model = readme_model()
    with environment(HOROVOD_RANK="0", HOROVOD_SIZE="2"):
        expect_refusal(lambda: model.compile(optimizer=RowSparseAdam(),
                                             loss="binary_crossentropy"),
                       "compiling FunctionalTrainStepModel under horovodrun")
    print("init before building ok", flush=True)

    x, y = np.ones((4, 2), np.float32), np.ones((4, 1), np.float32)
    with environment(HOROVOD_SIZE="2"):
        expect_refusal(lambda: plain_model().fit(x, y, verbose=0),
                       "RowSparseAdam was given gradients that no rank averaged")
    with environment(HOROVOD_SIZE=None):
        plain_model().fit(x, y, verbose=0)
    print("plain model refused ok", flush=True)
    return 0
