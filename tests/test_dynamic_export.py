"""A SavedModel of dynamic tables holds their rows in use only (tfscale.embedding.dynamic_serving,
tfscale.serving.saved_model): a model of capacity 2M ids trained a few steps exports a variables
directory the size of its rows in use, its served scores are the trained model's (ids never seen
in training read their field's unknown row alike), the model trains on after the export, and an
export of a subclassed model without its input signature is refused by name."""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import models
import tfscale
from tests.test_criteo import HAND_LINES
from tfscale.data.criteo import CATEGORICAL_NAMES, DENSE_NAMES, CriteoFormat
from tfscale.data.preprocessing import Preprocessing
from tfscale.data.text_lines import LineLayout
from tfscale.embedding.dynamic import DynamicTables
from tfscale.embedding.table import model_tables, table_of
from tfscale.errors import UserError
from tfscale.optimizers import RowSparseAdam
from tfscale.serving.export import (OUTPUT, SCORE_LINES, RawInputs, RawScorer,
                                    export_saved_model)

CAPACITY = 2_000_000
FIELDS = 3
WIDTH = 8


def dynamic_model():
    keras.utils.set_random_seed(0)
    ids = keras.Input((FIELDS,), dtype="int64")
    vectors, linear = tfscale.FieldEmbedding(
        [10] * FIELDS, embedding_dim=WIDTH, use_wide=True,
        sharding=DynamicTables(capacity=CAPACITY))(ids)
    logit = keras.layers.Dense(1)(keras.layers.Flatten()(vectors)) + linear
    model = tfscale.FunctionalTrainStepModel(ids, keras.layers.Activation("sigmoid")(logit))
    model.compile(optimizer=RowSparseAdam(learning_rate=0.05), loss="binary_crossentropy")
    return model


def batches(steps, rows=64, seed=1):
    """(ids, labels) of `steps` batches: ids spread over 2**40, so most are seen once."""
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        ids = rng.integers(0, 1 << 40, size=(rows, FIELDS), dtype=np.int64)
        ids[: rows // 4] %= 50  # some ids seen again
        yield ids, (ids[:, :1] % 3 == 0).astype(np.float32)


def train(model, steps, seed=1):
    for ids, labels in batches(steps, seed=seed):
        model.train_on_batch(ids, labels)
    return ids


def directory_bytes(path):
    return sum(os.path.getsize(os.path.join(folder, name))
               for folder, _, names in os.walk(path) for name in names)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """(model, its trained ids, the rows in use, the SavedModel's directory)."""
    model = dynamic_model()
    seen = train(model, steps=4)
    rows_in_use = int(model_tables(model)[0].row_index.in_use()[0].shape[0])
    path = str(tmp_path_factory.mktemp("served") / "1")
    tfscale.serving.export_model(model, path)
    return model, seen, rows_in_use, path


def test_the_saved_model_holds_the_rows_in_use_only(exported):
    model, _, rows_in_use, path = exported
    assert 100 < rows_in_use < 1000
    dense_bytes = sum(int(np.prod(v.shape)) * 4 for v in model.trainable_variables
                      if table_of(v) is None)
    # per row in use: the deep and wide rows (float32) and the id map's key and value (int64)
    row_bytes = (WIDTH + 1) * 4 + 2 * 8
    variables = directory_bytes(os.path.join(path, "variables"))
    assert variables <= 2 * (rows_in_use * row_bytes + dense_bytes) + 16_000, variables
    assert variables < CAPACITY * (WIDTH + 1) * 4 / 1000


def test_served_scores_are_the_trained_models_for_seen_and_unseen_ids(exported):
    model, seen, rows_in_use, path = exported
    unseen = np.array([[7, (1 << 50) + 3, 12345678901], [1 << 55, 0, 1]], np.int64)
    partly = seen[:4].copy()
    partly[:, 1] = 1 << 45  # a known id of field 0 beside an unseen one of field 1
    ids = np.concatenate([seen, unseen, partly])
    loaded = tf.saved_model.load(path)  # held: its variables live as long as it does
    served = loaded.serve(tf.constant(ids)).numpy()
    shapes = sorted(tuple(v.shape) for v in loaded.variables)
    assert (rows_in_use, WIDTH) in shapes and (rows_in_use, 1) in shapes, shapes  # compact
    expected = model.predict(ids, verbose=0)
    np.testing.assert_allclose(served, expected, rtol=0, atol=1e-6)
    assert len(np.unique(np.round(expected, 6))) > len(ids) // 2  # rows differ, not all unknown


def test_the_model_trains_on_after_the_export_in_its_training_form(exported):
    model, seen, rows_in_use, _ = exported
    before = model.predict(seen, verbose=0)
    table = model_tables(model)[0]
    assert table_of(table.variable) is table and table.variable.shape[0] == CAPACITY
    train(model, steps=2, seed=2)
    assert int(table.row_index.in_use()[0].shape[0]) > rows_in_use
    after = model.predict(seen, verbose=0)
    assert np.isfinite(after).all() and np.abs(after - before).max() > 1e-4


def test_a_raw_text_saved_model_of_tables_with_no_row_in_use_scores_as_the_model(tmp_path):
    """export_saved_model (launch.export's) of an untrained DeepFM of dynamic tables keyed by
    fingerprints: no row in use, so empty served tables, and every id reads its unknown row."""
    preprocessing = Preprocessing(CriteoFormat(), hash_buckets=(1 << 56) - 1)
    model = models.build_model("deepfm", preprocessing.schema, embedding_dim=4, hidden_units=[8],
                               embedding_sharding=DynamicTables(capacity=CAPACITY))
    raw_inputs = RawInputs(CriteoFormat(), LineLayout(("label",) + DENSE_NAMES + CATEGORICAL_NAMES))
    path = str(tmp_path / "1")
    export_saved_model(model, preprocessing, raw_inputs, path)
    assert directory_bytes(os.path.join(path, "variables")) < 100_000
    lines = tf.constant(HAND_LINES)
    loaded = tf.saved_model.load(path)
    served = loaded.signatures[SCORE_LINES](lines=lines)[OUTPUT].numpy()
    expected = RawScorer(model, preprocessing, raw_inputs).lines(lines).numpy()
    np.testing.assert_allclose(served, expected, rtol=0, atol=1e-6)


class Subclassed(tfscale.TrainStepModel):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.embedding = tfscale.FieldEmbedding([10] * FIELDS, embedding_dim=WIDTH,
                                                sharding="dynamic")
        self.out = keras.layers.Dense(1, activation="sigmoid")

    def call(self, ids, training=None):
        return self.out(keras.layers.Flatten()(self.embedding(ids)))


def test_a_built_subclassed_model_without_its_input_signature_is_refused_by_name(tmp_path):
    model = Subclassed()
    ids = np.array([[1, 2, 3]], np.int64)
    model(ids)
    with pytest.raises(UserError, match="give `input_signature`"):
        tfscale.serving.export_model(model, str(tmp_path / "1"))
    signature = [tf.TensorSpec([None, FIELDS], tf.int64, name="ids")]
    tfscale.serving.export_model(model, str(tmp_path / "2"), input_signature=signature)
    loaded = tf.saved_model.load(str(tmp_path / "2"))
    served = loaded.serve(tf.constant(ids)).numpy()
    np.testing.assert_allclose(served, model.predict(ids, verbose=0), atol=1e-6)
