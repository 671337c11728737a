"""Mixed precision and loss scaling (tfscale.training.precision, tfscale.optimizers.loss_scaling):
float16 gradients that underflow without scaling train with it; a NaN batch is skipped with the
weights bitwise unchanged and the scale halved; the wrapped CowClip and CAME see the unscaled
gradients (sparse ones stay sparse); the scaler's state is checkpointed; float32 state under mixed
policies; bf16 DeepFM ends within 0.2% AUC of float32; a run gone non-finite stops with an error."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import models
from tfscale.data.synthetic import SyntheticCTR
from tfscale.errors import NonFiniteTraining
from tfscale.optimizers import CAME, CowClip, FusedAdam
from tfscale.optimizers.loss_scaling import LossScaleOptimizer
from tfscale.training.callbacks import NonFiniteGuard
from tfscale.checkpoints.store import CheckpointStore
from tfscale.training.precision import parse_loss_scale, with_loss_scaling
from tfscale.training.train_step import FunctionalTrainStepModel


def _tiny_regression(precision, optimizer):
    """Dense(8 -> 1) computing in `precision` whose loss is 1e-9 * MSE: float16 gradients of
    about 1e-9 flush to zero (smallest float16 subnormal: 6e-8)."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((8,))
    outputs = keras.layers.Dense(1, dtype=precision)(inputs)
    model = FunctionalTrainStepModel(inputs, keras.layers.Activation("linear", dtype="float32")(
        outputs))
    model.compile(optimizer, lambda y, p: 1e-9 * keras.ops.mean(keras.ops.square(y - p)))
    return model


def test_float16_gradients_that_underflow_train_with_loss_scaling():
    x = np.random.default_rng(0).standard_normal((64, 8)).astype("float32")
    y = x @ np.arange(1, 9, dtype="float32")[:, None]
    moved = {}
    for name, precision, optimizer in [
        ("float32", "float32", keras.optimizers.SGD(1e6)),
        ("float16, no scaling", "mixed_float16", keras.optimizers.SGD(1e6)),
        ("float16, dynamic scaling", "mixed_float16",
         LossScaleOptimizer(keras.optimizers.SGD(1e6))),
    ]:
        model = _tiny_regression(precision, optimizer)
        before = model.layers[1].kernel.numpy().copy()
        model.fit(x, y, batch_size=64, epochs=3, verbose=0)
        moved[name] = model.layers[1].kernel.numpy() - before
    assert np.all(moved["float16, no scaling"] == 0), "the gradients should have underflowed"
    assert np.abs(moved["float32"]).max() > 1e-3
    np.testing.assert_allclose(moved["float16, dynamic scaling"], moved["float32"], rtol=2e-2,
                               atol=1e-4)


def _small_source():
    return SyntheticCTR(seed=0, train_rows=6000, test_rows=2000, vocabulary_scale=0.002)


def _deepfm(precision, optimizer, source):
    keras.utils.set_random_seed(0)
    model = models.build_model("deepfm", source.schema, hidden_units=[32, 32], dtype=precision,
                               l2_embedding=0.0, l2_wide=0.0)
    model.compile(optimizer, keras.losses.BinaryCrossentropy())
    return model


def _cowclip():
    return CowClip(FusedAdam(1e-3), FusedAdam(1e-3), l2=0.0)


def test_nan_batch_is_skipped_weights_unchanged_scale_halved_then_training_continues():
    source = _small_source()
    optimizer = LossScaleOptimizer(_cowclip(), dynamic_growth_steps=1000)
    model = _deepfm("mixed_float16", optimizer, source)
    batches = list(source.train_batches(256, epoch=0).take(4))
    for features, labels in batches[:2]:
        model.train_on_batch(features, labels)
    scale = float(optimizer.dynamic_scale.numpy())
    skipped, steps = int(optimizer.skipped_steps.numpy()), int(optimizer.iterations.numpy())
    before = [v.numpy().copy() for v in model.weights + optimizer.inner_optimizer.variables]

    features, labels = batches[2]
    dense = features["dense"].numpy()
    dense[5, 3] = np.nan
    model.train_on_batch(dict(features, dense=tf.constant(dense)), labels)
    after = [v.numpy() for v in model.weights + optimizer.inner_optimizer.variables]
    for a, b in zip(before, after):
        np.testing.assert_array_equal(a, b)
    assert float(optimizer.dynamic_scale.numpy()) == scale / 2
    assert int(optimizer.skipped_steps.numpy()) == skipped + 1
    assert int(optimizer.iterations.numpy()) == steps  # a skipped step is no optimizer step

    model.train_on_batch(*batches[3])
    assert int(optimizer.iterations.numpy()) == steps + 1
    assert int(optimizer.skipped_in_a_row.numpy()) == 0
    assert not np.array_equal(model.weights[0].numpy(), after[0])


