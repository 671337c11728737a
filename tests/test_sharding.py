"""Row-sharded embedding tables (tfscale.embedding.row_sharding, tfscale.exchanges.sharded): P ranks
at B/P with sharded tables train to the whole tables and optimizer state of one process at B with
replicated ones (P = 2, 3, 4 under horovodrun, rtol 1e-5; synchronous and 1 step stale), float16
with a loss scaler equals replicated tables at the same P (bitwise) and skips an inf step
everywhere, the lookup's edge cases and its alltoall byte counters (exact, from the ids),
checkpoints resumed at another P holding exactly the tables and optimizer state written, and in
one process: sharded equals replicated, initial rows do not depend on P and follow the
initializer's (seed, block) rule, refusals."""

import re

import keras
import numpy as np
import pytest
import tensorflow as tf

import models
from launch.user_errors import in_flag_terms
from tests import grouped_launches
from tests.multiworker import sharded_steps
from tests.multiworker.data_parallel_steps import load_state
from tests.run_outputs import checkpoint_values, train_scalars
from tfscale import exchanges
from tfscale.data.synthetic import SyntheticCTR
from tfscale.embedding import initializers
from tfscale.embedding.field_embedding import FieldEmbedding
from tfscale.embedding.initializers import RowSeededNormal
from tfscale.embedding.table import RowShard
from tfscale.errors import UserError
from tfscale.optimizers import CAME, CowClip, FusedAdam, RowSparseAdam, RowSparseCAME, table_state
from tfscale.optimizers.loss_scaling import LossScaleOptimizer
from tfscale.training.train_step import TrainStepModel

FLOAT32_RUNS = [run for run in sharded_steps.RUNS if not run.startswith("float16")]
# CAME's column statistics, row-statistics mean and RMS are sums over every row of a table (by
# row: over the batch's rows): summed per shard and then over the ranks, they differ from one
# process's sums in the last bits, which its normalisations amplify to about 1e-5 absolute in
# its momentum after 20 steps.
RTOL = {"came": 1e-4, "came_rows": 1e-4}


STEPS_DIR = "{dir}/sharding/steps"
REFERENCE = grouped_launches.job("sharded-steps-reference", 1, "tests.multiworker.sharded_steps",
                                 STEPS_DIR, timeout=600)
SHARDED_STEPS = {num_ranks: grouped_launches.job(
    f"sharded-steps-P{num_ranks}", num_ranks, "tests.multiworker.sharded_steps", STEPS_DIR,
    timeout=900, before_horovod=True) for num_ranks in (2, 3, 4)}


@grouped_launches.prepare
def _output_directories(directory):
    for name in ("steps", "launcher"):
        (directory / "sharding" / name).mkdir(parents=True)


@pytest.fixture(scope="module")
def reference(launched_jobs):
    job = launched_jobs[REFERENCE]
    assert job.returncode == 0, job.output
    steps_dir = launched_jobs.path(STEPS_DIR)
    return {run: load_state(steps_dir / f"{run}-reference.npz") for run in FLOAT32_RUNS}


@pytest.fixture(scope="module")
def initial_state():
    """The model variables as built (the trained state's first entries, the same for every
    float32 run), for 'they moved'."""
    data = SyntheticCTR(seed=0, train_rows=10, test_rows=10, vocabulary_scale=0.002)
    keras.utils.set_random_seed(0)
    model = models.build_model("deepfm", data.schema, hidden_units=[32, 32])
    return [v.numpy() for v in model.variables]


def test_every_sharded_run_is_compared_at_some_number_of_ranks():
    assert set().union(*sharded_steps.RUNS_AT.values()) == set(sharded_steps.RUNS)


