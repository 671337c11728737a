"""Dynamic tables (tfscale.embedding.dynamic, tfscale.embedding.id_rows): admission, the unknown
rows, least-recently-used eviction and expiry, fresh rows and optimizer state, lookups outside
training, checkpoints, bad settings; and under horovodrun at P = 2 and 4 the same ids, rows,
optimizer state and decisions as one process on the same global batches
(tests/multiworker/dynamic_steps.py, jobs of the grouped launches: tests/grouped_launches.py)."""

import glob
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests import grouped_launches
from tfscale.embedding.dynamic import FIELD_BITS, DynamicTables
from tfscale.embedding.field_embedding import FieldEmbedding
from tfscale.embedding.initializers import RowSeededNormal
from tfscale.errors import UserError
from tfscale.optimizers import RowSparseAdam
from tfscale.optimizers.table_state import table_state
from tfscale.checkpoints.store import CheckpointStore
from tfscale.training.train_step import FunctionalTrainStepModel


def embedding(**settings):
    layer = FieldEmbedding([10], embedding_dim=3, sharding=DynamicTables(**settings),
                           embeddings_initializer=RowSeededNormal(stddev=0.1, seed=3))
    layer.build()
    return layer


def lookup(layer, ids, training=True):
    return layer(tf.constant(np.reshape(ids, (-1, 1)), tf.int64), training=training).numpy()[:, 0]


def held(layer):
    rows, keys = (t.numpy() for t in layer.row_index.in_use())
    return {int(key) & ((1 << FIELD_BITS) - 1): int(row) for row, key in zip(rows, keys)}


def test_an_id_reads_its_fields_unknown_row_until_seen_min_count_times_then_its_own():
    layer = embedding(capacity=8, min_count=2)
    unknown = layer.tables[0].layer.unknown.numpy()[0]
    np.testing.assert_array_equal(lookup(layer, [5]), [unknown])
    assert held(layer) == {}
    first = lookup(layer, [5, 6])  # 5's second occurrence: admitted; 6 is not yet
    assert held(layer) == {5: 0}
    expected = RowSeededNormal(stddev=0.1, seed=3).keyed_rows(tf.constant([5]), 3).numpy()[0]
    np.testing.assert_allclose(first[0], expected)
    np.testing.assert_array_equal(first[1], unknown)


def test_ids_seen_often_enough_in_one_batch_are_admitted_at_once():
    layer = embedding(capacity=8, min_count=3)
    lookup(layer, [4, 4, 4, 7, 7])
    assert held(layer) == {4: 0}


def test_lookups_outside_training_neither_count_nor_admit():
    layer = embedding(capacity=8, min_count=1)
    lookup(layer, [1, 2], training=False)
    assert held(layer) == {} and int(layer.row_index.step.numpy()) == 0
    lookup(layer, [1])
    assert held(layer) == {1: 0}


def test_at_capacity_the_least_recently_seen_rows_go_and_a_reused_row_starts_fresh():
    layer = embedding(capacity=4, evict_fraction=0.25)
    for key in (1, 2, 3, 4):
        lookup(layer, [key])
    lookup(layer, [2])  # 2 is now the most recently seen but for 4
    table = layer.tables[0].variable
    table.assign(tf.ones(table.shape))  # trained values, which a reused row must not keep
    lookup(layer, [5, 4])  # 5 needs a row: down to 3 rows in use with it, the oldest (1, 3) go
    assert held(layer) == {2: 1, 4: 3, 5: 0}
    expected = RowSeededNormal(stddev=0.1, seed=3).keyed_rows(tf.constant([5]), 3).numpy()[0]
    np.testing.assert_allclose(table.numpy()[0], expected)
    np.testing.assert_array_equal(lookup(layer, [1], training=False)[0],
                                  layer.tables[0].layer.unknown.numpy()[0])


def test_rows_unseen_for_expire_after_steps_are_freed():
    layer = embedding(capacity=8, expire_after_steps=3)
    lookup(layer, [1, 2])
    lookup(layer, [2])
    lookup(layer, [3])  # step 3: rows unseen since step 0 or before would go; none
    assert set(held(layer)) == {1, 2, 3}
    for _ in range(3):
        lookup(layer, [3])  # step 6: 1 (last seen at 1) and 2 (at 2) are unseen for 3 steps
    assert set(held(layer)) == {3}


