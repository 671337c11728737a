"""Behaviour and numbers of tfscale.embedding.field_embedding.FieldEmbedding and the reference
models."""

import re

import keras
import numpy as np
import pytest
import tensorflow as tf

from models import MODELS, build_model
from models.dcn import CrossNetwork
from models.dcn_v2 import MixtureCross
from models.deepfm import FactorizationMachine
from tfscale.data.schema import FeatureSchema
from tfscale.embedding.field_embedding import FieldEmbedding
from tfscale.embedding.table_names import (DEEP_TABLE_PATTERN, WIDE_TABLE_PATTERN, is_deep_table,
                                      is_wide_table)
from tfscale.errors import UserError, user_error_from_tf

SCHEMA = FeatureSchema(("d0", "d1", "d2"), ("c0", "c1", "c2", "c3"), (3, 5, 7, 11))
NO_DENSE = FeatureSchema((), ("c0", "c1", "c2"), (4, 2, 6))
SMALL = {"hidden_units": (16, 16)}


def batch(schema, size, seed=0):
    rng = np.random.default_rng(seed)
    features = {
        "dense": rng.random((size, schema.num_dense), dtype=np.float32),
        "categorical": rng.integers(0, schema.vocabulary_sizes, size=(size, schema.num_categorical)),
    }
    labels = rng.integers(0, 2, size=(size, 1)).astype(np.float32)
    return features, labels


@pytest.fixture(autouse=True)
def seeded():
    keras.utils.set_random_seed(1)


@pytest.fixture
def bfloat16_policy():
    keras.mixed_precision.set_dtype_policy("mixed_bfloat16")
    yield
    keras.mixed_precision.set_dtype_policy("float32")


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("schema", [SCHEMA, NO_DENSE], ids=["dense", "no_dense"])
def test_output_is_probability_per_row(name, schema):
    features, _ = batch(schema, 8)
    probabilities = build_model(name, schema, **SMALL)(features)
    assert probabilities.shape == (8, 1)
    assert probabilities.dtype == tf.float32
    assert np.all((probabilities.numpy() > 0) & (probabilities.numpy() < 1))


@pytest.mark.parametrize(
    "config",
    [
        {"projection_dim": None},
        {"num_experts": 4, "projection_dim": 4},
        {"structure": "stacked"},
        {"cross_layers": 0},
        {"hidden_units": ()},
    ],
    ids=["full_rank", "experts", "stacked", "no_cross", "no_dnn"],
)
def test_dcn_v2_variants(config):
    features, _ = batch(SCHEMA, 8)
    assert build_model("dcn_v2", SCHEMA, **{**SMALL, **config})(features).shape == (8, 1)


def test_unknown_model_names_the_known_ones():
    with pytest.raises(UserError, match="dcn, dcn_v2, deepfm, wide_deep"):
        build_model("xdeepfm", SCHEMA)


def test_fm_term_is_the_pairwise_dot_product_sum():
    embeddings = np.random.default_rng(0).normal(size=(5, 4, 3)).astype(np.float32)
    brute = np.zeros((5, 1), np.float32)
    for i in range(4):
        for j in range(i + 1, 4):
            brute[:, 0] += np.sum(embeddings[:, i] * embeddings[:, j], axis=1)
    np.testing.assert_allclose(FactorizationMachine()(embeddings), brute, rtol=1e-5, atol=1e-6)


def test_cross_network_follows_its_formula():
    rng = np.random.default_rng(0)
    x0 = rng.normal(size=(4, 3)).astype(np.float32)
    layer = CrossNetwork(num_layers=2)
    layer.build(x0.shape)
    kernels = [rng.normal(size=(3, 1)).astype(np.float32) for _ in range(2)]
    biases = [rng.normal(size=(3,)).astype(np.float32) for _ in range(2)]
    layer.set_weights(kernels + biases)  # kernels are created first, then biases
    x = x0
    for w, b in zip(kernels, biases):
        x = x0 * (x @ w) + b + x
    np.testing.assert_allclose(layer(x0), x, rtol=1e-5)


def test_mixture_cross_follows_its_formula():
    rng = np.random.default_rng(0)
    x0, x = rng.normal(size=(2, 4, 6)).astype(np.float32)
    layer = MixtureCross(num_experts=3, projection_dim=2)
    layer.build(x0.shape)
    down, middle, up = (rng.normal(size=v.shape).astype(np.float32) for v in layer.weights[:3])
    bias, gate = rng.normal(size=(6,)).astype(np.float32), rng.normal(size=(6, 3)).astype(np.float32)
    layer.set_weights([down, middle, up, bias, gate])
    scores = np.exp(x @ gate)
    gates = scores / scores.sum(axis=1, keepdims=True)
    expected = x.copy()
    for e in range(3):
        low = np.tanh(middle[e] @ np.tanh(down[e].T @ x.T))  # [rank, B]
        expected += gates[:, e : e + 1] * x0 * ((up[e] @ low).T + bias)
    np.testing.assert_allclose(layer(x0, x), expected, rtol=1e-4, atol=1e-5)


def test_field_f_id_i_reads_row_offset_f_plus_i():
    layer = FieldEmbedding([3, 5, 7], embedding_dim=2, use_wide=True)
    layer.build()
    rows = np.arange(15, dtype=np.float32)
    layer.deep_table.set_weights([np.stack([rows, -rows], axis=1)])
    layer.wide_table.set_weights([rows[:, None]])
    ids = np.array([[0, 0, 0], [2, 4, 6], [1, 3, 5]])
    embeddings, linear = layer(ids)
    expected_rows = ids + np.array([0, 3, 8])
    np.testing.assert_array_equal(embeddings[..., 0], expected_rows)
    np.testing.assert_array_equal(embeddings[..., 1], -expected_rows)
    np.testing.assert_array_equal(linear, expected_rows.sum(axis=1, keepdims=True))
    np.testing.assert_array_equal(layer.offsets, [0, 3, 8])


