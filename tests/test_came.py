"""CAME's contract (docs/came.md) beyond reference parity: the worked examples, factored state, float32
state under mixed precision, weight-decay exclusion, IndexedSlices, serialization, resuming from
a saved model, and the optimizer-memory accounting."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfscale.optimizers.came import CAME
from tfscale.optimizers.memory import factored_minimum_bytes, optimizer_state_bytes


def _one_step(initial, gradient, **kwargs):
    variable = keras.Variable(np.asarray(initial, "float32"))
    optimizer = CAME(**kwargs)
    optimizer.apply([tf.constant(gradient, tf.float32)], [variable])
    return variable, optimizer


def test_worked_examples():
    vector, _ = _one_step([1, 2, 3, 4], [1, 6, 7, 2], learning_rate=0.5)
    np.testing.assert_allclose(vector.numpy(), [0.95, 1.95, 2.95, 3.95], rtol=1e-6)
    matrix, _ = _one_step([[1, 2], [3, 4]], [[1, 6], [7, 2]], learning_rate=0.5)
    np.testing.assert_allclose(matrix.numpy(), [[-0.26296, -5.21912], [-5.15960, 1.77902]],
                               atol=1e-5)


def test_factored_state_shapes():
    variables = [keras.Variable(np.zeros(shape, "float32"), name=name)
                 for shape, name in [((2, 5, 3), "tensor"), ((5, 3), "matrix"), ((4,), "vector"),
                                     ((), "scalar")]]
    optimizer = CAME()
    optimizer.build(variables)
    slots = {v.name: tuple(v.shape) for v in optimizer.variables}
    assert slots == {
        "iteration": (), "learning_rate": (),
        "tensor_momentum": (2, 5, 3), "tensor_row": (2, 5), "tensor_column": (2, 3),
        "tensor_instability_row": (2, 5), "tensor_instability_column": (2, 3),
        "matrix_momentum": (5, 3), "matrix_row": (5,), "matrix_column": (3,),
        "matrix_instability_row": (5,), "matrix_instability_column": (3,),
        "vector_momentum": (4,), "vector_velocity": (4,),
        "scalar_momentum": (), "scalar_velocity": (),
    }


def test_state_is_float32_under_mixed_precision():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, dtype="mixed_bfloat16"),
                              keras.layers.Dense(1, dtype="mixed_bfloat16")])
    model.compile(CAME(learning_rate=1e-3), "mse")
    model.fit(np.ones((8, 3)), np.ones((8, 1)), verbose=0)
    assert {v.dtype for v in model.optimizer.variables if v.name != "iteration"} == {"float32"}
    # A bfloat16 variable: float32 state and math (bfloat16 would round the statistics).
    variable = keras.Variable(np.array([1, 2, 3, 4]), dtype="bfloat16")
    optimizer = CAME(learning_rate=0.5)
    optimizer.apply([tf.constant([1, 6, 7, 2], tf.bfloat16)], [variable])
    assert {v.dtype for v in optimizer.variables if v.name != "iteration"} == {"float32"}
    expected = np.array([0.95, 1.95, 2.95, 3.95], "float32").astype(variable.numpy().dtype)
    np.testing.assert_array_equal(variable.numpy(), expected)


def test_weight_decay_is_decoupled_and_respects_exclusions():
    kernel = keras.Variable(np.full((3, 2), 2.0, "float32"), name="kernel")
    bias = keras.Variable(np.full((2,), 2.0, "float32"), name="bias")
    optimizer = CAME(learning_rate=0.5, weight_decay=0.1)
    optimizer.exclude_from_weight_decay(var_names=["bias"])
    # A zero gradient makes CAME's own step exactly zero, leaving only the decay.
    optimizer.apply([tf.zeros((3, 2)), tf.zeros((2,))], [kernel, bias])
    np.testing.assert_allclose(kernel.numpy(), 2.0 * (1 - 0.5 * 0.1), rtol=1e-7)
    np.testing.assert_array_equal(bias.numpy(), 2.0)


def test_indexed_slices_equal_the_dense_gradient():
    rng = np.random.default_rng(0)
    initial = rng.standard_normal((10, 4)).astype("float32")
    tables = [keras.Variable(initial) for _ in range(2)]
    optimizers = [CAME(learning_rate=0.01) for _ in range(2)]
    for _ in range(3):
        rows = tf.constant(rng.integers(0, 10, 6))  # with repeated rows
        sparse = tf.IndexedSlices(tf.constant(rng.standard_normal((6, 4)), tf.float32), rows,
                                  dense_shape=tf.constant([10, 4], tf.int64))
        optimizers[0].apply([sparse], [tables[0]])
        optimizers[1].apply([tf.convert_to_tensor(sparse)], [tables[1]])
    np.testing.assert_array_equal(tables[0].numpy(), tables[1].numpy())
    assert not np.allclose(tables[0].numpy(), initial)


def test_config_round_trip():
    optimizer = CAME(learning_rate=3e-4, beta_1=0.8, beta_2=0.99, beta_3=0.999, epsilon_1=1e-29,
                     epsilon_2=1e-15, clip_threshold=2.0, weight_decay=0.01, name="came_x")
    restored = CAME.from_config(optimizer.get_config())
    assert restored.get_config() == optimizer.get_config()
    deserialized = keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))
    assert isinstance(deserialized, CAME)
    assert deserialized.get_config() == optimizer.get_config()


def _regression_model():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((2,), dtype="int32"),
                              keras.layers.Embedding(20, 3), keras.layers.Flatten(),
                              keras.layers.Dense(4, activation="tanh"), keras.layers.Dense(1)])
    model.compile(CAME(learning_rate=0.01, weight_decay=0.01), "mse")
    return model


def test_saved_model_resumes_identically(tmp_path):
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 20, (64, 2)), rng.standard_normal((64, 1))

    def fit(model, epochs):
        model.fit(x, y, batch_size=16, epochs=epochs, shuffle=False, verbose=0)

    uninterrupted = _regression_model()
    fit(uninterrupted, 4)
    interrupted = _regression_model()
    fit(interrupted, 2)
    interrupted.save(tmp_path / "model.keras")
    resumed = keras.models.load_model(tmp_path / "model.keras")
    assert isinstance(resumed.optimizer, CAME)
    assert int(resumed.optimizer.iterations) == 8
    fit(resumed, 2)
    for a, b in zip(resumed.weights, uninterrupted.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    for a, b in zip(resumed.optimizer.variables, uninterrupted.optimizer.variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


@pytest.mark.parametrize("optimizer,expected_values", [
    # Dense(3 -> 4): kernel (3, 4), bias (4,). CAME: kernel momentum 12 + four factor vectors
    # 3 + 4 + 3 + 4, bias momentum and velocity 4 + 4. Adam: two slots of 12 + 4. Adafactor
    # (Keras): kernel r 3, c 4, v 12; bias r and c placeholders 1 + 1, v 4.
    (CAME, 12 + 14 + 8),
    (keras.optimizers.Adam, 2 * 16),
    (keras.optimizers.Adafactor, 3 + 4 + 12 + 1 + 1 + 4),
])
def test_state_bytes_are_exact(optimizer, expected_values):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4)])
    model.compile(optimizer(), "mse")
    counted = optimizer_state_bytes(model)
    # + the int64 iteration counter and the float32 learning rate
    assert counted.total == 4 * expected_values + 8 + 4
    assert counted.total == sum(size for _, size in counted.by_variable)
    assert len(counted.by_variable) == len(model.optimizer.variables)
    assert factored_minimum_bytes(model) == 4 * (12 + 14 + 8)
