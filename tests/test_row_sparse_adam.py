"""RowSparseAdam: lazy Adam on a table's rows against a NumPy restatement; its catch-up of absent
rows against Adam on the densified gradient; `compile(optimizer=
RowSparseAdam())` takes the row-sparse path (only the batch's rows and moments move); and tables
are read the way their optimizer updates them (in place by row, or whole), which decides whether
TensorFlow copies a whole table every step (tfscale.embedding.table)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfscale.embedding.strategies import is_table
from tfscale.embedding.field_embedding import FieldEmbedding
from tfscale.optimizers import CowClip, FusedAdam, RowSparseAdam
from tfscale.optimizers.table_state import per_row_state
from tfscale.row_gradients import CountedSlices, sum_duplicate_rows
from tfscale.training.callbacks import CatchUpRows
from tfscale.training.train_step import FunctionalTrainStepModel
from tests.row_gaps import train_with_gaps

VOCAB, DIM = 10, 3
# Betas exact in float32, so the float64 restatement differs only by rounding.
LR, BETA_1, BETA_2, EPSILON = 1e-2, 0.875, 1 - 2.0 ** -10, 1e-7


def numpy_lazy_adam(weights, m, v, step, ids, grads):
    """One lazy Adam step: each id's occurrences summed, only those rows and moments updated."""
    unique, position = np.unique(ids, return_inverse=True)
    gradient = np.zeros((len(unique), weights.shape[1]))
    np.add.at(gradient, position, grads)
    weights, m, v = weights.copy(), m.copy(), v.copy()
    m[unique] = BETA_1 * m[unique] + (1 - BETA_1) * gradient
    v[unique] = BETA_2 * v[unique] + (1 - BETA_2) * gradient ** 2
    alpha = LR * np.sqrt(1 - BETA_2 ** step) / (1 - BETA_1 ** step)
    weights[unique] -= alpha * m[unique] / (np.sqrt(v[unique]) + EPSILON)
    return weights, m, v


def numpy_two_slot_adam(weights, m, v, last, step, ids, grads, l2):
    """One step of RowSparseAdam as it was with its moments in two slots (float64): each row of
    the batch caught up from its last step, then the table's L2 and Adam on its rows."""
    def corrected(t):
        return LR * np.sqrt(1 - BETA_2 ** t) / (1 - BETA_1 ** t)

    unique, position = np.unique(ids, return_inverse=True)
    gradient = np.zeros((len(unique), weights.shape[1]))
    np.add.at(gradient, position, grads)
    weights, m, v, last = weights.copy(), m.copy(), v.copy(), last.copy()
    w, mu, nu = weights[unique], m[unique], v[unique]
    skipped = (step - 1 - last[unique])[:, None]
    ratio = BETA_1 / np.sqrt(BETA_2)
    tail = ratio * (1 - ratio ** skipped) / (1 - ratio)
    w = w - corrected(last[unique] + 1)[:, None] * mu / (np.sqrt(nu) + EPSILON) * tail
    root_v_row = np.maximum(np.sqrt(nu.mean(axis=1, keepdims=True)), EPSILON)
    q = 1 / np.sqrt(BETA_2)
    n = np.minimum(np.floor(np.log(root_v_row / EPSILON) / np.log(q)), skipped)
    pull = q * (q ** n - 1) / (q - 1) / root_v_row + (skipped - n) / EPSILON
    w = w * np.exp(-corrected(step) * 2 * l2 * pull)
    gradient += 2 * l2 * w
    mu = BETA_1 * BETA_1 ** skipped * mu + (1 - BETA_1) * gradient
    nu = BETA_2 * BETA_2 ** skipped * nu + (1 - BETA_2) * gradient ** 2
    weights[unique] = w - corrected(step) * mu / (np.sqrt(nu) + EPSILON)
    m[unique], v[unique], last[unique] = mu, nu, step
    return weights, m, v, last


def _batches(steps):
    rng = np.random.default_rng(3)
    for _ in range(steps):
        ids = rng.choice([0, 0, 1, 2, 2, 2, 5, 7], size=6)  # 3, 4, 6, 8, 9 never occur
        yield ids, rng.normal(0, 1, (6, DIM)).astype("float32").astype("float64")


