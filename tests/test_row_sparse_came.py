"""RowSparseCAME (tfscale.optimizers.row_sparse_came): with every row of a table in every step it is
came-pytorch's CAME on that matrix (float64, to 1e-10, by row slices and by a dense gradient);
with some rows, a NumPy restatement of the row update (column statistics and RMS clip over the
batch's rows, estimates normalised by the column statistics' means), absent rows and their
state bitwise untouched; its state (one per-row slot of dim + 2, two column vectors) and bytes
against RowSparseAdam's; float32 state and a by-row step under mixed precision and the loss
scaler; the tables' L2 and Keras's weight decay; checkpoints and saved models resume
identically; the launcher's `--optimizer=came` builds it for the tables."""

import dataclasses

import keras
import numpy as np
import pytest
import tensorflow as tf
import torch
from came_pytorch import CAME as ReferenceCAME

from tests.test_row_sparse_adam import _data, _model, _tables
from tests.test_row_updates import _ops_on_handle
from tfscale.optimizers import CAME, LossScaleOptimizer, RowSparseAdam, RowSparseCAME, factory
from tfscale.optimizers.memory import optimizer_state_bytes
from tfscale.optimizers.scaling import large_batch_settings
from tfscale.optimizers.table_state import per_row_state, table_state
from tfscale.checkpoints.store import CheckpointStore

# Powers of two: Keras keeps the rate in a float32 variable (tests/test_came_parity.py).
LEARNING_RATE = 2.0 ** -6
ROWS, DIM = 9, 4
BETAS, EPSILONS = (0.9, 0.999, 0.9999), (1e-30, 1e-16)


def _table(initial, dtype="float64"):
    return keras.Variable(initial.astype(dtype), dtype=dtype, name="embeddings")


def _slices(ids, values, dtype="float64"):
    return tf.IndexedSlices(tf.constant(values, dtype), tf.constant(ids, tf.int64),
                            tf.constant([ROWS, DIM], tf.int64))


def _summed(ids, values):
    """Each id's rows summed, as the table's [ROWS, DIM] gradient."""
    whole = np.zeros((ROWS, DIM))
    np.add.at(whole, ids, values)
    return whole


def _every_row_steps(steps, seed=0):
    """(ids, row gradients) of `steps` steps holding every row, shuffled, rows 2 and 5 twice."""
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        ids = rng.permutation(np.concatenate([np.arange(ROWS), [2, 5]]))
        yield ids, rng.standard_normal((len(ids), DIM)) * rng.uniform(0.1, 3.0)


