"""The row-sparse optimizers (tfscale.optimizers.row_updates): RowSparseAdagrad and RowSparseSGD
equal Keras's dense update on the same gradients where the algorithms agree; lazy momentum and
`table_l2` touch only the batch's rows (against a NumPy statement); tables are never
weight-decayed whole; and through `compile` a MultiOptimizer's tables take row slices while its
dense weights take dense gradients (also inside the float16 loss scaler's conditional update),
and a table updated whole is said once."""

import collections
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.test_row_sparse_adam import _data, _model, _tables
from tfscale.embedding.strategies import is_table
from tfscale.optimizers import (CowClip, FusedAdam, RowSparseAdagrad, RowSparseAdam,
                                RowSparseCAME, RowSparseSGD, factory, large_batch_settings)
from tfscale.optimizers.loss_scaling import LossScaleOptimizer
from tfscale.optimizers.table_state import per_row_state

ROWS, DIM = 12, 3
IDS = tf.constant([1, 4, 4, 7], tf.int64)  # row 4 twice: its rows are summed first


def _table(name="embeddings"):
    return keras.Variable(
        np.random.default_rng(0).standard_normal((ROWS, DIM)).astype("float32"), name=name)


def _row_gradient(step):
    values = np.random.default_rng(step + 10).standard_normal((4, DIM)).astype("float32")
    return tf.IndexedSlices(tf.constant(values), IDS, tf.constant([ROWS, DIM], tf.int64))


def _train(optimizer, variable, steps=3, densify=False):
    for step in range(steps):
        gradient = _row_gradient(step)
        optimizer.apply([tf.convert_to_tensor(gradient) if densify else gradient], [variable])
    return variable.numpy()


@pytest.mark.parametrize("row_sparse, dense", [
    (lambda: RowSparseAdagrad(0.1), lambda: keras.optimizers.Adagrad(0.1)),
    (lambda: RowSparseSGD(0.1), lambda: keras.optimizers.SGD(0.1)),
], ids=["adagrad", "sgd"])
def test_equals_keras_dense_update_where_the_algorithms_agree(row_sparse, dense):
    """Adagrad and momentum-free SGD leave a row with a zero gradient where it is."""
    by_row = _train(row_sparse(), _table())
    whole = _train(dense(), _table(), densify=True)
    np.testing.assert_allclose(by_row, whole, rtol=1e-6, atol=1e-7)


def test_lazy_momentum_and_table_l2_touch_only_the_batch_rows():
    lr, momentum, l2 = 0.1, 0.5, 0.01
    variable = _table()
    weights = variable.numpy().astype(np.float64)
    velocity = np.zeros_like(weights)
    optimizer = RowSparseSGD(lr, momentum=momentum, table_l2=l2)
    for step in range(3):
        gradient = _row_gradient(step)
        optimizer.apply([gradient], [variable])
        rows = np.unique(IDS.numpy())
        summed = np.zeros((ROWS, DIM))
        np.add.at(summed, IDS.numpy(), gradient.values.numpy())
        summed[rows] += 2 * l2 * weights[rows]
        velocity[rows] = momentum * velocity[rows] - lr * summed[rows]
        weights[rows] += velocity[rows]
    np.testing.assert_allclose(variable.numpy(), weights, rtol=1e-5, atol=1e-6)
    untouched = np.setdiff1d(np.arange(ROWS), IDS.numpy())
    np.testing.assert_array_equal(variable.numpy()[untouched], _table().numpy()[untouched])


def test_table_l2_on_a_dense_gradient_covers_every_row():
    l2 = 0.01
    variable = _table()
    initial = variable.numpy()
    RowSparseSGD(0.1, table_l2=l2).apply([tf.zeros([ROWS, DIM])], [variable])
    np.testing.assert_allclose(variable.numpy(), initial * (1 - 0.1 * 2 * l2), rtol=1e-6)


def test_weight_decay_spares_tables_and_applies_to_the_rest():
    table, kernel = _table(), _table(name="kernel")
    optimizer = RowSparseAdam(1e-3, weight_decay=0.5)
    zero = tf.IndexedSlices(tf.zeros([1, DIM]), tf.constant([0], tf.int64),
                            tf.constant([ROWS, DIM], tf.int64))
    optimizer.apply([zero, tf.zeros([ROWS, DIM])], [table, kernel])
    np.testing.assert_array_equal(table.numpy(), _table().numpy())
    assert not np.allclose(kernel.numpy(), _table(name="kernel").numpy())


def test_bad_table_l2_is_named():
    with pytest.raises(ValueError, match="`table_l2=-1.0`"):
        RowSparseAdagrad(table_l2=-1)


def test_serialises_with_its_table_l2():
    optimizer = RowSparseSGD(0.1, momentum=0.9, table_l2=1e-4)
    copy = keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))
    assert type(copy) is RowSparseSGD and copy.table_l2 == 1e-4 and copy.momentum == 0.9


# ----- through compile and fit

def _launcher_default():
    """The launcher's default on the built-in data: dense FusedAdam, tables RowSparseAdam."""
    return factory.build_optimizer(large_batch_settings(1024, "sqrt", "synthetic"), "adam",
                                   warmup_steps=2)


def _op_counts(graph, variable):
    """How many ops of each type in `graph` take `variable`'s handle."""
    handle = variable.value.handle
    inner = [internal for external, internal in graph.captures if external is handle]
    return collections.Counter(
        op.type for op in graph.get_operations()
        if any(tensor is placeholder for tensor in op.inputs for placeholder in inner))