def test_static_scale_skips_a_nan_step_without_changing_the_scale():
    variable = keras.Variable(np.ones((3, 2), "float32"))
    optimizer = LossScaleOptimizer(keras.optimizers.SGD(0.5), initial_scale=8.0, dynamic=False,
                                   dynamic_growth_steps=1)
    optimizer.apply([tf.fill((3, 2), 16.0)], [variable])  # unscaled: 2
    np.testing.assert_array_equal(variable.numpy(), 0.0)
    optimizer.apply([tf.constant([[np.inf, 0], [0, 0], [0, 0]], tf.float32)], [variable])
    np.testing.assert_array_equal(variable.numpy(), 0.0)
    assert float(optimizer.dynamic_scale.numpy()) == 8.0  # neither grown nor halved
    assert int(optimizer.skipped_steps.numpy()) == 1


def _sparse_gradient(rng, rows, width, ids):
    return tf.IndexedSlices(tf.constant(rng.standard_normal((len(ids), width)), tf.float32),
                            tf.constant(ids, tf.int64), tf.constant([rows, width], tf.int64))


@pytest.mark.parametrize("make_optimizer", [
    lambda: CAME(learning_rate=1e-2),
    lambda: CowClip(FusedAdam(1e-2), FusedAdam(1e-2), l2=1e-4, r=1.0),
], ids=["came", "cowclip"])
def test_wrapped_optimizer_sees_the_unscaled_gradients(make_optimizer):
    """LossScaleOptimizer(opt) on gradients * scale ends bitwise where opt ends on the gradients
    (the scale is a power of two); CowClip receives IndexedSlices, which it requires."""
    rng = np.random.default_rng(0)
    initial_table = rng.standard_normal((50, 4)).astype("float32") * 0.01
    initial_kernel = rng.standard_normal((4, 3)).astype("float32")
    runs = []
    for scaled in (False, True):
        table = keras.Variable(initial_table, name="embeddings")
        kernel = keras.Variable(initial_kernel, name="kernel")
        optimizer = make_optimizer()
        if scaled:
            optimizer = LossScaleOptimizer(optimizer, initial_scale=1024.0)
        step_rng = np.random.default_rng(1)
        for _ in range(4):
            sparse = _sparse_gradient(step_rng, 50, 4, [3, 7, 3, 49, 0])
            dense = tf.constant(step_rng.standard_normal((4, 3)), tf.float32)
            if scaled:
                sparse = tf.IndexedSlices(sparse.values * 1024.0, sparse.indices,
                                          sparse.dense_shape)
                dense = dense * 1024.0
            optimizer.apply([sparse, dense], [table, kernel])
        runs.append((table.numpy(), kernel.numpy()))
    for plain, scaled in zip(*runs):
        np.testing.assert_array_equal(plain, scaled)
    assert not np.array_equal(runs[0][0], initial_table)