@pytest.mark.parametrize("num_ranks", [2, 3, 4])
def test_sharded_ranks_match_one_replicated_process(reference, initial_state, launched_jobs,
                                                    num_ranks):
    result = launched_jobs[SHARDED_STEPS[num_ranks]]
    assert result.returncode == 0, result.output
    assert result.output.count("edge cases ok") == num_ranks, result.output
    assert result.output.count("bfloat16 lookup ok") == num_ranks, result.output
    assert result.output.count("built before Horovod refused") == num_ranks, result.output
    steps_dir = launched_jobs.path(STEPS_DIR)
    stale, synchronous = reference["cowclip_scalable_stale1"], reference["cowclip_scalable"]
    assert any(not np.allclose(a, b) for a, b in zip(stale, synchronous))  # the lag is real
    for run in [run for run in FLOAT32_RUNS if run in sharded_steps.RUNS_AT[num_ranks]]:
        states = [load_state(steps_dir / f"{run}-row-P{num_ranks}-rank{r}.npz")
                  for r in range(num_ranks)]
        assert len(states[0]) == len(reference[run])
        for i, want in enumerate(reference[run]):
            for rank, state in enumerate(states):
                if state[i].size == 0:  # a shard's own scalar (CowClip's clip statistics)
                    continue
                np.testing.assert_allclose(state[i], want, rtol=RTOL.get(run, 1e-5),
                                           atol=1e-6, err_msg=f"{run}, variable {i}, rank {rank}")
        moved = [np.abs(a - b).max() for a, b in zip(states[0], initial_state)
                 if a.size and a.shape == b.shape]
        assert max(moved) > 0, run
    for r in range(num_ranks if "float16_adam" in sharded_steps.RUNS_AT[num_ranks] else 0):
        row = load_state(steps_dir / f"float16_adam-row-P{num_ranks}-rank{r}.npz")
        replicated = load_state(steps_dir / f"float16_adam-replicated-P{num_ranks}-rank{r}.npz")
        for i, (got, want) in enumerate(zip(row, replicated)):
            np.testing.assert_array_equal(got, want, err_msg=f"float16, variable {i}, rank {r}")


def _trained(sharding, optimizer, steps=3, dtype="float32"):
    source = SyntheticCTR(seed=0, train_rows=4096, test_rows=256, vocabulary_scale=0.002)
    keras.utils.set_random_seed(0)
    model = models.build_model("deepfm", source.schema, hidden_units=[16],
                               embedding_sharding=sharding, dtype=dtype)
    model.compile(optimizer=optimizer(), loss="binary_crossentropy")
    batch = next(iter(source.train_batches(512)))
    for _ in range(steps):
        model.train_on_batch(*batch)
    return model


@pytest.mark.parametrize("optimizer", [
    lambda: FusedAdam(1e-2),
    lambda: CAME(1e-3),
    lambda: RowSparseCAME(1e-3, table_l2=1e-4),
    lambda: CowClip(RowSparseAdam(1e-2, name="embedding"), FusedAdam(1e-2, name="dense"),
                    mode="scalable", r=0.05),
    lambda: CowClip(FusedAdam(1e-2, name="embedding"), FusedAdam(1e-2, name="dense"), l2=1e-4),
])
@pytest.mark.parametrize("dtype", ["float32", "mixed_float16"])
def test_one_process_sharded_equals_replicated_bitwise(optimizer, dtype):
    """(mixed_float16: the shards are read in float32 like the replicated tables.)"""
    if dtype == "mixed_float16":
        make = optimizer
        optimizer = lambda: LossScaleOptimizer(make())  # noqa: E731
    sharded = _trained("row", optimizer, dtype=dtype)
    replicated = _trained("replicated", optimizer, dtype=dtype)
    assert isinstance(sharded.embedding_exchange, exchanges.RowShardedExchange)
    for a, b in zip(sharded.get_weights(), replicated.get_weights()):
        np.testing.assert_array_equal(a, b)
    assert table_state.describe(sharded).startswith(
        "tables row-sharded over 1 ranks: 374,398 rows, ")
    assert table_state.describe(replicated).startswith("tables replicated: 374,398 rows, ")


