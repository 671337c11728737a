"""Table strategies (tfscale.embedding): a strategy defined outside the package
(tests/hashed_strategy.py) and registered by one call trains a model through the Table
interface: its lookups read the rows it maps ids to, the train step updates its tables by row
and collects its lookups' counts, and the model checkpoints; no state rides on the variables.
A strategy whose tables' variable has another name than "embeddings" gets row updates all the
same: tables are found through the registry (tfscale.embedding.strategies.table_of), never by
name.
A partitioned one (tests/partitioned_strategy.py), installed by an entry point alone
(tests/plugins), trains from launch.train on 2 ranks, resumes at 1 and exports, with nothing of
it written anywhere else."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfscale import FieldEmbedding, FunctionalTrainStepModel
from tfscale.embedding import dedup, strategies
from tfscale.embedding.strategy import TableStrategy
from tfscale.embedding.table import RowShard, Table, table_of
from tfscale.optimizers import RowSparseAdam, factory
from tfscale.optimizers.capabilities import optimizer_for
from tfscale.optimizers.scaling import large_batch_settings
from tests import grouped_launches
from tests.hashed_strategy import BUCKETS, Hashed

VOCABULARY = (10, 20)


@pytest.fixture(scope="module", autouse=True)
def hashed_strategy():
    strategies.register(Hashed())
    yield
    del strategies.STRATEGIES[Hashed.name]


def _model(sharding=Hashed.name, optimizer=None):
    keras.utils.set_random_seed(0)
    ids = keras.Input((len(VOCABULARY),), dtype="int64")
    embedding = FieldEmbedding(VOCABULARY, embedding_dim=4, use_wide=True, sharding=sharding)
    vectors, linear = embedding(ids)
    logits = keras.layers.Dense(1)(keras.layers.Flatten()(vectors)) + linear
    model = FunctionalTrainStepModel(ids, keras.layers.Activation("sigmoid")(logits))
    model.compile(optimizer or RowSparseAdam(learning_rate=0.1), "binary_crossentropy")
    return model, embedding


class NamedRows(TableStrategy):
    """Every row on every rank, de-duplicated lookups, as `replicated`, in a variable named
    "rows"."""

    name = "test_named_rows"
    description = "replicated, named rows (a test strategy)"

    def make_table(self, name, rows, width, initializer, regularizer, dtype):
        return Table(name, rows, width, self, RowsLayer(rows, width, initializer, name=name))

    def build(self, table, embedding):
        table.layer.build()
        table.attach(table.layer.held, RowShard(table.rows, 1, 0))

    def lookup(self, tables, rows, embedding, training=False):
        return [dedup.lookup(table, rows) for table in tables]


class RowsLayer(keras.layers.Layer):
    """A [rows, width] table in the variable "rows"."""

    def __init__(self, rows, width, initializer, **kwargs):
        super().__init__(**kwargs)
        self.table_shape, self.initializer = (rows, width), initializer

    def build(self, input_shape=None):
        self.held = self.add_weight(shape=self.table_shape, initializer=self.initializer,
                                    autocast=False, name="rows")


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


def test_a_table_in_a_variable_of_another_name_is_updated_by_row():
    model, embedding = _model(sharding=NamedRows())
    deep, wide = embedding.tables
    assert deep.variable.path.endswith("deep_embedding/rows")
    assert strategies.table_of(deep.variable) is deep and strategies.is_table(wide.variable)
    first, second = np.array([[1, 3]], np.int64), np.array([[2, 4]], np.int64)
    model.fit(first, np.array([1.0]), batch_size=1, epochs=1, verbose=0)
    assert deep.updated_by_row and wide.updated_by_row
    before = deep.variable.numpy()
    model.fit(second, np.array([0.0]), batch_size=1, epochs=1, verbose=0)
    after = deep.variable.numpy()
    # Adam's momentum would move the first batch's rows again under a whole update; by row,
    # only the second batch's rows move.
    moved = np.flatnonzero(np.any(after != before, axis=1))
    np.testing.assert_array_equal(moved, np.sort((second + embedding.offsets).reshape(-1)))

    # The optimizer factory sends such tables to the tables' optimizer too.
    optimizer = factory.build_optimizer(large_batch_settings(4096, "sqrt"), "adam",
                                        warmup_steps=0)
    model, embedding = _model(sharding=NamedRows(), optimizer=optimizer)
    assert {optimizer_for(optimizer, t.variable).name for t in embedding.tables} == {"embedding"}
    dense = [v for v in model.trainable_variables if not strategies.is_table(v)]
    assert dense and {optimizer_for(optimizer, v).name for v in dense} == {"dense"}


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