def test_scaler_state_is_checkpointed_and_restored(tmp_path):
    def scaled_model():
        optimizer = LossScaleOptimizer(keras.optimizers.Adam(1e-2), dynamic_growth_steps=3)
        return _tiny_regression("mixed_float16", optimizer)

    x = np.random.default_rng(0).standard_normal((64, 8)).astype("float32")
    model = scaled_model()
    model.fit(x, x[:, :1], batch_size=8, epochs=1, verbose=0)  # 8 steps: the scale grew twice
    optimizer = model.optimizer
    model.train_on_batch(np.full((8, 8), np.nan, "float32"), x[:8, :1])  # one skipped step
    assert float(optimizer.dynamic_scale.numpy()) == 2.0 ** 16
    CheckpointStore(str(tmp_path), model=model, optimizer=optimizer).save(9, {"epoch": 0})

    other = scaled_model()
    other.optimizer.build(other.trainable_variables)
    CheckpointStore(str(tmp_path), model=other, optimizer=other.optimizer).restore_latest()
    for name in ("dynamic_scale", "step_counter", "skipped_steps", "skipped_in_a_row"):
        assert getattr(other.optimizer, name).numpy() == getattr(optimizer, name).numpy(), name
    assert int(other.optimizer.skipped_steps.numpy()) == 1


def test_building_the_scaler_twice_adds_no_variables():
    """A second build (the launcher describes the tables before training builds the optimizer)
    once gave rank 0 a second scale and step counter, and its broadcast waited for rank 1."""
    variables = [keras.Variable(np.ones((4, 2), "float32"))]
    optimizer = LossScaleOptimizer(FusedAdam())
    optimizer.build(variables)
    first = [v.path for v in optimizer.variables]
    optimizer.build(variables)
    assert [v.path for v in optimizer.variables] == first


def test_mixed_policies_keep_tables_outputs_and_optimizer_state_float32():
    source = _small_source()
    for precision in ("mixed_float16", "mixed_bfloat16"):
        model = _deepfm(precision, with_loss_scaling(CAME(1e-3), "dynamic"), source)
        features, labels = next(iter(source.train_batches(64, epoch=0)))
        model.train_on_batch(features, labels)
        assert model(features).dtype == "float32"
        tables = [v for v in model.weights if v.path.endswith("embeddings")]
        assert len(tables) == 2 and {v.dtype for v in tables} == {"float32"}
        assert {v.dtype for v in model.optimizer.variables
                if v.dtype not in ("int64", "int32")} == {"float32"}
        # Compute really is in the policy's half type.
        assert model.dnn.compute_dtype == precision.split("_")[1]


def test_bfloat16_deepfm_ends_within_0_2_percent_auc_of_float32():
    from tfscale.training.run import TrainingConfig, train

    source = SyntheticCTR(seed=0, train_rows=60000, test_rows=20000, vocabulary_scale=0.002)
    aucs = {}
    for precision in ("float32", "mixed_bfloat16"):
        model = _deepfm(precision, FusedAdam(2e-3), source)
        result = train(model, source, TrainingConfig(batch_size=512, epochs=2,
                                                     log_every_steps=10 ** 6),
                       print_fn=lambda _: None)
        aucs[precision] = result.final["auc"]
    assert aucs["float32"] > 0.62, aucs  # it learned (0.5: nothing)
    assert abs(aucs["mixed_bfloat16"] - aucs["float32"]) < 0.002, aucs


def test_non_finite_training_stops_with_an_error():
    x = np.ones((16, 8), "float32")
    y = np.full((16, 1), np.nan, "float32")
    unscaled = _tiny_regression("float32", keras.optimizers.SGD(0.1))
    with pytest.raises(NonFiniteTraining, match="no loss scaler"):
        unscaled.fit(x, y, batch_size=8, verbose=0, callbacks=[NonFiniteGuard()])
    scaled = _tiny_regression("mixed_float16", LossScaleOptimizer(keras.optimizers.SGD(0.1)))
    with pytest.raises(NonFiniteTraining, match="last 3 steps"):
        scaled.fit(x, y, batch_size=8, epochs=2, verbose=0,
                   callbacks=[NonFiniteGuard(max_skipped_in_a_row=3)])


def test_loss_scale_flag_values():
    assert parse_loss_scale(None, "mixed_float16") == "dynamic"
    assert parse_loss_scale(None, "mixed_bfloat16") is None
    assert parse_loss_scale("none", "mixed_float16") is None
    assert parse_loss_scale("128", "float32") == 128.0
    for bad in ("-1", "0", "inf", "big"):
        with pytest.raises(ValueError):
            parse_loss_scale(bad, "mixed_float16")