@pytest.mark.parametrize("num_shards", [1, 2, 3, 4, 7])
def test_initial_rows_do_not_depend_on_the_number_of_shards(num_shards):
    initializer = RowSeededNormal(stddev=0.1, seed=3)
    whole = initializer((70_000, 4)).numpy()  # two blocks of rows
    for index in range(num_shards):
        shard = RowShard(70_000, num_shards, index)
        np.testing.assert_array_equal(initializer.rows(shard.global_ids(), 4).numpy(),
                                      whole[shard.global_ids()])
    assert RowShard(3, 4, 3).rows == 0
    assert [RowShard(10, 4, i).rows for i in range(4)] == [3, 3, 2, 2]


@pytest.mark.parametrize("dim", [4, 3])
def test_initial_rows_follow_the_rule_and_are_independent(dim):
    """Row i is values [i * dim, (i + 1) * dim) of one stateless normal draw from the seed (the
    module's rule, restated here with the Philox stream drawn whole), times stddev plus mean;
    rows of different windows are uncorrelated; a shard's rows from three windows (at offsets
    inside a Philox counter step when dim is odd) are the rule's rows."""
    chunk, seed, mean, stddev = initializers.CHUNK_ROWS, 11, 0.5, 0.1
    initializer = RowSeededNormal(mean=mean, stddev=stddev, seed=seed)
    rows = 2 * chunk + 5
    key, counter = tf.raw_ops.StatelessRandomGetKeyCounter(seed=tf.constant([seed, 0], tf.int64))
    stream = tf.raw_ops.StatelessRandomNormalV2(shape=[rows * dim], key=key, counter=counter,
                                                alg=tf.random.Algorithm.PHILOX.value)
    rule = mean + stddev * stream.numpy().reshape(rows, dim)

    whole = initializer((rows, dim)).numpy()
    np.testing.assert_allclose(whole, rule, rtol=1e-6, atol=1e-7)
    first, second = whole[:chunk], whole[chunk:2 * chunk]
    correlation = np.corrcoef(first.ravel(), second.ravel())[0, 1]
    assert abs(correlation) < 0.02, correlation  # 196,608+ pairs: |r| ~ 0.002 if independent
    np.testing.assert_allclose(whole.mean(), mean, atol=3e-3)
    np.testing.assert_allclose(whole.std(), stddev, rtol=1e-2)
    ids = np.array([0, 3, chunk - 1, chunk, chunk + 3, 2 * chunk + 1, 2 * chunk + 4], np.int64)
    np.testing.assert_array_equal(initializer.rows(ids, dim).numpy(), whole[ids])
    in_a_range = np.arange(7, chunk + 9)  # drawn at once, from inside a counter step if dim is odd
    np.testing.assert_array_equal(initializer.rows(in_a_range, dim).numpy(), whole[in_a_range])


def test_a_philox_counter_advances_with_a_carry():
    assert initializers._advanced(np.array([2**64 - 2, 7], np.uint64), 5).numpy().tolist() == [3, 8]
    assert initializers._advanced(np.array([0, 2**64 - 1], np.uint64), 1).numpy().tolist() == [1, 2**64 - 1]


def test_the_wire_dtype_is_checked_kept_in_the_config_and_given_by_the_launcher():
    from absl import flags
    from absl.testing import flagsaver

    from launch import hybrid_flags, train  # noqa: F401  (defines the launcher's flags)
    from tfscale.embedding import strategies
    from tfscale.embedding.row_sharding import RowSharded

    with pytest.raises(UserError, match=r"`wire_dtype='float16'`: give one of float32, bfloat16"):
        RowSharded(wire_dtype="float16")
    assert RowSharded().get_config() == "row"
    config = RowSharded(wire_dtype="bfloat16").get_config()
    assert config == {"name": "row", "wire_dtype": "bfloat16"}
    assert strategies.get(config).wire_dtype == "bfloat16"
    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()
    with flagsaver.flagsaver(embedding_sharding="row", sharded_wire_dtype="bfloat16"):
        assert strategies.get(hybrid_flags.table_strategy()).get_config() == config
    with flagsaver.flagsaver(embedding_sharding="row"):
        assert hybrid_flags.table_strategy() == "row"
    with flagsaver.flagsaver(embedding_sharding="replicated", sharded_wire_dtype="bfloat16"):
        with pytest.raises(UserError, match="--sharded_wire_dtype=bfloat16 goes with "
                                            "--embedding_sharding=row"):
            hybrid_flags.table_strategy()
    with flagsaver.flagsaver(embedding_sharding="row", sharded_wire_dtype="bfloat16",
                             dynamic_capacity=5):
        with pytest.raises(UserError, match="--dynamic_capacity=5 goes with --embedding_sharding=dynamic"):
            hybrid_flags.table_strategy()