def _run(make_gradient, steps=4):
    optimizer = RowSparseAdam(LR, beta_1=BETA_1, beta_2=BETA_2, epsilon=EPSILON, catch_up=False)
    initial = np.random.default_rng(0).normal(0, 0.1, (VOCAB, DIM))
    table = keras.Variable(initial.astype("float32"), name="embeddings")

    @tf.function
    def step(ids, grads):
        optimizer.apply([make_gradient(ids, grads)], [table])

    history = []
    for ids, grads in _batches(steps):
        step(tf.constant(ids, tf.int64), tf.constant(grads, tf.float32))
        history.append((ids, grads))
    moments = optimizer.table_state(table).per_row[0].numpy()
    return initial, history, table.numpy(), (moments[:, 0], moments[:, 1])


def _occurrence_slices(ids, grads):
    return tf.IndexedSlices(grads, ids, tf.constant([VOCAB, DIM], tf.int64))


def test_matches_numpy_lazy_adam_and_leaves_absent_rows_alone():
    initial, history, table, (m, v) = _run(_occurrence_slices)
    weights, m_ref, v_ref = initial, np.zeros_like(initial), np.zeros_like(initial)
    for step, (ids, grads) in enumerate(history, start=1):
        weights, m_ref, v_ref = numpy_lazy_adam(weights, m_ref, v_ref, step, ids, grads)
    np.testing.assert_allclose(table, weights, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(m, m_ref, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(v, v_ref, rtol=1e-5, atol=1e-9)
    never = [3, 4, 6, 8, 9]
    np.testing.assert_array_equal(table[never], initial[never].astype("float32"))
    assert not m[never].any() and not v[never].any()


def test_one_moments_slot_takes_the_two_slot_update():
    """Rows 1, 5 and 7 miss batches, so they are caught up: the table, both moments (the slot's
    [:, 0] and [:, 1]) and the last steps match the update as it was with two slots."""
    l2 = 0.05
    optimizer = RowSparseAdam(LR, beta_1=BETA_1, beta_2=BETA_2, epsilon=EPSILON, table_l2=l2)
    initial = np.random.default_rng(0).normal(0, 0.1, (VOCAB, DIM))
    table = keras.Variable(initial.astype("float32"), name="embeddings")
    weights, m, v = initial, np.zeros_like(initial), np.zeros_like(initial)
    last = np.zeros(VOCAB)
    for step, (ids, grads) in enumerate(_batches(30), start=1):
        optimizer.apply([_occurrence_slices(tf.constant(ids, tf.int64),
                                            tf.constant(grads, tf.float32))], [table])
        weights, m, v, last = numpy_two_slot_adam(weights, m, v, last, step, ids, grads, l2)
    moments, last_steps = optimizer.table_state(table).per_row
    assert tuple(moments.shape) == (VOCAB, 2, DIM)
    np.testing.assert_allclose(table.numpy(), weights, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(moments.numpy()[:, 0], m, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(moments.numpy()[:, 1], v, rtol=1e-5, atol=1e-9)
    np.testing.assert_array_equal(last_steps.numpy(), last)


def test_a_dense_table_gradient_takes_adam_on_the_whole_table():
    """The `dense` exchange hands a table's gradient whole: the table and its moments slot take
    Adam's update (Keras's, with the table's L2 in the gradient), and no row is behind after."""
    l2 = 0.05
    initial = np.random.default_rng(0).normal(0, 0.1, (VOCAB, DIM)).astype("float32")
    table = keras.Variable(initial, name="embeddings")
    reference = keras.Variable(initial, name="reference")
    optimizer = RowSparseAdam(LR, beta_1=BETA_1, beta_2=BETA_2, epsilon=EPSILON, table_l2=l2)
    keras_adam = keras.optimizers.Adam(LR, beta_1=BETA_1, beta_2=BETA_2, epsilon=EPSILON)
    for ids, grads in _batches(3):
        dense = tf.convert_to_tensor(_occurrence_slices(tf.constant(ids, tf.int64),
                                                        tf.constant(grads, tf.float32)))
        optimizer.apply([dense], [table])
        keras_adam.apply([dense + 2 * l2 * reference], [reference])
    np.testing.assert_allclose(table.numpy(), reference.numpy(), rtol=1e-5, atol=1e-7)
    moments, last_steps = optimizer.table_state(table).per_row
    np.testing.assert_allclose(moments.numpy()[:, 0], keras_adam._momentums[0].numpy(),
                               rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(moments.numpy()[:, 1], keras_adam._velocities[0].numpy(),
                               rtol=1e-5, atol=1e-9)
    assert (last_steps.numpy() == 3).all()


def _assert_nearer_the_dense_update(caught_up, lazy, dense, rows):
    for row in rows:
        caught_up_error = np.abs(caught_up[row] - dense[row]).max()
        lazy_error = np.abs(lazy[row] - dense[row]).max()
        assert caught_up_error < 0.25 * lazy_error, (row, caught_up_error, lazy_error)


@pytest.mark.parametrize("l2", [0.0, 0.05])
def test_catch_up_follows_adam_on_the_densified_gradient(l2):
    """Rows 1 and 2 are absent for stretches: caught up, they land within a quarter of lazy
    Adam's distance from the dense update; a row never in a batch is not touched."""
    dense = train_with_gaps(FusedAdam(LR), DIM, densify=True, l2=l2).numpy()
    caught_up = train_with_gaps(RowSparseAdam(LR, table_l2=l2), DIM, l2=l2).numpy()
    lazy = train_with_gaps(RowSparseAdam(LR, table_l2=l2, catch_up=False), DIM, l2=l2).numpy()
    _assert_nearer_the_dense_update(caught_up, lazy, dense, rows=(1, 2))
    np.testing.assert_allclose(caught_up[0], dense[0], rtol=1e-4, atol=1e-6)
    np.testing.assert_array_equal(caught_up[3], lazy[3])


def test_catching_up_every_row_brings_the_table_to_the_dense_update():
    """After step 300, row 1 is 19 steps behind and row 3 was never in a batch: the whole-table
    catch-up moves row 1 to near the dense update and row 3 to the zero Adam's L2 pulls it to
    (within Adam's step of it); a second call changes nothing."""
    l2 = 0.05
    dense = train_with_gaps(FusedAdam(LR), DIM, densify=True, l2=l2, steps=300).numpy()
    lazy = train_with_gaps(RowSparseAdam(LR, table_l2=l2, catch_up=False), DIM, l2=l2,
                           steps=300).numpy()
    optimizer = RowSparseAdam(LR, table_l2=l2)
    table = train_with_gaps(optimizer, DIM, l2=l2, steps=300)
    optimizer.catch_up_every_row(block_rows=3)  # two blocks
    caught_up = table.numpy()
    _assert_nearer_the_dense_update(caught_up, lazy, dense, rows=(1,))
    assert np.abs(dense[3]).max() < LR and np.abs(caught_up[3]).max() < 1e-6
    assert np.abs(lazy[3]).max() > 0.02  # where it started
    optimizer.catch_up_every_row()
    np.testing.assert_array_equal(table.numpy(), caught_up)


# Rows 1-4 leave the batches after these steps of 170 (50, 20, 10 and 5 steps before the end);
# row 0 is in every batch, row 5 in none.
LAST_STEPS = {1: 119, 2: 149, 3: 159, 4: 164}
LEAVING_ROWS, LEAVING_STEPS = 6, 170


def _train_leaving_rows(optimizer, l2, densify=False):
    """(initial rows, table) after LEAVING_STEPS steps on a [6, DIM] table whose rows start at
    0.5 to 1.5 in size and whose gradients keep one sign a coordinate (towards zero, with
    noise), so a row leaves the batches with a first moment whose tail would move it on for
    tens of steps; the L2's pull, 2 * l2 * w, points the same way. `densify`: the optimizer
    takes the dense gradient with the L2's added, every row every step (dense Adam)."""
    init = np.random.default_rng(0)
    initial = (init.choice([-1.0, 1.0], (LEAVING_ROWS, DIM))
               * init.uniform(0.5, 1.5, (LEAVING_ROWS, DIM))).astype("float32")
    table = keras.Variable(initial, name="embeddings")
    shape = tf.constant([LEAVING_ROWS, DIM], tf.int64)

    @tf.function(reduce_retracing=True)
    def step(ids, values):
        if densify:
            gradient = tf.scatter_nd(ids[:, None], values, shape) + 2 * l2 * table
        else:
            gradient = tf.IndexedSlices(values, ids, shape)
        optimizer.apply([gradient], [table])

    rng = np.random.default_rng(1)
    for step_number in range(LEAVING_STEPS):
        ids = [0] + [row for row, last in LAST_STEPS.items() if step_number <= last]
        values = 0.01 * np.sign(initial[ids]) + rng.normal(0, 0.005, (len(ids), DIM))
        step(tf.constant(ids, tf.int64), tf.constant(values, tf.float32))
    return initial, table


@pytest.mark.parametrize("l2", [0.0, 5e-4])
def test_catching_up_every_row_follows_dense_adam_over_each_rows_gap(l2):
    """Dense Adam (Keras's, every row every step, the L2 in the gradient) keeps moving rows 1-4
    after they leave the batches, by their first moments' tails (and the L2): after
    `catch_up_every_row` each lands within a quarter of lazy Adam's distance from it, and with
    l2 = 0 its moments are dense Adam's. Row 0, in every batch, is dense Adam's; row 5, in none,
    stays where it started (l2 = 0) or goes to the zero the L2 pulls it to."""
    reference = keras.optimizers.Adam(LR)
    initial, dense = _train_leaving_rows(reference, l2, densify=True)
    _, lazy = _train_leaving_rows(RowSparseAdam(LR, table_l2=l2, catch_up=False), l2)
    optimizer = RowSparseAdam(LR, table_l2=l2)
    _, table = _train_leaving_rows(optimizer, l2)
    # No row was behind while in the batches: until the catch-up, the table is lazy Adam's.
    np.testing.assert_array_equal(table.numpy(), lazy.numpy())
    optimizer.catch_up_every_row()
    caught_up, dense, lazy = table.numpy(), dense.numpy(), lazy.numpy()

    _assert_nearer_the_dense_update(caught_up, lazy, dense, rows=LAST_STEPS)
    np.testing.assert_allclose(caught_up[0], dense[0], rtol=1e-4, atol=2e-5)  # float rounding
    if l2 == 0:
        np.testing.assert_array_equal(caught_up[5], initial[5])
        np.testing.assert_array_equal(dense[5], initial[5])
        moments = optimizer.table_state(table).per_row[0].numpy()
        np.testing.assert_allclose(moments[:, 0], reference._momentums[0].numpy(), rtol=1e-4,
                                   atol=1e-10)
        np.testing.assert_allclose(moments[:, 1], reference._velocities[0].numpy(), rtol=1e-4,
                                   atol=1e-12)
    else:
        assert np.abs(caught_up[5]).max() < 1e-6 and np.abs(lazy[5] - initial[5]).max() == 0


def test_counted_slices_of_unique_ids_take_the_same_step():
    def unique_counted(ids, grads):
        unique, position, counts = tf.unique_with_counts(ids)
        summed = tf.math.unsorted_segment_sum(grads, position, tf.size(unique))
        return CountedSlices(summed, unique, tf.constant([VOCAB, DIM], tf.int64),
                             tf.cast(counts, tf.float32), unique_ids=True)

    _, _, by_occurrence, _ = _run(_occurrence_slices)
    _, _, by_unique_id, _ = _run(unique_counted)
    np.testing.assert_allclose(by_unique_id, by_occurrence, rtol=1e-6)


def test_sum_duplicate_rows_trusts_only_counted_slices_marked_unique():
    repeated = CountedSlices(tf.constant([[1.0], [2.0], [4.0]]), tf.constant([5, 2, 5]),
                             tf.constant([8, 1]), tf.constant([2.0, 1.0, 3.0]))
    ids, rows, counts = sum_duplicate_rows(repeated)
    assert ids.numpy().tolist() == [5, 2]
    assert rows.numpy().ravel().tolist() == [5.0, 2.0]
    assert counts.numpy().tolist() == [5.0, 1.0]
    unique = CountedSlices(tf.constant([[1.0], [2.0]]), tf.constant([5, 2]), tf.constant([8, 1]),
                           tf.constant([2.0, 1.0]), unique_ids=True)
    ids, rows, counts = sum_duplicate_rows(unique)
    assert ids.numpy().tolist() == [5, 2] and counts.numpy().tolist() == [2.0, 1.0]


# ----- on a model, through compile and fit

SIZES = (40, 30, 50)


def _model(deduplicate=True):
    keras.utils.set_random_seed(1)
    ids = keras.Input((len(SIZES),), dtype="int64")
    embeddings, linear = FieldEmbedding(SIZES, embedding_dim=4, use_wide=True,
                                        deduplicate=deduplicate, name="fields")(ids)
    logits = keras.layers.Dense(1)(keras.layers.Flatten()(embeddings)) + linear
    return FunctionalTrainStepModel(ids, keras.layers.Activation("sigmoid")(logits))


def _data():
    rng = np.random.default_rng(5)
    ids = np.stack([rng.integers(0, 10, 64) for _ in SIZES], axis=1)  # rows >= 10 never seen
    return ids, rng.integers(0, 2, (64, 1)).astype("float32")


def _trained_tables(optimizer, deduplicate=True, epochs=2):
    model = _model(deduplicate)
    model.compile(optimizer=optimizer, loss="binary_crossentropy")
    initial = [np.array(t) for t in _tables(model)]
    model.fit(*_data(), batch_size=16, epochs=epochs, shuffle=False, verbose=0)
    return model, initial, [np.array(t) for t in _tables(model)]


def _tables(model):
    return [v for v in model.trainable_variables if is_table(v)]


@pytest.mark.parametrize("deduplicate", [True, False])
def test_compiled_it_moves_only_the_rows_looked_up(deduplicate):
    model, initial, trained = _trained_tables(RowSparseAdam(1e-2), deduplicate)
    seen = np.zeros(sum(SIZES), bool)
    offsets = np.concatenate([[0], np.cumsum(SIZES)[:-1]])
    seen[(_data()[0] + offsets).ravel()] = True
    for before, after in zip(initial, trained):
        np.testing.assert_array_equal(after[~seen], before[~seen])
        assert (after[seen] != before[seen]).any(axis=1).all()
    for table in _tables(model):
        moments = per_row_state(model.optimizer, table)[0]
        assert not np.asarray(moments)[~seen].any()


def test_the_callback_catches_every_row_up_after_each_epoch():
    """Through a loss scaler and a MultiOptimizer: rows never looked up end at zero (the L2's
    pull), rows looked up do not."""
    model = _model()
    table_optimizer = RowSparseAdam(1e-2, table_l2=1e-2)
    optimizer_map = keras.optimizers.OptimizerMap(keras.optimizers.Adam(1e-2))
    optimizer_map[r".*embeddings"] = table_optimizer
    model.compile(optimizer=keras.optimizers.LossScaleOptimizer(
        keras.optimizers.MultiOptimizer(optimizer_map)), loss="binary_crossentropy")
    model.fit(*_data(), batch_size=16, epochs=1, verbose=0, callbacks=[CatchUpRows()])
    seen = np.zeros(sum(SIZES), bool)
    offsets = np.concatenate([[0], np.cumsum(SIZES)[:-1]])
    seen[(_data()[0] + offsets).ravel()] = True
    for table in _tables(model):
        rows = np.asarray(table)
        assert not rows[~seen].any(), table.path
        assert np.abs(rows[seen]).min(axis=1).all(), table.path


def test_compiled_it_gives_the_same_tables_with_and_without_deduplication():
    _, _, deduplicated = _trained_tables(RowSparseAdam(1e-2), deduplicate=True)
    _, _, plain = _trained_tables(RowSparseAdam(1e-2), deduplicate=False)
    for a, b in zip(deduplicated, plain):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def _ops_on(graph, variable):
    """The types of the ops in `graph` that take `variable`'s handle."""
    handle = variable.value.handle
    inner = [internal for external, internal in graph.captures if external is handle]
    return {op.type for op in graph.get_operations()
            if any(tensor is placeholder for tensor in op.inputs for placeholder in inner)}


@pytest.mark.parametrize("optimizer, by_row", [
    (lambda: RowSparseAdam(1e-2), True),
    (lambda: CowClip(mode="scalable"), True),
    (lambda: FusedAdam(1e-2), False),
    (lambda: CowClip(mode="faithful"), False),
], ids=["row_sparse_adam", "cowclip_scalable", "fused_adam", "cowclip_faithful"])
def test_tables_are_read_as_their_optimizer_updates_them(optimizer, by_row):
    model = _model()
    model.compile(optimizer=optimizer(), loss="binary_crossentropy")
    ids, labels = _data()
    model.fit(ids, labels, batch_size=16, epochs=1, verbose=0)  # builds the optimizer
    step = tf.function(model.train_step).get_concrete_function(
        (tf.constant(ids[:16]), tf.constant(labels[:16])))
    for table in _tables(model):
        ops = _ops_on(step.graph, table)
        if by_row:
            assert "ResourceGather" in ops and "ReadVariableOp" not in ops, (table.path, ops)
        else:
            assert "ReadVariableOp" in ops and "ResourceGather" not in ops, (table.path, ops)