@pytest.mark.parametrize("optimizer, row_passes", [
    (_launcher_default, 2), (lambda: RowSparseAdagrad(1e-2, table_l2=1e-3), 1),
    (lambda: RowSparseSGD(1e-2, momentum=0.9), 1),
    (lambda: CowClip(None, FusedAdam(1e-3), l2=1e-5), 2),
    (lambda: RowSparseCAME(1e-3, table_l2=1e-3), 1),
], ids=["launcher_default", "adagrad", "sgd", "cowclip_scalable", "came"])
def test_tables_and_their_per_row_state_are_only_read_and_written_by_row(optimizer, row_passes):
    """Each per-row slot of a table is gathered once and scattered once a step, and there are
    `row_passes` of them: Adam's moments in one slot (plus the last step with the catch-up),
    not two, so its step reads and writes the moments' rows once; CAME's momentum and row
    statistics in one slot."""
    model = _model()
    model.compile(optimizer=optimizer(), loss="binary_crossentropy")
    ids, labels = _data()
    model.fit(ids, labels, batch_size=16, epochs=1, verbose=0)
    step = tf.function(model.train_step).get_concrete_function(
        (tf.constant(ids[:16]), tf.constant(labels[:16])))
    for table in _tables(model):
        slots = per_row_state(model.optimizer, table)
        assert len(slots) == row_passes, (table.path, [slot.path for slot in slots])
        for variable in [table, *slots]:
            ops = _op_counts(step.graph, variable)
            assert ops["ResourceScatterUpdate"] == 1, (variable.path, ops)
            assert not ops.keys() & {"ReadVariableOp", "AssignVariableOp", "ResourceApplyAdam"}, (
                variable.path, ops)
        for slot in slots:
            ops = _op_counts(step.graph, slot)
            assert ops["ResourceGather"] == 1, (slot.path, ops)


def _ops_on_handle(graph, handle_placeholders):
    """The types of the ops in `graph` taking one of `handle_placeholders`, and of those in the
    branches of its conditionals (where Keras's loss scaler applies the inner optimizer)."""
    types = set()
    for op in graph.get_operations():
        taken = [i for i, tensor in enumerate(op.inputs)
                 if any(tensor is placeholder for placeholder in handle_placeholders)]
        if not taken:
            continue
        types.add(op.type)
        if op.type in ("If", "StatelessIf"):  # input 0 is the condition
            for branch in ("then_branch", "else_branch"):
                inner = graph._get_function(op.get_attr(branch).name).graph
                types |= _ops_on_handle(inner, [inner.inputs[i - 1] for i in taken])
    return types


def test_under_mixed_float16_the_loss_scaler_keeps_tables_and_state_by_row():
    """Keras's scaler divides every gradient (which would densify the tables'); tfscale's keeps
    them as rows, so inside its conditional update the tables are still only gathered and
    scattered."""
    keras.mixed_precision.set_dtype_policy("mixed_float16")
    try:
        model = _model()
    finally:
        keras.mixed_precision.set_dtype_policy("float32")
    model.compile(optimizer=LossScaleOptimizer(_launcher_default()), loss="binary_crossentropy")
    ids, labels = _data()
    model.fit(ids, labels, batch_size=16, epochs=1, verbose=0)
    step = tf.function(model.train_step).get_concrete_function(
        (tf.constant(ids[:16]), tf.constant(labels[:16])))
    graph = step.graph
    for table in _tables(model):
        for variable in [table, *per_row_state(model.optimizer, table)]:
            handle = variable.value.handle
            placeholders = [inner for outer, inner in graph.captures if outer is handle]
            ops = _ops_on_handle(graph, placeholders)
            assert "ResourceScatterUpdate" in ops, (variable.path, ops)
            assert not ops & {"ReadVariableOp", "AssignVariableOp", "ResourceApplyAdam"}, (
                variable.path, ops)


def test_multioptimizer_tables_move_only_where_looked_up_and_dense_weights_everywhere():
    model = _model()
    model.compile(optimizer=_launcher_default(), loss="binary_crossentropy")
    initial = [v.numpy() for v in model.trainable_variables]
    ids, labels = _data()
    model.fit(ids, labels, batch_size=16, epochs=1, verbose=0)
    seen = np.zeros(sum((40, 30, 50)), bool)
    seen[(ids + np.array([0, 40, 70])).ravel()] = True
    for variable, before in zip(model.trainable_variables, initial):
        after = variable.numpy()
        if is_table(variable):
            np.testing.assert_array_equal(after[~seen], before[~seen])
            assert (after[seen] != before[seen]).any(axis=1).all(), variable.path
        else:
            assert (after != before).all(), variable.path


def test_a_table_updated_whole_is_said_once():
    model = _model()
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="binary_crossentropy")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")  # what a user sees: one line per message
        model.fit(*_data(), batch_size=16, epochs=2, verbose=0)
    said = [str(w.message) for w in caught if "updated whole" in str(w.message)]
    assert len(said) == 1 and "fields/deep_embedding/embeddings (by Adam)" in said[0], said
    model = _model()
    model.compile(optimizer=RowSparseAdam(1e-2), loss="binary_crossentropy")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(*_data(), batch_size=16, epochs=1, verbose=0)
    assert not [w for w in caught if "updated whole" in str(w.message)]