def test_refusals_name_the_argument():
    schema = SyntheticCTR(seed=0, train_rows=10, test_rows=10, vocabulary_scale=0.002).schema
    model = models.build_model("deepfm", schema, hidden_units=[8], embedding_sharding="row")
    with pytest.raises(UserError, match="`embedding_exchange=gtopk` cannot be used with "
                                        "row-sharded tables"):
        model.compile("adam", "binary_crossentropy", embedding_exchange="gtopk")
    with pytest.raises(UserError, match="`embeddings_initializer=RandomNormal`"):
        FieldEmbedding([5, 5], embeddings_initializer="random_normal", sharding="row")
    with pytest.raises(UserError, match="cannot carry a Keras regularizer"):
        FieldEmbedding([5, 5], embeddings_regularizer="l2", sharding="row")
    with pytest.raises(ValueError, match="`sharding='column'`: give one of replicated, row"):
        FieldEmbedding([5, 5], sharding="column")
    with pytest.raises(UserError, match="`deduplicate=False` cannot be used with `sharding=row`"):
        FieldEmbedding([5, 5], deduplicate=False, sharding="row")
    assert in_flag_terms("`deduplicate=False` cannot be used with `sharding=row`") == (
        "--dedup_ids=False cannot be used with --embedding_sharding=row")


class SubclassedSharded(TrainStepModel):
    """A subclassed model with row-sharded tables: no variables until its first call."""

    def __init__(self):
        super().__init__()
        self.fields = FieldEmbedding([5, 7], embedding_dim=2, sharding="row")
        self.out = keras.layers.Dense(1)

    def call(self, ids):
        return self.out(keras.ops.reshape(self.fields(ids), (-1, 4)))


def test_a_subclassed_model_compiled_before_its_first_call_keeps_its_shards_local():
    """Its shards have no variables at `compile`, but their gradients must still stay out of the
    averaging exchange."""
    model = SubclassedSharded()
    model.compile(RowSparseAdam(1e-3), "mse")
    assert not model.variables
    assert isinstance(model.embedding_exchange, exchanges.RowShardedExchange)
    model.fit(np.array([[1, 2], [3, 6]]), np.ones((2, 1)), verbose=0)


def test_a_keras_optimizer_that_would_update_a_shard_whole_is_refused():
    """A plain Keras optimizer would densify a shard's gradient and update every row each step:
    refused naming the table; tfscale's dense update (FusedAdam) is allowed."""
    model = SubclassedSharded()
    model.compile(keras.optimizers.Adam(1e-3), "mse")
    refused = (r"Adam would update the row-sharded table .*embeddings whole every step: give "
               r"it an optimizer that updates it by row \(`embedding_update=row`: RowSparseAdam")
    with pytest.raises(UserError, match=refused):
        model.fit(np.array([[1, 2], [3, 6]]), np.ones((2, 1)), verbose=0)
    built = SubclassedSharded()  # built: refused at compile
    built(np.array([[1, 2]]))
    with pytest.raises(UserError, match=refused):
        built.compile(keras.optimizers.Adam(1e-3), "mse")
    model = SubclassedSharded()
    model.compile(FusedAdam(1e-3), "mse")
    model.fit(np.array([[1, 2], [3, 6]]), np.ones((2, 1)), verbose=0)


