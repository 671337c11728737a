"""CowClip against an independent NumPy restatement of the official step (docs/cowclip.md), in both
modes, and as a Keras optimizer (routing, statistics, serialisation, training a model)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfscale.optimizers import CowClip, FusedAdam, RowSparseAdam
from tfscale.row_gradients import sum_duplicate_rows
from tfscale.training.train_step import FunctionalTrainStepModel
from tests.row_gaps import train_with_gaps

VOCAB, DIM = 12, 4
LR, BETA_1, BETA_2, EPSILON = 1e-2, 0.9, 0.999, 1e-7


# ----- the NumPy restatement of docs/cowclip.md

def numpy_clip(gradient, weights, counts, r, zeta):
    floor = r * np.sqrt(weights.shape[1]) * zeta
    threshold = r * counts * np.maximum(np.linalg.norm(weights, axis=1), floor)
    norm = np.linalg.norm(gradient, axis=1)
    factor = np.where(norm > threshold, threshold / np.where(norm > 0, norm, 1), 1.0)
    return gradient * factor[:, None]


def numpy_faithful_step(weights, m, v, step, occurrence_ids, occurrence_grads, r, zeta, l2):
    """One official CowClip + Adam step on a whole table (every row, every step)."""
    gradient = np.zeros_like(weights)
    np.add.at(gradient, occurrence_ids, occurrence_grads)
    gradient += 2 * l2 * weights
    counts = np.ones(len(weights))
    ids, id_counts = np.unique(occurrence_ids, return_counts=True)
    counts[ids] = id_counts
    gradient = numpy_clip(gradient, weights, counts, r, zeta)
    m = BETA_1 * m + (1 - BETA_1) * gradient
    v = BETA_2 * v + (1 - BETA_2) * gradient ** 2
    alpha = LR * np.sqrt(1 - BETA_2 ** step) / (1 - BETA_1 ** step)
    return weights - alpha * m / (np.sqrt(v) + EPSILON), m, v


def numpy_scalable_step(weights, m, v, step, occurrence_ids, occurrence_grads, r, zeta, l2):
    """The same restricted to the rows in the batch (lazy Adam on those rows only)."""
    ids, position, counts = np.unique(occurrence_ids, return_inverse=True, return_counts=True)
    gradient = np.zeros((len(ids), weights.shape[1]))
    np.add.at(gradient, position, occurrence_grads)
    gradient += 2 * l2 * weights[ids]
    gradient = numpy_clip(gradient, weights[ids], counts, r, zeta)
    weights, m, v = weights.copy(), m.copy(), v.copy()
    m[ids] = BETA_1 * m[ids] + (1 - BETA_1) * gradient
    v[ids] = BETA_2 * v[ids] + (1 - BETA_2) * gradient ** 2
    alpha = LR * np.sqrt(1 - BETA_2 ** step) / (1 - BETA_1 ** step)
    weights[ids] -= alpha * m[ids] / (np.sqrt(v[ids]) + EPSILON)
    return weights, m, v


# ----- driving CowClip on one table and one dense weight

def initial_table():
    rng = np.random.default_rng(7)
    weights = rng.normal(0, 0.05, (VOCAB, DIM))
    weights[3] = 0.0      # under the floor: the threshold uses r*sqrt(d)*zeta
    weights[5] *= 1e-4    # also under the floor
    return weights


def batches(steps):
    """Occurrence ids (with repeats; ids 10 and 11 never occur) and their gradient rows, some
    large enough to be clipped and some small."""
    rng = np.random.default_rng(11)
    for _ in range(steps):
        ids = rng.choice([0, 0, 0, 1, 2, 3, 3, 4, 5, 6, 7, 8, 9], size=9)
        grads = rng.normal(0, 1, (9, DIM)) * rng.choice([1e-3, 1.0], size=(9, 1))
        yield ids, grads


def run_cowclip(mode, r, zeta, l2, steps=5):
    embedding = FusedAdam(LR) if mode == "faithful" else RowSparseAdam(LR, catch_up=False)
    optimizer = CowClip(embedding, FusedAdam(LR), r=r, zeta=zeta, l2=l2, mode=mode)
    table = keras.Variable(initial_table().astype("float32"), name="embeddings")
    dense = keras.Variable(np.ones((3,), "float32"), name="kernel")

    @tf.function
    def step(ids, grads):
        slices = tf.IndexedSlices(grads, ids, dense_shape=tf.constant([VOCAB, DIM], tf.int64))
        optimizer.apply([slices, tf.ones([3])], [table, dense])

    for ids, grads in batches(steps):
        step(tf.constant(ids, tf.int64), tf.constant(grads, tf.float32))
    return optimizer, table.numpy(), dense.numpy()


@pytest.mark.parametrize("mode, numpy_step", [("faithful", numpy_faithful_step),
                                              ("scalable", numpy_scalable_step)])
@pytest.mark.parametrize("l2", [0.0, 1e-2])
def test_matches_numpy_restatement(mode, numpy_step, l2):
    r, zeta = 0.5, 0.05  # floor = 0.5 * 2 * 0.05 = 0.05: rows 3 and 5 sit under it
    _, table, _ = run_cowclip(mode, r, zeta, l2)
    weights, m, v = initial_table(), np.zeros((VOCAB, DIM)), np.zeros((VOCAB, DIM))
    for step, (ids, grads) in enumerate(batches(5), start=1):
        weights, m, v = numpy_step(weights, m, v, step, ids, grads.astype(np.float32), r, zeta, l2)
    np.testing.assert_allclose(table, weights, rtol=1e-6, atol=1e-7)
    absent_rows = initial_table()[10:]
    if mode == "scalable" or l2 == 0:
        np.testing.assert_array_equal(table[10:], absent_rows.astype(np.float32))
    else:  # the official update moves absent rows through L2
        assert not np.allclose(table[10:], absent_rows)


def test_clip_is_active_in_these_cases():
    """The restatement test would be vacuous if nothing were clipped: some rows are, some not."""
    optimizer, _, _ = run_cowclip("faithful", r=0.5, zeta=0.05, l2=0.0, steps=1)
    fraction = optimizer.summary_scalars()["cowclip/embeddings/clipped_fraction"]
    assert 0.0 < fraction < 1.0


def test_dense_weights_use_the_dense_optimizer_unclipped():
    _, _, dense = run_cowclip("faithful", r=0.5, zeta=0.05, l2=0.0, steps=5)
    reference = keras.Variable(np.ones((3,), "float32"))
    adam = FusedAdam(LR)
    for _ in range(5):
        adam.apply([tf.ones([3])], [reference])
    np.testing.assert_allclose(dense, reference.numpy(), rtol=1e-6)


def test_sum_duplicate_rows_sums_and_counts():
    slices = tf.IndexedSlices(tf.constant([[1.0], [2.0], [4.0]]), tf.constant([5, 2, 5]))
    ids, rows, counts = sum_duplicate_rows(slices)
    assert ids.numpy().tolist() == [5, 2]
    assert rows.numpy().ravel().tolist() == [5.0, 2.0]
    assert counts.numpy().tolist() == [2.0, 1.0]


@pytest.mark.parametrize("arguments, message", [
    (dict(r=0.0), "`r=0.0`: give a finite number above 0"),
    (dict(zeta=float("nan")), "`zeta=nan`: give a finite number of 0 or more"),
    (dict(l2=-1e-5), "`l2=-1e-05`: give a finite number of 0 or more"),
    (dict(r=0.5, l2=0.3), "`l2=0.3` with `r=0.5`: CowClip needs 2\\*l2 <= r"),
    (dict(mode="fast"), "`mode='fast'`: give one of faithful, scalable"),
    (dict(embedding_optimizer=RowSparseAdam(table_l2=1e-5)),
     "`embedding_optimizer` has table_l2=1e-05, but CowClip adds the tables' L2 itself"),
    (dict(embedding_optimizer=RowSparseAdam(), l2=1e-5),
     "catch_up_l2=0.0 but CowClip's `l2=1e-05`: give RowSparseAdam\\(catch_up_l2=1e-05\\)"),
])
def test_bad_arguments_are_named(arguments, message):
    with pytest.raises(ValueError, match=message):
        CowClip(**arguments)


def _train_cowclip_with_gaps(embedding_optimizer, mode, l2):
    optimizer = CowClip(embedding_optimizer, FusedAdam(LR), r=1.0, zeta=1e-5, l2=l2, mode=mode)
    return optimizer, train_with_gaps(optimizer, DIM)


def test_scalable_mode_catches_absent_rows_up_with_cowclips_l2():
    """Rows 1 and 2 are absent for stretches (tests.row_gaps): the scalable mode's default
    RowSparseAdam catches them up with CowClip's L2 to within a quarter of lazy Adam's distance
    from the faithful update; after the whole-table catch-up, row 3 (never in a batch) has
    followed the faithful update's L2 pull toward zero."""
    l2 = 0.05
    faithful = _train_cowclip_with_gaps(FusedAdam(LR), "faithful", l2)[1].numpy()
    lazy = _train_cowclip_with_gaps(RowSparseAdam(LR, catch_up=False), "scalable", l2)[1].numpy()
    optimizer, table = _train_cowclip_with_gaps(RowSparseAdam(LR, catch_up_l2=l2), "scalable", l2)
    caught_up = table.numpy()
    for row in (1, 2):
        caught_up_error = np.abs(caught_up[row] - faithful[row]).max()
        assert caught_up_error < 0.25 * np.abs(lazy[row] - faithful[row]).max(), row
    optimizer.embedding_optimizer.catch_up_every_row()
    assert np.abs(table.numpy()[3]).max() < 2 * np.abs(faithful[3]).max() + LR
    assert np.abs(lazy[3]).max() > 0.02  # where it started


