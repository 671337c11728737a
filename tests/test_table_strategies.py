"""Table strategies (tfscale.embedding): a strategy defined outside the package
(tests/hashed_strategy.py) and registered by one call trains a model through the Table
interface: its lookups read the rows it maps ids to, the train step updates its tables by row
and collects its lookups' counts, and the model checkpoints; no state rides on the variables.
A partitioned one (tests/partitioned_strategy.py), installed by an entry point alone
(tests/plugins), trains from launch.train on 2 ranks, resumes at 1 and exports, with nothing of
it written anywhere else."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfscale import FieldEmbedding, FunctionalTrainStepModel
from tfscale.embedding import strategies
from tfscale.embedding.table import table_of
from tfscale.optimizers import RowSparseAdam
from tests import grouped_launches
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


MODULO_DATA = {"train_rows": 3840, "test_rows": 768, "vocabulary_scale": 0.002}
MODULO_RUN = ["--embedding_sharding=test_modulo", "--train_rows=3840", "--test_rows=768",
              "--synthetic_vocabulary_scale=0.002", "--dnn_units=16", "--batch_size=384",
              "--log_every_steps=5", "--checkpoint_every_steps=5", "--logdir=none",
              "--checkpoint_dir={dir}/modulo"]
# 2 ranks stop after step 7 (the last checkpoint: step 5); 1 process resumes and finishes the
# epoch (10 steps), then the run's model is exported.
MODULO_P2 = grouped_launches.launcher_job("modulo-P2", 2, *MODULO_RUN, "--stop_after_steps=7")
MODULO_P1 = grouped_launches.launcher_job("modulo-resumed-P1", 1, *MODULO_RUN, "--resume",
                                          stage=1)
MODULO_EXPORT = grouped_launches.job(
    "modulo-export", 1, "tests.multiworker.partitioned_export", "{dir}/modulo",
    "{dir}/modulo-export", *MODULO_DATA.values(), stage=1)


def test_an_installed_partitioned_strategy_trains_resumes_at_another_p_and_exports(
        launched_jobs):
    for name in (MODULO_P2, MODULO_P1, MODULO_EXPORT):
        assert launched_jobs[name].returncode == 0, launched_jobs[name].output
    described = "tables partitioned by id mod P (a test strategy) over {} ranks"
    assert described.format(2) in launched_jobs[MODULO_P2].output
    resumed = launched_jobs[MODULO_P1].output
    assert described.format(1) in resumed
    assert "resumed from global step 5" in resumed, resumed
    scores = np.load(launched_jobs.path("{dir}/modulo-export/scores.npz"))
    assert int(scores["global_step"]) == 10
    np.testing.assert_allclose(scores["served"].reshape(-1), scores["model"].reshape(-1),
                               rtol=1e-5)
    assert np.ptp(scores["model"]) > 0