def test_an_optimizer_with_undeclared_state_of_a_shard_is_refused():
    """Keras's Adafactor keeps column statistics of a table that it would not sum over the
    shards; CAME declares its own and sums them. (TrainStep's compile refuses Adafactor first,
    as a whole update of a shard: Keras's compile alone gives it here.)"""
    with pytest.raises(UserError, match="Adafactor would update the row-sharded table"):
        _trained("row", lambda: keras.optimizers.Adafactor(), steps=0)
    model = _trained("row", CAME, steps=0)
    keras.Model.compile(model, optimizer=keras.optimizers.Adafactor(),
                        loss="binary_crossentropy")
    model.optimizer.build(model.trainable_variables)
    with pytest.raises(UserError, match="Adafactor keeps adafactor(_1)?/embeddings of shape .* for the "
                                        "row-sharded table .*: state that is neither per row"):
        table_state.local_variables(model)
    model = _trained("row", CAME, steps=0)
    model.optimizer.build(model.trainable_variables)
    local = [v.path.split("deep_embedding")[-1] for v in table_state.local_variables(model)
             if "deep_embedding" in v.path]
    assert local == ["/embeddings", "_embeddings_momentum", "_embeddings_row",
                     "_embeddings_instability_row"], local


# (mode, the tables' sharding, ranks, checkpoint directory, launch stage), in the order checked:
# a checkpoint written by 2 ranks with row-sharded tables is read at P = 3 and by one process
# with replicated tables; one written by one process with replicated tables is read at P = 2.
RESHARDS = [("write", "row", 2, "sharded", 0), ("read", "row", 3, "sharded", 0),
            ("read", "replicated", 1, "sharded", 1), ("write", "replicated", 1, "replicated", 0),
            ("read", "row", 2, "replicated", 1)]
RESHARD_JOBS = [grouped_launches.job(
    f"reshard-{mode}-{sharding}-P{ranks}", ranks, "tests.multiworker.reshard_checkpoint", mode,
    sharding, f"{{dir}}/sharding/{checkpoint}", stage=stage)
    for mode, sharding, ranks, checkpoint, stage in RESHARDS]


def test_checkpoints_resume_at_another_number_of_ranks_and_sharding(launched_jobs):
    """Each rank writes its own rows; a restore at P = 1, 3 or with replicated tables holds
    exactly the checkpoint's tables and Adam moments or CAME statistics (and every other
    variable) and trains on; a replicated checkpoint resumes row-sharded."""
    for (mode, sharding, num_ranks, checkpoint, _), name in zip(RESHARDS, RESHARD_JOBS):
        job = launched_jobs[name]
        assert job.returncode == 0, job.output
        if mode == "read":
            for optimizer in ("adam", "came"):
                assert job.output.count(f"restored {sharding} tables and {optimizer} state "
                                        "exactly") == num_ranks, job.output
        elif sharding == "row":
            written = launched_jobs.path(f"{{dir}}/sharding/{checkpoint}")
            assert sorted(p.name for p in next(written.glob("adam/step-*")).glob("tables-*")) \
                == [f"tables-{i}-of-{num_ranks}.npz" for i in range(num_ranks)]


# 7,680 rows / 384 = 20 steps per epoch at any P of 2, 3, 4; CowClip, whose state per row is the
# largest.
SHARDED_DATA = dict(seed=0, train_rows=7680, test_rows=1000, vocabulary_scale=0.002)
SHARDED_BATCH = 384
SHARDED_RUN = ["--embedding_sharding=row",
               f"--train_rows={SHARDED_DATA['train_rows']}",
               f"--test_rows={SHARDED_DATA['test_rows']}",
               f"--synthetic_vocabulary_scale={SHARDED_DATA['vocabulary_scale']}",
               "--dnn_units=32,32", f"--batch_size={SHARDED_BATCH}", "--log_every_steps=10",
               "--checkpoint_every_steps=10", "--logdir=none", "--optimizer=cowclip"]
DEEP_TABLE = "deepfm/field_embedding/deep_embedding/embeddings"
WIDE_TABLE = "deepfm/field_embedding/wide_embedding/embeddings"