def test_field_embedding_config_round_trip():
    layer = FieldEmbedding([3, 5], embedding_dim=4, use_wide=True, wide_regularizer="l2")
    assert FieldEmbedding.from_config(layer.get_config()).get_config() == layer.get_config()


@pytest.mark.parametrize("bad_id", [5, -1])
def test_out_of_range_id_raises(bad_id):
    layer = FieldEmbedding([3, 5, 7])
    with pytest.raises(tf.errors.InvalidArgumentError, match="outside the embedding rows"):
        layer(np.array([[0, 1, 2], [1, bad_id, 2]]))


def test_out_of_range_id_in_a_compiled_model_is_a_user_error():
    model = build_model("deepfm", SCHEMA, **SMALL)
    features, _ = batch(SCHEMA, 4)
    features["categorical"][2, 3] = 11  # field c3 has rows 0..10
    with pytest.raises(tf.errors.InvalidArgumentError) as raised:
        model.predict(features, verbose=0)
    message = str(user_error_from_tf(raised.value))
    assert "outside the embedding rows of its field" in message
    assert "[3] [0] [11] [11]" in message  # column, smallest id, largest id, rows


@pytest.mark.parametrize("name", sorted(MODELS))
def test_deep_and_wide_tables_are_told_apart_by_path(name):
    model = build_model(name, SCHEMA, **SMALL)
    deep = [v for v in model.trainable_variables if is_deep_table(v)]
    wide = [v for v in model.trainable_variables if is_wide_table(v)]
    assert [v.shape for v in deep] == [(SCHEMA.total_vocabulary, 10)]
    assert [v.shape for v in wide] == [(SCHEMA.total_vocabulary, 1)]
    assert deep[0].path == f"{model.name}/field_embedding/deep_embedding/embeddings"
    assert wide[0].path == f"{model.name}/field_embedding/wide_embedding/embeddings"
    assert model.field_embedding.deep_table.embeddings is deep[0]
    others = [v.path for v in model.trainable_variables if v is not deep[0] and v is not wide[0]]
    assert not [p for p in others if re.fullmatch(f"{DEEP_TABLE_PATTERN}|{WIDE_TABLE_PATTERN}", p)]


def test_deep_table_gradient_is_sparse():
    model = build_model("deepfm", SCHEMA, **SMALL)
    features, labels = batch(SCHEMA, 8)
    with tf.GradientTape() as tape:
        loss = keras.losses.binary_crossentropy(labels, model(features))
    gradient = tape.gradient(loss, model.field_embedding.deep_table.embeddings.value)
    assert isinstance(gradient, tf.IndexedSlices)


def test_l2_covers_the_whole_tables_and_the_dense_linear_kernel():
    model = build_model("deepfm", SCHEMA, l2_embedding=1e-3, l2_wide=1e-2, l2_linear=1e-1, **SMALL)
    model(batch(SCHEMA, 2)[0])
    deep = model.field_embedding.deep_table.embeddings.numpy()
    wide = model.field_embedding.wide_table.embeddings.numpy()
    kernel = model.dense_linear.kernel.numpy()
    expected = 1e-3 * np.sum(deep**2) + 1e-2 * np.sum(wide**2) + 1e-1 * np.sum(kernel**2)
    np.testing.assert_allclose(float(sum(model.losses)), expected, rtol=1e-5)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_training_lowers_the_loss(name):
    features, _ = batch(SCHEMA, 512, seed=1)
    labels = ((features["categorical"][:, :1] + features["categorical"][:, 1:2]) % 2).astype(
        np.float32
    )
    model = MODELS[name](SCHEMA, **SMALL)  # unbuilt: fit builds it
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="binary_crossentropy")
    history = model.fit(features, labels, batch_size=64, epochs=4, verbose=0)
    losses = history.history["loss"]
    assert losses[-1] < losses[0] - 0.05, losses


@pytest.mark.parametrize(
    "name, config",
    [(name, {}) for name in sorted(MODELS)]
    + [("dcn_v2", {"num_experts": 2, "projection_dim": 4, "structure": "stacked"})],
)
def test_save_and_load_give_the_same_predictions(name, config, tmp_path):
    model = build_model(name, NO_DENSE if name == "wide_deep" else SCHEMA, **SMALL, **config)
    features, _ = batch(model.schema, 16)
    path = tmp_path / "model.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    assert type(loaded) is type(model)
    assert loaded.schema == model.schema
    assert loaded.get_config() == model.get_config()
    np.testing.assert_allclose(loaded.predict(features, verbose=0), model.predict(features, verbose=0))


@pytest.mark.parametrize("name", sorted(MODELS))
def test_mixed_bfloat16_keeps_tables_and_output_float32(name, bfloat16_policy):
    model = build_model(name, SCHEMA, **SMALL)
    features, labels = batch(SCHEMA, 32)
    assert model.compute_dtype == "bfloat16"
    assert model.field_embedding.deep_table.embeddings.dtype == "float32"
    assert model.field_embedding.wide_table.embeddings.dtype == "float32"
    assert all(v.dtype == "float32" for v in model.weights)
    assert model.dnn.dense_layers[0].compute_dtype == "bfloat16"
    assert model(features).dtype == tf.float32
    model.compile(optimizer="adam", loss="binary_crossentropy")
    assert np.isfinite(model.train_on_batch(features, labels))