def test_scalable_default_catches_up_with_its_l2():
    optimizer = CowClip(l2=1e-5)
    assert optimizer.embedding_optimizer.catch_up
    assert optimizer.embedding_optimizer.catch_up_l2 == 1e-5


def test_dense_gradient_for_a_table_is_a_clear_error():
    optimizer = CowClip()
    table = keras.Variable(np.ones((4, 3), "float32"), name="embeddings")
    with pytest.raises(ValueError, match="IndexedSlices"):
        optimizer.apply([tf.ones([4, 3])], [table])


def _tiny_model():
    keras.utils.set_random_seed(2)
    ids = keras.Input((3,), dtype="int64")
    deep = keras.layers.Embedding(20, 4, name="deep")(ids)
    wide = keras.layers.Embedding(20, 1, name="wide")(ids)
    logit = keras.layers.Dense(1, name="logit")(keras.layers.Flatten()(deep)) + keras.ops.sum(wide, axis=1)
    return FunctionalTrainStepModel(ids, keras.layers.Activation("sigmoid")(logit))


def test_routes_and_clips_tables_found_by_itself():
    model = _tiny_model()
    optimizer = CowClip(l2=1e-4)
    model.compile(optimizer, "binary_crossentropy")
    optimizer.build(model.trainable_variables)
    routed = {v.path: optimizer._optimizer_for(v) is optimizer.embedding_optimizer
              for v in model.trainable_variables}
    assert routed == {"deep/embeddings": True, "wide/embeddings": True,
                      "logit/kernel": False, "logit/bias": False}
    assert [optimizer.is_clipped_table(v) for v in model.trainable_variables[:2]] == [True, False]
    override = CowClip(embedding_tables=["deep/embeddings"])
    assert [override.is_embedding_table(v) for v in model.trainable_variables[:2]] == [True, False]


def test_trains_saves_and_reloads_with_state(tmp_path):
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 20, (256, 3)), (rng.random((256, 1)) < 0.4).astype("float32")
    model = _tiny_model()
    model.compile(CowClip(FusedAdam(1e-2), FusedAdam(1e-2), zeta=1e-3, l2=1e-4), "binary_crossentropy")
    losses = model.fit(x, y, batch_size=32, epochs=5, verbose=0).history["loss"]
    assert losses[-1] < losses[0]
    model.save(tmp_path / "m.keras")
    loaded = keras.models.load_model(tmp_path / "m.keras")
    assert isinstance(loaded.optimizer, CowClip)
    assert (loaded.optimizer.zeta, loaded.optimizer.l2, loaded.optimizer.mode) == (1e-3, 1e-4, "faithful")
    for a, b in zip(model.optimizer.variables, loaded.optimizer.variables):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    model.fit(x, y, batch_size=32, epochs=1, verbose=0, shuffle=False)
    loaded.fit(x, y, batch_size=32, epochs=1, verbose=0, shuffle=False)
    for a, b in zip(model.get_weights(), loaded.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-8)
