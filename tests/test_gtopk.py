"""The top-k embedding gradient exchanges (tfscale.distributed.topk, sparse_exchange): the gTop-k
butterfly and the allgather top-k against a NumPy statement of docs/gtopk.md under horovodrun with
3 ranks (folded onto 2) and 4 (two butterfly rounds, the first of them 2 ranks' whole butterfly),
error feedback conserving the gradients with every rank applying the same gradient; and, in one
process, the loss-scale invariance, the refusals and the single-rank collective."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import models
from tests import grouped_launches, gtopk_reference
from tfscale import distributed, exchanges
from tfscale.data.synthetic import SyntheticCTR
from tfscale.errors import UserError
from tfscale.optimizers import CowClip, FusedAdam


RANKS = (3, 4)
COLLECTIVES = {num_ranks: grouped_launches.job(
    f"gtopk-collectives-P{num_ranks}", num_ranks, "tests.multiworker.gtopk_collective",
    engines=grouped_launches.ENGINES) for num_ranks in RANKS}
EXCHANGE_STEPS = {num_ranks: grouped_launches.job(
    f"topk-exchange-steps-P{num_ranks}", num_ranks, "tests.multiworker.topk_exchange_steps",
    engines=grouped_launches.ENGINES) for num_ranks in RANKS}


@pytest.mark.parametrize("engine", grouped_launches.ENGINES)
@pytest.mark.parametrize("num_ranks", RANKS)
def test_collectives_on_each_engine(launched_jobs, num_ranks, engine):
    result = launched_jobs[grouped_launches.on_engine(COLLECTIVES[num_ranks], engine)]
    assert result.returncode == 0, result.output
    for rank in range(num_ranks):
        assert f"rank {rank} of {num_ranks}: 36 cases match the NumPy butterfly" in result.output


@pytest.mark.parametrize("engine", grouped_launches.ENGINES)
@pytest.mark.parametrize("num_ranks", RANKS)
def test_error_feedback_on_each_engine(launched_jobs, num_ranks, engine):
    result = launched_jobs[grouped_launches.on_engine(EXCHANGE_STEPS[num_ranks], engine)]
    assert result.returncode == 0, result.output
    for rank in range(num_ranks):
        assert (f"rank {rank} of {num_ranks}: exchange steps match the NumPy error feedback and "
                "conserve the gradients") in result.output


def test_one_rank_gtopk_is_its_own_top_k():
    rng = np.random.default_rng(0)
    indices = rng.choice(1000, size=30, replace=False).astype(np.int64)
    values = rng.integers(-3, 4, size=(30, 2)).astype(np.float32)
    got = distributed.gtopk_allreduce(indices, values, 8, name="one_rank")
    want_indices, want_values, (want_mask,) = gtopk_reference.gtopk([(indices, values)], 8)
    np.testing.assert_array_equal(got.indices.numpy(), want_indices)
    np.testing.assert_array_equal(got.values.numpy(), want_values)
    np.testing.assert_array_equal(got.mask.numpy(), want_mask)
    assert int(got.mask.numpy().sum()) == 8 and float(got.bytes_sent) == 0.0


def _table_and_gradient(seed):
    rng = np.random.default_rng(seed)
    table = keras.Variable(np.zeros((50, 4), np.float32), name="embeddings")
    ids = rng.integers(0, 50, size=20)
    gradient = tf.IndexedSlices(tf.constant(rng.normal(size=(20, 4)).astype(np.float32)),
                                tf.constant(ids, tf.int64), tf.constant([50, 4], tf.int64))
    return table, gradient


def test_a_loss_scaled_gradient_selects_and_applies_the_same_rows():
    table, gradient = _table_and_gradient(0)
    plain = exchanges.GTopKExchange(density=0.1)
    scaled = exchanges.GTopKExchange(density=0.1)
    scale = 1024.0
    scaled_gradient = tf.IndexedSlices(gradient.values * scale, gradient.indices,
                                       gradient.dense_shape)
    for step in range(3):  # the residuals carry over between steps
        applied, _, _ = plain.sparsify([gradient], [table], step)
        applied_scaled, _, _ = scaled.sparsify([scaled_gradient], [table], step,
                                               scale=tf.constant(scale))
        np.testing.assert_array_equal(tf.convert_to_tensor(applied_scaled[0]).numpy(),
                                      scale * tf.convert_to_tensor(applied[0]).numpy())
        np.testing.assert_array_equal(plain.residuals[table.path].numpy(),
                                      scaled.residuals[table.path].numpy())
    assert len(applied[0].indices) == 5  # ceil(0.1 * 50) rows


@pytest.mark.parametrize("method", ["topk", "gtopk"])
def test_one_process_steps_match_the_numpy_error_feedback(method):
    """Selection from residual + gradient, the applied gradient and the new residual, over steps
    whose residuals are non-zero."""
    table = keras.Variable(np.zeros((50, 4), np.float32), name="embeddings")
    kernel = keras.Variable(np.zeros((6, 3), np.float32), name="kernel")
    exchange = exchanges.EXCHANGES[method](density=0.1, dense_gradients=True)
    residuals = [np.zeros((50, 4)), np.zeros((6, 3))]
    for step in range(4):
        table_gradient = _table_and_gradient(step)[1]
        kernel_gradient = np.random.default_rng(100 + step).normal(size=(6, 3)).astype(np.float32)
        applied, _, _ = exchange.sparsify([table_gradient, tf.constant(kernel_gradient)],
                                          [table, kernel], step)
        for i, (gradient, by_rows) in enumerate(((table_gradient, True),
                                                 (kernel_gradient, False))):
            if step:
                assert np.count_nonzero(residuals[i]), step
            want, (residuals[i],) = gtopk_reference.error_feedback_step(
                [residuals[i]], [tf.convert_to_tensor(gradient).numpy()], 0.1, method, by_rows)
            np.testing.assert_allclose(tf.convert_to_tensor(applied[i]).numpy(), want,
                                       rtol=1e-6, atol=1e-7)
            variable = (table, kernel)[i]
            np.testing.assert_allclose(exchange.residuals[variable.path].numpy(), residuals[i],
                                       rtol=1e-6, atol=1e-7)


def test_density_one_trains_as_the_plain_exchange():
    source = SyntheticCTR(seed=0, train_rows=768, test_rows=256, vocabulary_scale=0.002)
    features, labels = next(iter(source.train_batches(256)))
    trained = []
    for exchange in ("allgather", exchanges.GTopKExchange(density=1.0)):
        keras.utils.set_random_seed(0)
        model = models.build_model("deepfm", source.schema, hidden_units=[8])
        model.build()
        model.compile(optimizer=FusedAdam(1e-2), loss="binary_crossentropy",
                      embedding_exchange=exchange)
        initial = [v.numpy() for v in model.trainable_variables]
        for _ in range(3):
            model.train_on_batch(features, labels)
        trained.append([v.numpy() for v in model.trainable_variables])
    plain, topk = trained
    assert len(plain) > 5 and all(not np.array_equal(a, b) for a, b in zip(initial, plain))
    for a, b in zip(plain, topk):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("dense_gradients, megabytes", [(False, "4.4"), (True, "4.8")])
def test_the_residuals_line_states_the_rows_and_bytes_each_rank_keeps(dense_gradients,
                                                                       megabytes):
    """The start-up line's rows are the tables' (deep and wide), its megabytes those of the
    residuals the exchange then builds (the dense variables' too with dense_gradients)."""
    with keras.name_scope("deep_embedding"):
        deep = keras.Variable(np.zeros((100_000, 10), np.float32), name="embeddings")
    with keras.name_scope("wide_embedding"):
        wide = keras.Variable(np.zeros((100_000, 1), np.float32), name="embeddings")
    kernel = keras.Variable(np.zeros((1000, 100), np.float32), name="kernel")
    exchange = exchanges.GTopKExchange(dense_gradients=dense_gradients)
    line = exchange.describe_residuals([deep, wide, kernel])
    assert line == (f"gtopk error-feedback residuals: 200,000 table rows, {megabytes} MB float32 "
                    "per rank, every row passed over each step")
    exchange.sparsify([tf.zeros(v.shape) for v in (deep, wide, kernel)], [deep, wide, kernel], 0)
    built = sum(r.numpy().nbytes for r in exchange.residuals.values())
    assert f"{built / 1e6:,.1f}" == megabytes


def test_density_warmup_keeps_more_rows_first():
    table, gradient = _table_and_gradient(1)
    exchange = exchanges.GTopKExchange(density=0.04, warmup_density=0.2, warmup_steps=1)
    first, _, _ = exchange.sparsify([gradient], [table], tf.constant(0))
    second, _, _ = exchange.sparsify([gradient], [table], tf.constant(1))
    assert (len(first[0].indices), len(second[0].indices)) == (10, 2)


@pytest.mark.parametrize("arguments, message", [
    (dict(density=0.0), r"`density=0.0`: give a fraction in \(0, 1\]"),
    (dict(density=0.01, warmup_density=2.0, warmup_steps=5), "`warmup_density=2.0`: give"),
    (dict(warmup_density=0.1, warmup_steps=-1), "`warmup_steps=-1`: give"),
])
def test_bad_settings_are_refused(arguments, message):
    with pytest.raises(ValueError, match=message):
        exchanges.GTopKExchange(**arguments)


def test_unknown_exchange_names_the_argument_and_the_choices():
    with pytest.raises(ValueError, match="`embedding_exchange='sparse'`: give one of allgather, "
                                         "dense, topk, gtopk"):
        exchanges.get("sparse")


def test_gtopk_is_refused_with_cowclip():
    source = SyntheticCTR(seed=0, train_rows=256, test_rows=256, vocabulary_scale=0.002)
    model = models.build_model("deepfm", source.schema, hidden_units=[8])
    optimizer = CowClip(FusedAdam(name="embedding"), FusedAdam(name="dense"))
    with pytest.raises(UserError, match=r"`embedding_exchange=gtopk` cannot be used with "
                                        r"CowClip"):
        model.compile(optimizer=optimizer, loss="binary_crossentropy", embedding_exchange="gtopk")
