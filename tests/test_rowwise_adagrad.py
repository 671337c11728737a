"""RowWiseAdagrad (tfscale.optimizers.rowwise_adagrad) against a NumPy statement of FBGEMM's
row-wise Adagrad over several steps with repeated ids (float32, to 1e-6): alone, with the tables'
L2, under CowClip's per-id clip, and on a dense gradient of the table; its state is one
accumulator a row; dense weights take Keras's Adagrad; the launcher's factory gives the tables
RowWiseAdagrad and the dense weights Adam."""

import keras
import numpy as np
import tensorflow as tf

from tfscale.optimizers import CowClip, FusedAdam, RowWiseAdagrad, factory, large_batch_settings
from tfscale.optimizers.cowclip import clip_factors
from tfscale.optimizers.table_state import per_row_state

ROWS, DIM = 12, 4
IDS = np.array([1, 4, 4, 7, 1, 4], np.int64)  # rows 1 and 4 repeated: summed first
STEPS = 5


def _table():
    return keras.Variable(np.random.default_rng(0).standard_normal((ROWS, DIM)).astype("float32"),
                          name="embeddings")


def _gradient(step):
    values = np.random.default_rng(step + 10).standard_normal((len(IDS), DIM)).astype("float32")
    return values, tf.IndexedSlices(tf.constant(values), tf.constant(IDS),
                                    tf.constant([ROWS, DIM], tf.int64))


def _numpy_rowwise(weights, accumulator, summed, rows, rate, epsilon):
    """FBGEMM's EXACT_ROWWISE_ADAGRAD on `rows` given their summed gradients (float64)."""
    accumulator[rows] += np.mean(summed[rows] ** 2, axis=1)
    weights[rows] -= rate * summed[rows] / (np.sqrt(accumulator[rows]) + epsilon)[:, None]


def _summed(values):
    summed = np.zeros((ROWS, DIM))
    np.add.at(summed, IDS, values.astype(np.float64))
    return summed


def test_equals_fbgemm_rowwise_adagrad_with_repeated_ids_and_table_l2():
    rate, epsilon, l2 = 0.05, 1e-8, 0.01
    table = _table()
    optimizer = RowWiseAdagrad(rate, epsilon=epsilon, table_l2=l2)
    weights = table.numpy().astype(np.float64)
    accumulator = np.zeros(ROWS)
    rows = np.unique(IDS)
    for step in range(STEPS):
        values, gradient = _gradient(step)
        optimizer.apply([gradient], [table])
        summed = _summed(values)
        summed[rows] += 2 * l2 * weights[rows]
        _numpy_rowwise(weights, accumulator, summed, rows, rate, epsilon)
    np.testing.assert_allclose(table.numpy(), weights, rtol=1e-6, atol=1e-7)
    (state,) = per_row_state(optimizer, table)
    assert tuple(state.shape) == (ROWS,) and state.dtype == "float32"  # 4 bytes a row
    np.testing.assert_allclose(state.numpy(), accumulator, rtol=1e-6)
    untouched = np.setdiff1d(np.arange(ROWS), IDS)
    np.testing.assert_array_equal(table.numpy()[untouched], _table().numpy()[untouched])


def test_a_dense_gradient_of_the_table_takes_the_same_update():
    by_row, whole = _table(), _table()
    rows_optimizer, whole_optimizer = RowWiseAdagrad(0.05), RowWiseAdagrad(0.05)
    for step in range(STEPS):
        _, gradient = _gradient(step)
        rows_optimizer.apply([gradient], [by_row])
        whole_optimizer.apply([tf.convert_to_tensor(gradient)], [whole])
    np.testing.assert_allclose(whole.numpy(), by_row.numpy(), rtol=1e-6, atol=1e-7)


def test_under_cowclip_the_clipped_rows_take_the_rowwise_update():
    rate, epsilon, r, zeta, l2 = 0.05, 1e-8, 0.05, 1e-5, 1e-3
    table = _table()
    optimizer = CowClip(RowWiseAdagrad(rate, epsilon=epsilon), FusedAdam(1e-3), r=r, zeta=zeta,
                        l2=l2)
    weights = table.numpy().astype(np.float64)
    accumulator = np.zeros(ROWS)
    rows, counts = np.unique(IDS, return_counts=True)
    clipped = 0
    for step in range(STEPS):
        values, gradient = _gradient(step)
        optimizer.apply([gradient], [table])
        summed = _summed(values)
        summed[rows] += 2 * l2 * weights[rows]
        factors = clip_factors(tf.constant(summed[rows]), tf.constant(weights[rows]),
                               tf.constant(counts, tf.float64), r, zeta).numpy()
        clipped += int(np.sum(factors < 1))
        summed[rows] *= factors[:, None]
        _numpy_rowwise(weights, accumulator, summed, rows, rate, epsilon)
    assert clipped > 0  # r = 0.05 clips: the clip is in the comparison
    np.testing.assert_allclose(table.numpy(), weights, rtol=1e-6, atol=1e-7)


def test_dense_weights_take_keras_adagrad():
    kernel = keras.Variable(np.ones((3, 2), "float32"), name="kernel")
    reference = keras.Variable(np.ones((3, 2), "float32"), name="kernel")
    gradient = tf.constant(np.arange(6, dtype="float32").reshape(3, 2))
    RowWiseAdagrad(0.1, initial_accumulator_value=0.1, epsilon=1e-7).apply([gradient], [kernel])
    keras.optimizers.Adagrad(0.1, initial_accumulator_value=0.1, epsilon=1e-7).apply(
        [gradient], [reference])
    np.testing.assert_allclose(kernel.numpy(), reference.numpy(), rtol=1e-6)


def test_the_launchers_rowwise_adagrad_is_row_wise_tables_and_adam_dense_weights():
    settings = large_batch_settings(8192, "sqrt", "synthetic")
    for update in ("row", "dense"):
        optimizer = factory.build_optimizer(settings, "rowwise_adagrad", warmup_steps=0,
                                            embedding_update=update)
        assert isinstance(optimizer, keras.optimizers.MultiOptimizer), update
        kinds = {type(inner).__name__ for inner in optimizer.optimizers}
        assert kinds == {"RowWiseAdagrad", "FusedAdam"}, (update, kinds)
