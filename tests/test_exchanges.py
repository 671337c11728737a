"""The exchange interface as an extension point (tfscale.exchanges): a new exchange registered by
name is what `compile(embedding_exchange=name)` uses and what the train step calls, its declared
capabilities are what compile checks, and its per-rank state is what checkpoints see."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfscale
from tfscale import exchanges
from tfscale.distributed.per_rank import PerRankState
from tfscale.errors import UserError
from tfscale.row_gradients import densify


class StepCount(PerRankState):
    def __init__(self):
        self.steps = None

    def build(self, variables):
        if self.steps is None:
            self.steps = tf.Variable(tf.zeros([1], tf.int64), trainable=False)

    def per_rank_variables(self):
        return {"halving/steps": self.steps}


class HalvingExchange(exchanges.SynchronousExchange):
    """Halves every gradient and counts its steps (in one process: acts_in_one_process)."""

    name = "halving"
    acts_in_one_process = True

    def __init__(self):
        super().__init__()
        self.state = StepCount()

    def per_rank_states(self):
        return [self.state]

    def exchange(self, gradients, variables, optimizer):
        self.state.build(variables)
        self.state.steps.assign_add([1])
        self.scalars.record("exchange/halved", 1.0)
        return [None if g is None else densify(g) * 0.5 for g in gradients]


def _model():
    inputs = keras.Input(shape=(2,), dtype="int32")
    vectors = keras.layers.Embedding(10, 3)(inputs)
    outputs = keras.layers.Dense(1)(keras.layers.Flatten()(vectors))
    return tfscale.FunctionalTrainStepModel(inputs, outputs)


def _one_step(exchange):
    """(model, change of each weight) after one SGD step from a fixed initialisation."""
    keras.utils.set_random_seed(0)
    model = _model()
    start = model.get_weights()
    model.compile(keras.optimizers.SGD(0.1), "mse", embedding_exchange=exchange)
    x = np.array([[1, 2], [3, 3], [1, 4]], np.int32)
    model.fit(x, np.ones((3, 1), np.float32), batch_size=3, epochs=1, verbose=0)
    return model, [w - s for w, s in zip(model.get_weights(), start)]


def test_a_registered_exchange_is_used_by_name(monkeypatch):
    monkeypatch.setitem(exchanges.EXCHANGES, "halving", HalvingExchange)
    model, halved = _one_step("halving")
    assert isinstance(model.embedding_exchange, HalvingExchange)
    assert model.per_rank_variables()["halving/steps"].numpy().tolist() == [1]
    assert model.summary_scalars()["exchange/halved"] == 1.0
    _, plain = _one_step("allgather")
    for h, p in zip(halved, plain):  # SGD: half the gradient moves half as far
        assert np.abs(p).max() > 0
        np.testing.assert_allclose(h, 0.5 * p, rtol=1e-4, atol=1e-7)  # float32 differences


def test_capabilities_decide_what_compile_accepts():
    model = _model()
    with pytest.raises(UserError, match="`embedding_exchange=halving` cannot be used with "
                                        "CowClip"):
        model.compile(tfscale.optimizers.CowClip(), "mse", embedding_exchange=HalvingExchange())
    with pytest.raises(UserError, match="`embedding_staleness=1` cannot be used with "
                                        "`embedding_exchange=halving`"):
        model.compile("sgd", "mse", embedding_exchange=HalvingExchange(), embedding_staleness=1)
    model.compile("sgd", "mse", embedding_exchange="dense", embedding_staleness=2)
    assert isinstance(model.embedding_exchange, exchanges.StaleExchange)
    assert repr(model.embedding_exchange) == "dense, 2 step(s) stale"
