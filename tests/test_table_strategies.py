"""Table strategies (tfscale.embedding): a strategy defined outside the package
(tests/hashed_strategy.py) and registered by one call trains a model through the Table
interface: its lookups read the rows it maps ids to, the train step updates its tables by row
and collects its lookups' counts, and the model checkpoints; no state rides on the variables."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfscale import FieldEmbedding, FunctionalTrainStepModel
from tfscale.embedding import strategies
from tfscale.embedding.table import table_of
from tfscale.optimizers import RowSparseAdam
from tests.hashed_strategy import BUCKETS, Hashed

VOCABULARY = (10, 20)


@pytest.fixture(scope="module", autouse=True)
def hashed_strategy():
    strategies.register(Hashed())
    yield
    del strategies.STRATEGIES[Hashed.name]


def _model():
    keras.utils.set_random_seed(0)
    ids = keras.Input((len(VOCABULARY),), dtype="int64")
    embedding = FieldEmbedding(VOCABULARY, embedding_dim=4, use_wide=True, sharding=Hashed.name)
    vectors, linear = embedding(ids)
    logits = keras.layers.Dense(1)(keras.layers.Flatten()(vectors)) + linear
    model = FunctionalTrainStepModel(ids, keras.layers.Activation("sigmoid")(logits))
    model.compile(RowSparseAdam(learning_rate=0.1), "binary_crossentropy")
    return model, embedding


def test_a_registered_strategy_holds_looks_up_and_trains_its_tables(tmp_path):
    model, embedding = _model()
    deep, wide = embedding.tables
    assert (deep.rows, deep.width, wide.width) == (BUCKETS, 4, 1)
    assert tuple(deep.variable.shape) == (BUCKETS, 4)
    assert table_of(deep.variable) is deep and table_of(deep.variable.value) is deep
    assert not [name for v in model.variables for name in vars(v) if name.startswith("_tfscale")]

    ids = np.array([[1, 3], [8, 3], [1, 0]], np.int64)  # global rows 1, 13, 8, 13, 1, 10
    buckets = (ids + embedding.offsets) % BUCKETS
    before = deep.variable.numpy()
    vectors, _ = embedding(tf.constant(ids))
    np.testing.assert_array_equal(vectors.numpy(), before[buckets])

    model.fit(ids, np.array([1.0, 0.0, 1.0]), batch_size=3, epochs=1, verbose=0)
    assert deep.updated_by_row and wide.updated_by_row
    after = deep.variable.numpy()
    touched = np.unique(buckets)
    untouched = np.setdiff1d(np.arange(BUCKETS), touched)
    assert not np.allclose(after[touched], before[touched])
    np.testing.assert_array_equal(after[untouched], before[untouched])
    # The step collected the lookups' counts: 6 ids in buckets 1, 6, 1, 6, 1, 3 per table
    unique_rate = model.summary_scalars()["embedding/unique_id_rate"]
    assert float(unique_rate) == pytest.approx(len(touched) / ids.size)

    model.save_weights(tmp_path / "model.weights.h5")
    restored, restored_embedding = _model()
    restored.optimizer.build(restored.trainable_variables)
    restored.load_weights(tmp_path / "model.weights.h5")
    np.testing.assert_array_equal(restored_embedding.tables[0].variable.numpy(), after)


def test_an_unknown_strategy_names_the_argument_and_the_choices():
    with pytest.raises(ValueError, match=r"`sharding='nearline'`: give one of replicated, row"):
        FieldEmbedding(VOCABULARY, sharding="nearline")