def _expected_alltoall_bytes(step, rank, num_ranks, widths):
    """(sent, received) payload bytes of rank `rank`'s lookup at global step `step` (1-based, in
    the first epoch) of SHARDED_RUN on `num_ranks` ranks and its backward pass, from every
    rank's batch: each rank's unique rows (field id + field offset); the owner of row i is
    i mod P; an (id, count) pair per row asked of another rank, two int32s while the table's ids
    fit in int32 (else int64); a float32 row of every table (`widths`) back per pair received,
    and a float32 row gradient of every table back to the owner per row received."""
    data = SyntheticCTR(**SHARDED_DATA)
    sizes = np.array(data.schema.vocabulary_sizes, np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    unique = []
    for r in range(num_ranks):
        features, _ = next(iter(data.train_batches(
            SHARDED_BATCH // num_ranks, skip_batches=step - 1, shard_index=r,
            num_shards=num_ranks)))
        unique.append(np.unique(features["categorical"].numpy() + offsets))
    asked_of_others = int(np.sum(unique[rank] % num_ranks != rank))
    asked_by_others = sum(int(np.sum(unique[r] % num_ranks == rank))
                          for r in range(num_ranks) if r != rank)
    pair = 2 * (4 if sizes.sum() <= np.iinfo(np.int32).max else 8)
    row = 4 * sum(widths)
    sent = pair * asked_of_others + row * asked_by_others + row * asked_of_others
    received = pair * asked_by_others + row * asked_of_others + row * asked_by_others
    return sent, received


def _whole_tables(step_dir):
    """{variable: whole array} of a checkpoint's tables files, each file's rows put at their
    global ids (row k of shard i of n is id i + n k); every row written exactly once."""
    files = sorted(step_dir.glob("tables-*-of-*.npz"))
    stored = []
    for path in files:
        with np.load(path) as arrays:
            stored.append(dict(arrays))
    whole, num_shards = {}, len(files)
    for name in stored[0]:
        parts = [arrays[name] for arrays in stored]
        table = np.full((sum(len(p) for p in parts),) + parts[0].shape[1:], np.nan, parts[0].dtype)
        for path, part in zip(files, parts):
            index = int(path.name.split("-")[1])
            assert path.name == f"tables-{index}-of-{num_shards}.npz", path
            table[index::num_shards] = part
        assert not np.isnan(table).any(), name
        whole[name] = table
    return whole


STALE_RUN = [*SHARDED_RUN, "--embedding_staleness=1"]
LAUNCHER_DIR = "{dir}/sharding/launcher"
# 1 step stale at P = 2: a whole run with logs, and one stopped after step 15 (its last
# checkpoint: step 10), resumed in a later launch.
WHOLE = grouped_launches.launcher_job("sharded-launcher-whole", 2, *STALE_RUN,
                                      f"--checkpoint_dir={LAUNCHER_DIR}/whole",
                                      f"--logdir={LAUNCHER_DIR}/logs")
STOPPED = grouped_launches.launcher_job("sharded-launcher-stopped", 2, *STALE_RUN,
                                        f"--checkpoint_dir={LAUNCHER_DIR}/split",
                                        "--stop_after_steps=15")
RESUMED = grouped_launches.launcher_job("sharded-launcher-resumed", 2, *STALE_RUN,
                                        f"--checkpoint_dir={LAUNCHER_DIR}/split", "--resume",
                                        stage=1)
# Synchronous: a job of 3 ranks stopped after step 15 goes on with 2, which write the tables and
# their per-row state they restored to restored.npz.
STOPPED_3 = grouped_launches.launcher_job("sharded-launcher-stopped-P3", 3, *SHARDED_RUN,
                                          f"--checkpoint_dir={LAUNCHER_DIR}/shrunk",
                                          "--stop_after_steps=15")
RESUMED_ON_2 = grouped_launches.job(
    "sharded-launcher-resumed-on-2", 2, "tests.multiworker.launcher_resume",
    f"{LAUNCHER_DIR}/restored.npz", *SHARDED_RUN, f"--checkpoint_dir={LAUNCHER_DIR}/shrunk",
    "--resume", stage=1)


def _succeeded(launched_jobs, name):
    """The stdout of job `name`'s ranks, horovodrun's way; the job must have succeeded."""
    job = launched_jobs[name]
    assert job.returncode == 0, job.output
    return job.output


def test_sharded_launcher_run_reports_its_tables_and_alltoall_bytes(launched_jobs):
    """Rank 0's alltoall byte counters equal those computed from the last step's ids, its table
    bytes its share of rows."""
    out = _succeeded(launched_jobs, WHOLE)
    # Rank 0 holds rows 0, 2, 4, ... of the deep and the wide table (float32).
    rank0_rows = len(range(0, SyntheticCTR(**SHARDED_DATA).schema.total_vocabulary, 2))
    assert re.search(rf"tables row-sharded over 2 ranks: {2 * rank0_rows:,} rows, [0-9,]+ MB "
                     r"with optimizer state per rank", out), out
    expected = checkpoint_values(launched_jobs.path(f"{LAUNCHER_DIR}/whole"))
    widths = [expected[f"tables-0-of-2/{t}"].shape[1] for t in (DEEP_TABLE, WIDE_TABLE)]
    scalars = train_scalars(launched_jobs.path(f"{LAUNCHER_DIR}/logs"))
    assert scalars["sharding/table_bytes"] == rank0_rows * 4 * sum(widths), scalars
    # The last values written are the epoch's last step's.
    last_step = SHARDED_DATA["train_rows"] // SHARDED_BATCH
    sent, received = _expected_alltoall_bytes(last_step, 0, 2, widths)
    assert scalars["sharding/alltoall_bytes_sent"] == sent, (scalars, sent)
    assert scalars["sharding/alltoall_bytes_received"] == received, (scalars, received)
    assert scalars["sharding/lookup_seconds"] > 0, scalars
    assert scalars["embedding/staleness"] == 1, scalars


def test_stale_sharded_launcher_run_resumes_bitwise(launched_jobs):
    """1 step stale at P = 2: each rank's queues of its shards' gradients are checkpointed with
    them."""
    _succeeded(launched_jobs, WHOLE)
    _succeeded(launched_jobs, STOPPED)
    out = _succeeded(launched_jobs, RESUMED)
    assert "resumed from global step 10: epoch 1, batch 10" in out, out
    expected = checkpoint_values(launched_jobs.path(f"{LAUNCHER_DIR}/whole"))
    actual = checkpoint_values(launched_jobs.path(f"{LAUNCHER_DIR}/split"))
    assert expected.keys() == actual.keys()
    assert any(name.startswith("tables-1-of-2/") for name in expected), list(expected)
    assert any("staleness" in name for name in expected), list(expected)
    for name in expected:
        np.testing.assert_array_equal(expected[name], actual[name], err_msg=name)


def test_sharded_launcher_run_continues_on_fewer_ranks(launched_jobs):
    """Synchronous, from 3 ranks to 2 (queues belong to their rank's rows): the 2 ranks resume
    with exactly the 3 ranks' tables and per-row CowClip state."""
    _succeeded(launched_jobs, STOPPED_3)
    out = _succeeded(launched_jobs, RESUMED_ON_2)
    assert "resumed from global step 10: epoch 1, batch 10" in out, out
    assert re.search(r"final test AUC 0\.\d{4}", out), out
    shrunk = launched_jobs.path(f"{LAUNCHER_DIR}/shrunk")
    assert sorted(p.name for p in shrunk.glob("step-*/tables-*")) == [
        "tables-0-of-2.npz", "tables-0-of-3.npz", "tables-1-of-2.npz", "tables-1-of-3.npz",
        "tables-2-of-3.npz"]
    reference = _whole_tables(shrunk / "step-0000000010")
    with np.load(launched_jobs.path(f"{LAUNCHER_DIR}/restored.npz")) as restored:
        assert sorted(restored.files) == sorted(reference), (restored.files, list(reference))
        for name, want in reference.items():
            np.testing.assert_array_equal(restored[name], want, err_msg=name)
    for table in (DEEP_TABLE, WIDE_TABLE):  # each table with its Adam moments (CowClip's)
        assert {f"embedding/{table.replace('/', '_')}_moments", table} <= set(reference), list(
            reference)
    final = _whole_tables(shrunk / "step-0000000020")
    assert all(np.abs(final[name] - want).max() > 0 for name, want in reference.items())