# With the default betas the unclipped update's RMS starts near sqrt(1000): a clip threshold of 1
# clips every step, 100 none.
@pytest.mark.parametrize("clip_threshold", [1.0, 100.0])
@pytest.mark.parametrize("by_rows", [True, False], ids=["row_slices", "dense_gradient"])
def test_every_row_in_every_step_is_came_pytorch_on_the_matrix(clip_threshold, by_rows):
    initial = np.random.default_rng(1).standard_normal((ROWS, DIM))
    table = _table(initial)
    optimizer = RowSparseCAME(LEARNING_RATE, clip_threshold=clip_threshold)
    parameter = torch.nn.Parameter(torch.tensor(initial))
    reference = ReferenceCAME([parameter], lr=LEARNING_RATE, clip_threshold=clip_threshold)
    for ids, values in _every_row_steps(12):
        gradient = _slices(ids, values) if by_rows else tf.constant(_summed(ids, values))
        optimizer.apply([gradient], [table])
        parameter.grad = torch.tensor(_summed(ids, values))
        reference.step()
    assert not np.allclose(table.numpy(), initial, rtol=1e-3)
    np.testing.assert_allclose(table.numpy(), parameter.detach().numpy(), rtol=1e-10, atol=1e-13)
    state = reference.state[parameter]
    slot = optimizer.table_state(table).per_row[0].numpy()
    np.testing.assert_allclose(slot[:, :DIM], state["exp_avg"].numpy(), rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(slot[:, DIM], state["exp_avg_sq_row"].numpy(), rtol=1e-10)
    np.testing.assert_allclose(slot[:, DIM + 1], state["exp_avg_res_row"].numpy(), rtol=1e-10)


def numpy_row_came(weights, slot, column, instability_column, ids, values, clip_threshold):
    """One RowSparseCAME step in NumPy (float64): each id's rows summed; the batch's rows and
    the column statistics updated (module docstring of tfscale.optimizers.row_sparse_came)."""
    (b1, b2, b3), (e1, e2) = BETAS, EPSILONS
    unique, position = np.unique(ids, return_inverse=True)
    g = np.zeros((len(unique), DIM))
    np.add.at(g, position, values)
    weights, slot = weights.copy(), slot.copy()
    m, r, instability_row = slot[unique, :DIM], slot[unique, DIM], slot[unique, DIM + 1]
    squared = g ** 2 + e1
    r = b2 * r + (1 - b2) * squared.mean(axis=1)
    column = b2 * column + (1 - b2) * squared.mean(axis=0)
    u = g / np.sqrt(r[:, None] * column[None, :] / column.mean())
    u /= max(1.0, np.sqrt(np.mean(u ** 2)) / clip_threshold)
    m = b1 * m + (1 - b1) * u
    instability = (u - m) ** 2 + e2
    instability_row = b3 * instability_row + (1 - b3) * instability.mean(axis=1)
    instability_column = b3 * instability_column + (1 - b3) * instability.mean(axis=0)
    weights[unique] -= LEARNING_RATE * m / np.sqrt(
        instability_row[:, None] * instability_column[None, :] / instability_column.mean())
    slot[unique] = np.concatenate([m, r[:, None], instability_row[:, None]], axis=1)
    return weights, slot, column, instability_column


@pytest.mark.parametrize("clip_threshold", [1.0, 100.0])
def test_some_rows_follow_the_row_update_and_absent_rows_are_untouched(clip_threshold):
    rng = np.random.default_rng(2)
    initial = rng.standard_normal((ROWS, DIM))
    table = _table(initial)
    optimizer = RowSparseCAME(LEARNING_RATE, clip_threshold=clip_threshold)
    weights, slot = initial, np.zeros((ROWS, DIM + 2))
    column, instability_column = np.zeros(DIM), np.zeros(DIM)
    optimizer.build([table])
    (held,) = per_row_state(optimizer, table)
    never = [3, 8]
    for _ in range(6):
        ids = rng.choice([0, 1, 1, 2, 4, 5, 5, 5, 6, 7], size=5)  # rows 3 and 8 never
        values = rng.standard_normal((5, DIM)) * rng.uniform(0.1, 3.0)
        before_table, before_slot = table.numpy(), held.numpy()
        optimizer.apply([_slices(ids, values)], [table])
        absent = np.setdiff1d(np.arange(ROWS), ids)
        np.testing.assert_array_equal(table.numpy()[absent], before_table[absent])
        np.testing.assert_array_equal(held.numpy()[absent], before_slot[absent])
        weights, slot, column, instability_column = numpy_row_came(
            weights, slot, column, instability_column, ids, values, clip_threshold)
    np.testing.assert_allclose(table.numpy(), weights, rtol=1e-10, atol=1e-13)
    np.testing.assert_array_equal(table.numpy()[never], initial[never])
    state = optimizer.table_state(table)
    np.testing.assert_allclose(state.per_row[0].numpy(), slot, rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(state.whole[0].numpy(), column, rtol=1e-10)
    np.testing.assert_allclose(state.whole[1].numpy(), instability_column, rtol=1e-10)
    assert not state.per_row[0].numpy()[never].any()


def test_other_variables_take_came():
    """A variable that is not a table (a kernel) takes tfscale's CAME, bitwise."""
    rng = np.random.default_rng(4)
    initial = rng.standard_normal((5, 3)).astype("float32")
    kernels = [keras.Variable(initial, name="kernel") for _ in range(2)]
    optimizers = [RowSparseCAME(1e-2, weight_decay=0.1), CAME(1e-2, weight_decay=0.1)]
    for _ in range(3):
        gradient = tf.constant(rng.standard_normal((5, 3)).astype("float32"))
        for optimizer, kernel in zip(optimizers, kernels):
            optimizer.apply([gradient], [kernel])
    np.testing.assert_array_equal(kernels[0].numpy(), kernels[1].numpy())


def test_table_l2_on_the_rows_and_weight_decay_spares_tables():
    """`table_l2` adds 2 * l2 * w to the batch's rows' gradients: the step equals one without
    L2 on that gradient. Keras's weight decay moves the kernel, not the table."""
    initial = np.random.default_rng(5).standard_normal((ROWS, DIM))
    ids, values = np.array([1, 4, 4, 7]), np.random.default_rng(6).standard_normal((4, DIM))
    with_l2 = _table(initial)
    RowSparseCAME(LEARNING_RATE, table_l2=0.25, weight_decay=0.5).apply(
        [_slices(ids, values)], [with_l2])
    without = _table(initial)
    rows = np.unique(ids)
    l2_values = _summed(ids, values)[rows] + 2 * 0.25 * initial[rows]
    RowSparseCAME(LEARNING_RATE).apply([_slices(rows, l2_values)], [without])
    np.testing.assert_allclose(with_l2.numpy(), without.numpy(), rtol=1e-12)

    table, kernel = _table(initial), keras.Variable(initial, name="kernel")
    zero = tf.IndexedSlices(tf.zeros([1, DIM], tf.float64), tf.constant([0], tf.int64),
                            tf.constant([ROWS, DIM], tf.int64))
    RowSparseCAME(LEARNING_RATE, weight_decay=0.5).apply(
        [zero, tf.zeros([ROWS, DIM], tf.float64)], [table, kernel])
    np.testing.assert_array_equal(table.numpy(), initial)
    assert not np.allclose(kernel.numpy(), initial)


def test_state_is_one_per_row_slot_and_two_column_vectors():
    """Per [rows, dim] table: [rows, dim + 2] and two [dim] vectors, float32 for a float32 table,
    (dim + 2) / (2 dim + 1) of RowSparseAdam's per-row bytes (its moments and last step)."""
    table = keras.Variable(np.zeros((1000, 10), np.float32), name="embeddings")
    optimizer = RowSparseCAME()
    optimizer.build([table])
    state = optimizer.table_state(table)
    assert [tuple(v.shape) for v in state.per_row] == [(1000, 12)]
    assert [tuple(v.shape) for v in state.whole] == [(10,), (10,)]
    assert {v.dtype for v in state.per_row + state.whole} == {"float32"}
    declared = table_state(optimizer, table)
    assert [id(v) for v in declared.per_row + declared.whole] == [
        id(v) for v in state.per_row + state.whole]
    came_bytes = optimizer_state_bytes(optimizer).total
    assert came_bytes == 4 * (1000 * 12 + 2 * 10) + 8 + 4  # + iteration (int64), learning rate
    adam = RowSparseAdam()
    adam.build([keras.Variable(np.zeros((1000, 10), np.float32), name="embeddings")])
    assert optimizer_state_bytes(adam).total == 4 * 1000 * (2 * 10 + 1) + 8 + 4


def test_mixed_float16_keeps_float32_state_and_updates_tables_by_row():
    """Under mixed_float16 and the loss scaler, the tables and their slot are only gathered and
    scattered (inside the scaler's conditional update), and the state is float32."""
    keras.mixed_precision.set_dtype_policy("mixed_float16")
    try:
        model = _model()
    finally:
        keras.mixed_precision.set_dtype_policy("float32")
    model.compile(optimizer=LossScaleOptimizer(RowSparseCAME(1e-3, table_l2=1e-4)),
                  loss="binary_crossentropy")
    ids, labels = _data()
    initial = [np.array(t) for t in _tables(model)]
    model.fit(ids, labels, batch_size=16, epochs=1, verbose=0)
    step = tf.function(model.train_step).get_concrete_function(
        (tf.constant(ids[:16]), tf.constant(labels[:16])))
    for table, before in zip(_tables(model), initial):
        slots = per_row_state(model.optimizer, table)
        assert [slot.dtype for slot in slots] == ["float32"]
        assert np.isfinite(np.asarray(table)).all() and not np.allclose(table, before)
        for variable in [table, *slots]:
            placeholders = [inner for outer, inner in step.graph.captures
                            if outer is variable.value.handle]
            ops = _ops_on_handle(step.graph, placeholders)
            assert "ResourceScatterUpdate" in ops, (variable.path, ops)
            assert not ops & {"ReadVariableOp", "AssignVariableOp"}, (variable.path, ops)


def _compiled(name="tables"):
    model = _model()
    model.compile(optimizer=RowSparseCAME(1e-2, table_l2=1e-3, name=name),
                  loss="binary_crossentropy")
    return model


def test_a_checkpoint_resumes_identically(tmp_path):
    """The tables' file holds the per-row slot; restored into a fresh model, training goes on
    exactly as without the interruption."""
    ids, labels = _data()
    model = _compiled()
    model.fit(ids, labels, batch_size=16, epochs=1, shuffle=False, verbose=0)
    directory = CheckpointStore(str(tmp_path), model, model.optimizer).save(4, {"epoch": 0})
    with np.load(f"{directory}/tables-0-of-1.npz") as stored:
        assert sum(name.endswith("_momentum_and_rows") for name in stored.files) == 2
    resumed = _compiled()
    resumed.optimizer.build(resumed.trainable_variables)
    CheckpointStore(str(tmp_path), resumed, resumed.optimizer).restore_latest()
    for trained in (model, resumed):
        trained.fit(ids, labels, batch_size=16, epochs=1, shuffle=False, verbose=0)
    for a, b in zip(model.variables + model.optimizer.variables,
                    resumed.variables + resumed.optimizer.variables):
        np.testing.assert_array_equal(np.asarray(b), np.asarray(a), err_msg=a.path)


def test_saved_model_and_config_round_trip(tmp_path):
    model = _compiled()
    model.fit(*_data(), batch_size=16, epochs=1, verbose=0)
    model.save(tmp_path / "model.keras")
    loaded = keras.models.load_model(tmp_path / "model.keras")
    assert type(loaded.optimizer) is RowSparseCAME and loaded.optimizer.table_l2 == 1e-3
    for a, b in zip(model.optimizer.variables, loaded.optimizer.variables):
        np.testing.assert_array_equal(np.asarray(b), np.asarray(a), err_msg=a.path)
    optimizer = RowSparseCAME(3e-4, beta_3=0.999, clip_threshold=2.0, table_l2=1e-4)
    copy = keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))
    assert type(copy) is RowSparseCAME
    assert (copy.beta_3, copy.clip_threshold, copy.table_l2) == (0.999, 2.0, 1e-4)


@pytest.mark.parametrize("update, table_class", [("row", RowSparseCAME), ("dense", CAME)])
def test_the_launchers_came_updates_tables_as_told(update, table_class):
    settings = dataclasses.replace(large_batch_settings(1024, "none"), dense_learning_rate=2e-4,
                                   embedding_learning_rate=2e-4, warmup_epochs=0)
    optimizer = factory.build_optimizer(settings, "came", warmup_steps=0,
                                        embedding_update=update)
    assert type(optimizer) is table_class
    two_rates = factory.build_optimizer(
        dataclasses.replace(settings, embedding_learning_rate=1e-4), "came", warmup_steps=0,
        embedding_update=update)
    embedding, = [o for o in two_rates.optimizers if o.name == "embedding"]
    dense, = [o for o in two_rates.optimizers if o.name == "dense"]
    assert type(embedding) is table_class and type(dense) is CAME