def test_one_batch_of_new_ids_larger_than_the_capacity_is_refused_naming_capacity():
    layer = embedding(capacity=2)
    with pytest.raises(tf.errors.InvalidArgumentError, match="larger `capacity`"):
        lookup(layer, [1, 2, 3])


@pytest.mark.parametrize("settings, argument", [
    ({"min_count": 0}, "min_count"), ({"capacity": 0}, "capacity"),
    ({"evict_fraction": 1.0}, "evict_fraction"), ({"expire_after_steps": 0}, "expire_after_steps"),
])
def test_bad_settings_are_refused_naming_the_argument(settings, argument):
    with pytest.raises(UserError, match=f"`{argument}="):
        DynamicTables(**settings)


def test_a_regularizer_or_a_shape_dependent_initializer_is_refused():
    with pytest.raises(UserError, match="embeddings_regularizer"):
        FieldEmbedding([10], sharding="dynamic", embeddings_regularizer="l2")
    with pytest.raises(UserError, match="embeddings_initializer"):
        FieldEmbedding([10], sharding="dynamic", embeddings_initializer="glorot_uniform")


def test_stale_embedding_updates_are_refused_with_dynamic_tables():
    """A late gradient could reach a row already given to another id: compile refuses
    `embedding_staleness` >= 1 with dynamic tables, naming both."""
    ids = keras.Input((1,), dtype="int64")
    vectors = FieldEmbedding([10], embedding_dim=3, sharding="dynamic")(ids)
    model = FunctionalTrainStepModel(ids, keras.layers.Dense(1)(keras.layers.Flatten()(vectors)))
    with pytest.raises(UserError, match=r"`embedding_staleness=1` cannot be used with tables of "
                                        r"`sharding=dynamic`"):
        model.compile(optimizer=RowSparseAdam(), loss="mse", embedding_staleness=1)
    model.compile(optimizer=RowSparseAdam(), loss="mse", embedding_staleness=0)


def test_the_settings_survive_the_layers_config():
    layer = FieldEmbedding([10, 20], sharding=DynamicTables(capacity=7, min_count=3))
    again = FieldEmbedding.from_config(layer.get_config())
    assert again.strategy == DynamicTables(capacity=7, min_count=3)
    assert again.row_index.capacity == 7


def small_model(**settings):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((2,), dtype="int64")
    layer = FieldEmbedding([10, 10], embedding_dim=3, sharding=DynamicTables(**settings),
                           name="field_embedding")
    outputs = keras.layers.Dense(1, activation="sigmoid")(keras.layers.Flatten()(layer(inputs)))
    model = FunctionalTrainStepModel(inputs, outputs)
    model.compile(optimizer=RowSparseAdam(learning_rate=0.01, name="row_sparse_adam"),
                  loss="binary_crossentropy")
    model.optimizer.build(model.trainable_variables)
    return model, layer


def test_a_row_given_to_a_new_id_starts_with_fresh_optimizer_state():
    model, layer = small_model(capacity=16)
    state = table_state(model.optimizer, layer.tables[0].variable).per_row
    for slot in state:
        slot.assign(tf.fill(slot.shape, tf.constant(1000, slot.dtype)))
    model.train_on_batch(np.array([[1, 2]]), np.array([[1.0]]))
    rows = sorted(held(layer).values())
    moments, last_step = (slot.numpy()[rows] for slot in state)
    assert np.abs(moments).max() < 1
    np.testing.assert_array_equal(last_step, [1, 1])  # updated at step 1, nothing to catch up
    assert (state[0].numpy()[max(rows) + 1:] == 1000).all()  # only the batch's rows


