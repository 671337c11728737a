"""FusedAdam makes Keras Adam's update with TF's fused kernel, and round-trips through a saved
model."""

import keras
import numpy as np
import tensorflow as tf

from tfscale.optimizers import FusedAdam


def _run(optimizer, steps=10):
    rng = np.random.default_rng(0)
    variables = [keras.Variable(rng.standard_normal((30, 4)).astype("float32")),
                 keras.Variable(rng.standard_normal((4,)).astype("float32"))]

    @tf.function
    def step(gradients):
        optimizer.apply(gradients, variables)

    for _ in range(steps):
        step([tf.constant(rng.standard_normal(v.shape).astype("float32")) for v in variables])
    return [v.numpy() for v in variables]


def test_matches_keras_adam():
    settings = dict(learning_rate=0.01, beta_1=0.8, beta_2=0.99, epsilon=1e-6)
    for fused, reference in zip(_run(FusedAdam(**settings)), _run(keras.optimizers.Adam(**settings))):
        np.testing.assert_allclose(fused, reference, rtol=2e-6, atol=1e-7)


def test_saved_with_the_model(tmp_path):
    inputs = keras.Input((3,))
    model = keras.Model(inputs, keras.layers.Dense(1)(inputs))
    model.compile(FusedAdam(learning_rate=0.003, beta_2=0.95), "mse")
    model.fit(np.ones((8, 3)), np.ones((8, 1)), verbose=0)
    model.save(tmp_path / "m.keras")
    loaded = keras.models.load_model(tmp_path / "m.keras")
    assert isinstance(loaded.optimizer, FusedAdam)
    assert loaded.optimizer.beta_2 == 0.95
    for a, b in zip(model.optimizer.variables, loaded.optimizer.variables):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
