"""Checkpoints are atomic, round-trip model and optimizer state, and never leave a partial
checkpoint behind."""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfscale.errors import UserError
from tfscale.training.checkpoints import CheckpointStore


def _trained_model(seed):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((3,))
    model = keras.Model(inputs, keras.layers.Dense(1)(keras.layers.Dense(4)(inputs)))
    model.compile(keras.optimizers.Adam(1e-2), "mse")
    x = np.random.default_rng(seed).random((32, 3)).astype("float32")
    model.fit(x, x[:, :1], epochs=2, verbose=0)
    return model


def test_round_trip_of_weights_optimizer_and_progress(tmp_path):
    model = _trained_model(0)
    store = CheckpointStore(str(tmp_path), model=model, optimizer=model.optimizer)
    store.save(7, {"epoch": 1, "batches_done": 3})

    other = _trained_model(99)
    progress = CheckpointStore(str(tmp_path), model=other, optimizer=other.optimizer).restore_latest()
    assert progress == {"epoch": 1, "batches_done": 3, "global_step": 7}
    for a, b in zip(model.weights + model.optimizer.variables, other.weights + other.optimizer.variables):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_keeps_newest_and_latest_points_at_complete_checkpoint(tmp_path):
    model = _trained_model(0)
    store = CheckpointStore(str(tmp_path), keep=2, model=model, optimizer=model.optimizer)
    for step in (10, 20, 30):
        store.save(step, {"epoch": 0, "batches_done": step})
    assert sorted(d for d in os.listdir(tmp_path) if d.startswith("step-")) == [
        "step-0000000020", "step-0000000030"]
    assert store.latest_progress()["global_step"] == 30
    assert not [d for d in os.listdir(tmp_path) if d.startswith(".staging")]


def test_failed_write_leaves_previous_checkpoint(tmp_path, monkeypatch):
    model = _trained_model(0)
    store = CheckpointStore(str(tmp_path), model=model, optimizer=model.optimizer)
    store.save(10, {"epoch": 0, "batches_done": 10})

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(tf.train.Checkpoint, "write", crash)
    with pytest.raises(OSError):
        store.save(20, {"epoch": 0, "batches_done": 20})
    assert store.latest_progress()["global_step"] == 10
    assert sorted(os.listdir(tmp_path)) == ["latest", "step-0000000010"]


def test_empty_directory_restores_nothing(tmp_path):
    model = _trained_model(0)
    assert CheckpointStore(str(tmp_path / "none"), model=model).restore_latest() is None


def test_mismatched_model_is_a_user_error(tmp_path):
    model = _trained_model(0)
    CheckpointStore(str(tmp_path), model=model, optimizer=model.optimizer).save(1, {})
    inputs = keras.Input((5,))
    other = keras.Model(inputs, keras.layers.Dense(2)(inputs))
    other.compile(keras.optimizers.Adam(), "mse")
    other.optimizer.build(other.trainable_variables)
    with pytest.raises(UserError, match="does not match"):
        CheckpointStore(str(tmp_path), model=other, optimizer=other.optimizer).restore_latest()