def test_a_checkpoint_restores_rows_state_and_the_id_map(tmp_path):
    model, layer = small_model(capacity=14, min_count=2)  # 18 ids, at most 12 in a batch
    rng = np.random.default_rng(0)
    batches = [(rng.integers(0, 9, (6, 2)), rng.integers(0, 2, (6, 1)).astype("float32"))
               for _ in range(8)]
    for x, y in batches[:4]:
        model.train_on_batch(x, y)
    CheckpointStore(str(tmp_path), model, model.optimizer,
                    per_rank_variables=model.per_rank_variables()).save(4, {"epoch": 0})
    for x, y in batches[4:]:
        model.train_on_batch(x, y)
    continued = written_values(model, layer)

    again, again_layer = small_model(capacity=14, min_count=2)
    store = CheckpointStore(str(tmp_path), again, again.optimizer,
                            per_rank_variables=again.per_rank_variables())
    store.restore_latest()
    store.finish_restore()
    for x, y in batches[4:]:
        again.train_on_batch(x, y)
    assert int(layer.row_index.free_count.numpy()) == int(again_layer.row_index.free_count.numpy())
    for expected, value in zip(continued, written_values(again, again_layer)):
        np.testing.assert_array_equal(value, expected)


def written_values(model, layer):
    """The values of every variable of `model` and its optimizer, of the per-row ones (of
    `layer`'s dynamic tables) the rows handed out only (the others are never written), of the
    free-row stack its entries only."""
    index = layer.row_index
    handed_out, stacked = int(index.next_row.numpy()), int(index.free_count.numpy())
    values = []
    for variable in model.variables + model.optimizer.variables:
        if variable is index.free_rows:
            values.append(variable.numpy()[:stacked])
        elif len(variable.shape) and variable.shape[0] == index.rows:
            values.append(tf.gather(variable.value, tf.range(handed_out)).numpy())
        else:
            values.append(variable.numpy())
    return values


# (ranks that wrote the checkpoint, ranks that resume it) of the resumed runs: each launch of
# stage 0 resumes its own checkpoint; one 2-rank launch of stage 1 then resumes the others.
RESUMES = [(1, 1), (2, 2), (4, 4), (1, 2), (4, 2)]
STEPS_DIR = "{dir}/dynamic_steps"
STEPS_JOBS = [grouped_launches.job(f"dynamic-steps-P{ranks}", ranks,
                                   "tests.multiworker.dynamic_steps", STEPS_DIR)
              for ranks in (1, 2, 4)]
STEPS_JOBS.append(grouped_launches.job(
    "dynamic-steps-resumed-on-2", 2, "tests.multiworker.dynamic_steps", STEPS_DIR,
    "--resume_from=" + ",".join(f"{STEPS_DIR}/checkpoint-P{written}"
                                for written, resumed in RESUMES
                                if resumed == 2 and written != 2),
    stage=1))


@grouped_launches.prepare
def _steps_directory(directory):
    os.makedirs(STEPS_DIR.format(dir=directory))


@pytest.fixture(scope="module")
def multi_rank_runs(launched_jobs):
    """The directory of the npz files of dynamic_steps.py in one process and at P = 2 and 4,
    each resuming its own checkpoint, and of P = 2 resuming the others (RESUMES)."""
    for name in STEPS_JOBS:
        job = launched_jobs[name]
        assert job.returncode == 0 and "dynamic steps done" in job.stdout(), job.output[-3000:]
    return str(launched_jobs.path(STEPS_DIR))


def ranks_of(out, run, num_ranks):
    paths = sorted(glob.glob(os.path.join(out, f"{run}-P{num_ranks}-rank*.npz")))
    assert len(paths) == num_ranks, paths
    return [np.load(path) for path in paths]


def runs_to_compare(out, run, num_ranks, reference_run):
    """(the reference's arrays, every rank's arrays of `run` at `num_ranks`)."""
    return np.load(os.path.join(out, f"{reference_run}-P1-rank0.npz")), ranks_of(out, run,
                                                                                  num_ranks)


def assert_same_ids_held(parts, reference, steps):
    for step in steps:
        held_ids = np.sort(np.concatenate([part[f"held_{step}"] for part in parts]))
        np.testing.assert_array_equal(held_ids, reference[f"held_{step}"], err_msg=f"step {step}")


def assert_same_rows(parts, reference, keys, exact=()):
    """Every id's values of `keys` across `parts` (allclose) and of `exact` (equal) are the
    reference's."""
    ids = np.concatenate([part["ids"] for part in parts])
    order, reference_order = np.argsort(ids), np.argsort(reference["ids"])
    for key in (*exact, *keys):
        values = np.concatenate([part[key] for part in parts])[order]
        if key in exact:
            np.testing.assert_array_equal(values, reference[key][reference_order], err_msg=key)
        else:
            np.testing.assert_allclose(values, reference[key][reference_order], rtol=1e-4,
                                       atol=1e-6, err_msg=key)


