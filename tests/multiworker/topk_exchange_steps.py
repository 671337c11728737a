"""Run under horovodrun or tfscale.run (any number of ranks): STEPS steps of the top-k exchanges (tfscale.exchanges.topk)
("topk" and "gtopk", an embedding table by rows and a dense kernel element-wise) on random
per-rank gradients, checking after every step that every rank applies the same gradient, that
error feedback conserves the gradients (summed over ranks: P * applied + change in residuals =
gradients), that the applied gradient and this rank's new residual are those of the NumPy
statement (tests/gtopk_reference.py, every rank's gradients regenerated from their seeds, the
residuals non-zero from step 1 on), and that an inf on one rank leaves every residual unchanged
and the applied gradient NaN on every rank. Exits non-zero on the first failure."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tests import gtopk_reference  # noqa: E402
from tfscale import distributed, exchanges  # noqa: E402

STEPS = 6
INF_STEP = 4
ROWS, WIDTH = 40, 4
DENSITY = 0.1


def gradients(rank, step):
    rng = np.random.default_rng(1000 * step + rank)
    ids = rng.integers(0, ROWS, size=12)  # duplicates: one row per occurrence
    rows = rng.normal(size=(12, WIDTH)).astype(np.float32)
    kernel = rng.normal(size=(5, 3)).astype(np.float32)
    if step == INF_STEP and rank == 1:
        kernel[0, 0] = np.inf
    return [tf.IndexedSlices(tf.constant(rows), tf.constant(ids, tf.int64),
                             tf.constant([ROWS, WIDTH], tf.int64)), tf.constant(kernel)]


def dense(gradient):
    return tf.convert_to_tensor(gradient)


def expected_step(method, step, reference_residuals, num_ranks):
    """Per variable, (applied, new residuals of every rank) by the NumPy statement, from every
    rank's gradients of `step`; updates `reference_residuals` in place."""
    everyone = [[dense(g).numpy() for g in gradients(rank, step)] for rank in range(num_ranks)]
    expected = []
    for i, by_rows in enumerate((True, False)):  # the table by rows, the kernel element-wise
        applied, residuals = gtopk_reference.error_feedback_step(
            reference_residuals[i], [g[i] for g in everyone], DENSITY, method, by_rows)
        reference_residuals[i] = residuals
        expected.append(applied)
    return expected


def run(method, engine):
    table = keras.Variable(np.zeros((ROWS, WIDTH), np.float32), name="embeddings")
    kernel = keras.Variable(np.zeros((5, 3), np.float32), name="kernel")
    variables = [table, kernel]
    exchange = exchanges.EXCHANGES[method](density=DENSITY, dense_gradients=True)
    exchange.state.build(variables)
    residuals = [exchange.residuals[v.path] for v in variables]
    step_function = tf.function(lambda g, step: exchange.sparsify(g, variables, step))
    reference_residuals = [[np.zeros(v.shape) for _ in range(engine.size)] for v in variables]
    for step in range(STEPS):
        grads = gradients(engine.rank, step)
        before = [r.numpy() for r in residuals]
        applied, sent, _ = step_function(grads, tf.constant(step, tf.int64))
        applied = [dense(a).numpy() for a in applied]
        after = [r.numpy() for r in residuals]
        label = f"{method} rank {engine.rank} step {step}"
        for i, value in enumerate(applied):
            everyone = engine.allgather(tf.constant(value[None]), f"{method}_{step}_{i}").numpy()
            for other in everyone:
                np.testing.assert_array_equal(other, value, err_msg=label)
        if step == INF_STEP:
            assert all(np.isnan(a).any() for a in applied), label  # a loss scaler skips
            for b, a in zip(before, after):
                np.testing.assert_array_equal(a, b, err_msg=label)
            continue
        assert float(sent) > 0, label
        expected = expected_step(method, step, reference_residuals, engine.size)
        for i, (a, r) in enumerate(zip(applied, after)):
            np.testing.assert_allclose(a, expected[i], rtol=1e-5, atol=1e-6, err_msg=label)
            np.testing.assert_allclose(r, reference_residuals[i][engine.rank], rtol=1e-5,
                                       atol=1e-6, err_msg=label)
        if step > 0:  # error feedback is exercised: rows carried over from earlier steps
            assert np.count_nonzero(before[0]), label
        for i, (g, a, b, r) in enumerate(zip(grads, applied, before, after)):
            summed_gradient = engine.allreduce(dense(g), "sum", f"g_{method}_{step}_{i}")
            summed_change = engine.allreduce(tf.constant(r - b), "sum",
                                             f"r_{method}_{step}_{i}")
            np.testing.assert_allclose(engine.size * a + summed_change.numpy(),
                                       summed_gradient.numpy(), rtol=1e-5, atol=1e-5,
                                       err_msg=label)
        kept = np.count_nonzero(np.abs(applied[0]).sum(axis=1))
        if method == "gtopk":
            assert kept <= int(np.ceil(DENSITY * ROWS)), label


def main():
    distributed.init()
    engine = distributed.engine()
    for method in ("topk", "gtopk"):
        run(method, engine)
    print(f"rank {engine.rank} of {engine.size}: exchange steps match the NumPy error feedback and "
          "conserve the gradients", flush=True)


if __name__ == "__main__":
    main()
