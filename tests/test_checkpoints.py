"""Checkpoints are atomic, round-trip model and optimizer state, and never leave a partial
checkpoint behind."""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfscale.errors import UserError
from tfscale.checkpoints.store import CheckpointStore


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


def test_a_checkpoint_with_row_sparse_adams_two_moment_slots_resumes(tmp_path):
    """Tables' files written when RowSparseAdam kept a table's moments in two slots
    (`..._momentum`, `..._velocity`) restore into its one slot (`..._moments`, [rows, 2, dim])."""
    from tests.test_row_sparse_adam import _data, _model
    from tfscale.optimizers import RowSparseAdam

    model = _model()
    model.compile(optimizer=RowSparseAdam(1e-2, table_l2=1e-3, name="tables"),
                  loss="binary_crossentropy")
    model.fit(*_data(), batch_size=16, epochs=1, verbose=0)
    directory = CheckpointStore(str(tmp_path), model, model.optimizer).save(4, {"epoch": 0})
    path = os.path.join(directory, "tables-0-of-1.npz")
    with np.load(path) as stored:
        arrays = {name: stored[name] for name in stored.files}
    for name in [name for name in arrays if name.endswith("_moments")]:
        moments = arrays.pop(name)
        prefix = name.removesuffix("_moments")
        arrays[f"{prefix}_momentum"], arrays[f"{prefix}_velocity"] = moments[:, 0], moments[:, 1]
    assert sum(name.endswith("_velocity") for name in arrays) == 2, list(arrays)
    np.savez(path, **arrays)

    again = _model()
    again.compile(optimizer=RowSparseAdam(1e-2, table_l2=1e-3, name="tables"),
                  loss="binary_crossentropy")
    again.optimizer.build(again.trainable_variables)
    CheckpointStore(str(tmp_path), again, again.optimizer).restore_latest()
    for a, b in zip(model.variables + model.optimizer.variables,
                    again.variables + again.optimizer.variables):
        np.testing.assert_array_equal(np.asarray(b), np.asarray(a), err_msg=a.path)