@pytest.mark.parametrize("num_ranks", [2, 4])
@pytest.mark.parametrize("run", ["roomy", "evicting"])
def test_every_number_of_ranks_admits_and_evicts_the_same_ids_as_one_process(multi_rank_runs, run,
                                                                            num_ranks):
    reference, parts = runs_to_compare(multi_rank_runs, run, num_ranks, run)
    assert_same_ids_held(parts, reference, range(12))
    if run == "evicting":  # the run must have evicted, or it checks nothing more than "roomy"
        sizes = [len(reference[f"held_{step}"]) for step in range(12)]
        assert any(b < a for a, b in zip(sizes, sizes[1:])), sizes


@pytest.mark.parametrize("num_ranks", [2, 4])
@pytest.mark.parametrize("run", ["roomy", "evicting"])
def test_every_number_of_ranks_trains_the_rows_and_state_of_one_process(multi_rank_runs, run,
                                                                       num_ranks):
    reference, parts = runs_to_compare(multi_rank_runs, run, num_ranks, run)
    assert_same_rows(parts, reference, [f"{table}{suffix}"
                                        for table in ("deep_embedding", "wide_embedding")
                                        for suffix in ("", "_moment0", "_moment1")],
                     exact=("last_seen", "seen_count"))
    for part in parts:
        for key in ("dense", "deep_embedding_unknown", "wide_embedding_unknown"):
            np.testing.assert_allclose(part[key], reference[key], rtol=1e-4, atol=1e-6,
                                       err_msg=key)


@pytest.mark.parametrize("written, resumed", RESUMES)
def test_a_checkpoint_resumes_at_any_number_of_ranks_with_the_same_decisions(multi_rank_runs,
                                                                          written, resumed):
    reference, parts = runs_to_compare(multi_rank_runs, f"evicting-resumed-checkpoint-P{written}",
                                       resumed, "evicting")
    assert_same_ids_held(parts, reference, range(6, 12))
    assert_same_rows(parts, reference, ("deep_embedding", "deep_embedding_moment1",
                                        "wide_embedding"), exact=("last_seen", "seen_count"))


def test_a_resume_at_the_same_number_of_ranks_is_bitwise(multi_rank_runs):
    for num_ranks in (2, 4):
        uninterrupted = ranks_of(multi_rank_runs, "evicting", num_ranks)
        resumed_parts = ranks_of(multi_rank_runs, f"evicting-resumed-checkpoint-P{num_ranks}",
                                 num_ranks)
        for part, resumed in zip(uninterrupted, resumed_parts):
            for key in resumed.files:
                np.testing.assert_array_equal(resumed[key], part[key], err_msg=key)


def fixed_model():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((2,), dtype="int64")
    layer = FieldEmbedding([10, 10], embedding_dim=3, name="field_embedding")
    outputs = keras.layers.Dense(1, activation="sigmoid")(keras.layers.Flatten()(layer(inputs)))
    model = FunctionalTrainStepModel(inputs, outputs)
    model.compile(optimizer=RowSparseAdam(learning_rate=0.01, name="row_sparse_adam"),
                  loss="binary_crossentropy")
    model.optimizer.build(model.trainable_variables)
    return model


@pytest.mark.parametrize("written, resumed", [(fixed_model, small_model),
                                              (small_model, fixed_model)])
def test_fixed_and_dynamic_checkpoints_are_not_resumed_as_each_other(tmp_path, written, resumed):
    def built(make):
        made = make(capacity=14) if make is small_model else make()
        model = made[0] if isinstance(made, tuple) else made
        model.train_on_batch(np.array([[1, 2]]), np.array([[1.0]]))
        return model

    model = built(written)
    CheckpointStore(str(tmp_path), model, model.optimizer).save(1, {"epoch": 0})
    again = built(resumed)
    before = [v.numpy() for v in again.variables]
    with pytest.raises(UserError, match="fixed embedding tables|holds dynamic embedding tables"):
        CheckpointStore(str(tmp_path), again, again.optimizer).restore_latest()
    for value, variable in zip(before, again.variables):  # nothing was restored
        np.testing.assert_array_equal(variable.numpy(), value)
