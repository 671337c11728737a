"""Row-sharded tables under horovodrun (any number of ranks) with an output directory: a job of
tests/multiworker/jobs.py, the first of its launch (it tries to build a model before Horovod
starts).

Each rank trains a small DeepFM with row-sharded tables for STEPS steps on its B/P slice of every
global batch, for each optimizer of RUNS_AT[P] (a run named *_stale<T> with embedding updates T
steps stale: the reference is then stale too), gathers the whole tables and their optimizer state
from the shards (for the comparison only) and writes them with the other variables (model
variables, then optimizer variables) to OUT_DIR/<run>-row-P<P>-rank<r>.npz; the float16 run is also
trained with replicated tables (OUT_DIR/<run>-replicated-P<P>-rank<r>.npz), and then takes one more
step with inf in rank 1's features, which every rank must skip with its shards and their slots
unchanged. Run without horovodrun, it trains the one-process reference of each float32 run with
replicated tables on the whole global batches and writes OUT_DIR/<run>-reference.npz.

Under horovodrun it also checks that building a model with row-sharded tables before Horovod
starts is refused on every rank ("built before Horovod refused"), and, printing "edge cases ok": the lookup of a 3-row
table (rank 3 of 4 owns no row) where every rank looks up the same id, ids only one rank looks up,
and ranks whose batch holds no id of some owners (empty splits), against the gathered whole table,
with the gradient each owner receives, rows and gradients in float32 and in bfloat16 on the wire
(printing "bfloat16 lookup ok"); and an inf in one rank's shard gradient alone makes every
rank's RowShardedExchange hand NaN shard gradients (so every loss scaler skips); the lookup's
alltoall byte counters equal the bytes computed from every rank's ids. Used by
tests/test_sharding.py."""

import dataclasses
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import models  # noqa: E402
from tfscale import distributed, exchanges  # noqa: E402
from tfscale.data.synthetic import SyntheticCTR  # noqa: E402
from tfscale.embedding import row_sharding  # noqa: E402
from tfscale.embedding.table import shard_of  # noqa: E402
from tfscale.errors import UserError  # noqa: E402
from tfscale.optimizers import (CAME, CowClip, FusedAdam, RowSparseAdam, factory,  # noqa: E402
                                large_batch_settings)
from tfscale.optimizers.loss_scaling import LossScaleOptimizer  # noqa: E402
from tfscale.optimizers.table_state import local_variables  # noqa: E402
from tfscale.step_scalars import StepScalars  # noqa: E402
from tfscale.training.run import build_model_and_optimizer  # noqa: E402

GLOBAL_BATCH = 384  # divides over 2, 3 and 4 ranks
STEPS = 20
RUNS = ("adam", "adam_rows", "came", "came_rows", "cowclip_faithful", "cowclip_scalable",
        "cowclip_scalable_stale1", "float16_adam", "rowwise_adagrad_rows")
# The runs each number of ranks trains: each run at one number of ranks, the launcher's default
# (adam_rows) at 2 and 3; 3 ranks split the rows unevenly, and at 4 a rank of the edge cases owns
# no row. A run costs every rank a model build and a trace, which made these launches the test
# suite's longest on 2 cores when every run trained at every number of ranks.
RUNS_AT = {2: ("adam_rows", "came", "cowclip_scalable", "float16_adam"),
           3: ("adam_rows", "came_rows", "cowclip_scalable_stale1", "rowwise_adagrad_rows"),
           4: ("adam", "cowclip_faithful")}


def make_optimizer(run):
    if run == "adam":
        return FusedAdam(learning_rate=1e-3)
    if run in ("adam_rows", "came_rows", "rowwise_adagrad_rows"):  # the launcher's: L2 on rows
        settings = dataclasses.replace(large_batch_settings(GLOBAL_BATCH, "sqrt", "synthetic"),
                                       l2=1e-4)
        return factory.build_optimizer(settings, run.removesuffix("_rows"), warmup_steps=5)
    if run == "float16_adam":
        return LossScaleOptimizer(FusedAdam(learning_rate=1e-3))
    if run == "came":
        return CAME(learning_rate=1e-4)
    mode = run.split("_")[1]  # cowclip_<mode>[_stale<T>]
    l2 = 1e-4
    embedding = (FusedAdam(1e-3, name="embedding") if mode == "faithful"
                 else RowSparseAdam(1e-3, catch_up_l2=l2, name="embedding"))
    # r = 0.05 clips some rows (tests/test_hybrid.py uses the same)
    return CowClip(embedding, FusedAdam(1e-3, name="dense"), r=0.05, l2=l2, mode=mode)


def trained(run, sharding, rank, num_ranks):
    """(model, data) after STEPS steps of `run` with `sharding` on rank `rank`'s slices."""
    data = SyntheticCTR(seed=0, train_rows=GLOBAL_BATCH * STEPS, test_rows=256,
                        vocabulary_scale=0.002)
    keras.utils.set_random_seed(0)
    model = models.build_model(
        "deepfm", data.schema, hidden_units=[32, 32], embedding_sharding=sharding,
        dtype="mixed_float16" if run.startswith("float16") else "float32")
    staleness = int(run.split("_stale")[1]) if "_stale" in run else 0
    model.compile(optimizer=make_optimizer(run), loss=keras.losses.BinaryCrossentropy(),
                  embedding_staleness=staleness)
    assert isinstance(model.embedding_exchange, exchanges.StaleExchange) == bool(staleness)
    build_model_and_optimizer(model, data.schema)
    distributed.broadcast_model_and_optimizer(model, local=local_variables(model))
    model.fit(rank_batches(data, rank, num_ranks), epochs=1, verbose=0, shuffle=False)
    assert int(model.optimizer.iterations) == STEPS
    return model, data


def rank_batches(data, rank, num_ranks):
    """Rank `rank`'s contiguous 1/num_ranks of every global batch, of known length."""
    size = GLOBAL_BATCH // num_ranks
    batches = data.train_batches(GLOBAL_BATCH).map(
        lambda features, labels: ({k: v[rank * size:(rank + 1) * size]
                                   for k, v in features.items()},
                                  labels[rank * size:(rank + 1) * size]))
    return batches.apply(tf.data.experimental.assert_cardinality(STEPS))


def check_skip_on_inf(model, data, rank, num_ranks):
    """One more step with inf in rank 1's dense features: every rank skips it, keeping its
    shards and their optimizer state bitwise."""
    features, labels = next(iter(rank_batches(data, rank, num_ranks)))
    if rank == 1:
        features = dict(features, dense=tf.fill(tf.shape(features["dense"]), np.inf))
    local = local_variables(model)
    before = [v.numpy() for v in local]
    skipped = int(model.optimizer.skipped_steps.numpy())
    model.train_on_batch(features, labels)
    assert int(model.optimizer.skipped_steps.numpy()) == skipped + 1, rank
    for variable, value in zip(local, before):
        np.testing.assert_array_equal(variable.numpy(), value, err_msg=variable.path)


def whole_state(model):
    """model_state with every row-sharded table and per-row slot replaced by the whole one
    (gathered from every rank by global id); per-rank scalars of shards (CowClip's clip
    statistics of its own rows) as None. State spanning every row (CAME's column statistics)
    is whole on every rank already."""
    local = local_variables(model)
    shards = {v.path.replace("/", "_") + "_": shard_of(v)
              for v in local if shard_of(v) is not None}
    state = []
    for variable in list(model.variables) + list(model.optimizer.variables):
        shard = shard_of(variable)
        name = variable.path.split("/")[-1]
        slot_of = next((s for prefix, s in shards.items() if name.startswith(prefix)), None)
        if shard is None and slot_of is not None:
            if len(variable.shape) == 0:
                state.append(None)
                continue
            if any(variable is v for v in local):
                shard = slot_of
        state.append(variable.numpy() if shard is None else gathered(variable, shard))
    return state


def gathered(variable, shard):
    """The whole table of which `variable` holds `shard`'s rows."""
    engine = distributed.engine()
    values = tf.convert_to_tensor(variable)
    ids = tf.constant(shard.global_ids())
    if engine is not None:
        values = engine.allgather(values, "gathered_values")
        ids = engine.allgather(ids, "gathered_ids")
    whole = np.zeros((shard.total_rows,) + tuple(variable.shape[1:]), values.dtype.as_numpy_dtype)
    whole[ids.numpy()] = values.numpy()
    return whole


def sharded_table(name, rows):
    """A built row-sharded Table of `rows` x 2 zeros."""
    strategy = row_sharding.RowSharded()
    table = strategy.make_table(name, rows, 2, keras.initializers.Constant(0.0), None,
                                "float32")
    strategy.build(table, embedding=None)  # no FieldEmbedding: a table on its own
    return table


def check_edge_cases():
    """The lookup and the shards' finite decision on hand-made cases (see the module)."""
    rank, size = distributed.rank(), distributed.size()
    for wire_dtype in ("float32", "bfloat16"):
        check_lookup(rank, size, wire_dtype)
    check_finite_decision(rank)


def check_lookup(rank, size, wire_dtype):
    """The lookup of a 3-row table with rows and gradients in `wire_dtype` on the wire: the rows,
    the gradient each owner receives and the byte counters (see the module)."""
    def on_the_wire(values):
        if wire_dtype == "float32":
            return np.asarray(values, np.float32)
        return tf.cast(tf.cast(values, tf.bfloat16), tf.float32).numpy()

    keras.utils.set_random_seed(1)
    table = sharded_table(f"edge3_{wire_dtype}", 3)
    shard = table.shard
    ids = shard.global_ids()
    # A third is not a bfloat16: rounded on the wire, the rows are seen to be.
    whole = lambda i: np.stack([i * 10.0 + 1 / 3, i * 10.0 + 1], axis=1).astype(np.float32)  # noqa: E731
    table.variable.assign(whole(ids))
    # Every rank looks up id 0; rank r also looks up id 1 + r (beyond the table: skipped) and
    # rank 0 id 2 twice: some ranks send nothing to some owners.
    def wanted_by(r):
        return [0] + ([1 + r] if 1 + r < 3 else []) + ([2, 2] if r == 0 else [])

    wanted = wanted_by(rank)
    rows = tf.constant(wanted, tf.int64)
    scalars = StepScalars()

    @tf.function
    def look_up_and_differentiate():
        with tf.GradientTape() as tape:
            (vectors,) = row_sharding.lookup([table], rows, name=f"edge_{wire_dtype}",
                                             scalars=scalars, wire_dtype=wire_dtype)
            loss = tf.reduce_sum(vectors * tf.cast(rank + 1, tf.float32))
        return vectors, tape.gradient(loss, table.variable.value)

    vectors, gradient = look_up_and_differentiate()
    np.testing.assert_array_equal(vectors.numpy(), on_the_wire(whole(np.array(wanted))))
    # The owner's gradient of id i: sum over ranks r of (r + 1) x occurrences of i on rank r,
    # divided by P (each rank's loss is its share of the global mean), each rank's share on the
    # wire.
    occurrences = np.zeros((size, 3))
    for r in range(size):
        for i in wanted_by(r):
            occurrences[r, i] += 1
    expected = on_the_wire(occurrences * np.arange(1, size + 1)[:, None] / size).sum(axis=0)
    dense = tf.convert_to_tensor(gradient).numpy() if shard.rows else np.zeros((0, 2))
    np.testing.assert_allclose(dense, np.repeat(expected[ids][:, None], 2, axis=1), rtol=1e-6)
    # The payload bytes: an (id, count) pair of int32s (3 rows fit) per unique id asked of its
    # owner (id mod P), a row of 2 back per pair, a row gradient to the owner per row, each
    # value 4 bytes (float32) or 2 (bfloat16) on the wire.
    value_bytes = 2 if wire_dtype == "bfloat16" else 4
    asked_of_others = len({i for i in wanted if i % size != rank})
    asked_by_others = sum(len({i for i in wanted_by(r) if i % size == rank})
                          for r in range(size) if r != rank)
    recorded = scalars.summary_scalars()
    assert recorded["sharding/alltoall_bytes_sent"] == (
        8 * asked_of_others + value_bytes * 2 * (asked_by_others + asked_of_others)), (rank,
                                                                                  recorded)
    assert recorded["sharding/alltoall_bytes_received"] == (
        8 * asked_by_others + value_bytes * 2 * (asked_of_others + asked_by_others)), (rank,
                                                                                  recorded)
    print(f"rank {rank}: {wire_dtype} lookup ok", flush=True)


def check_finite_decision(rank):
    """An inf in rank 1's shard gradient alone: every rank's shard gradients become NaN."""
    table = sharded_table("edge8", 8)
    shard = table.shard
    kernel = keras.Variable(np.ones((2, 2), np.float32), name="kernel")
    value = np.inf if rank == 1 else 1.0
    shard_gradient = tf.IndexedSlices(tf.fill([shard.rows, 2], value),
                                      tf.range(shard.rows, dtype=tf.int64),
                                      tf.constant([shard.rows, 2], tf.int64))
    exchange = exchanges.RowShardedExchange(exchanges.AllgatherExchange())
    optimizer = keras.optimizers.SGD()
    result = tf.function(lambda: exchange.exchange(
        [shard_gradient, tf.ones((2, 2))], [table.variable, kernel], optimizer))()
    assert shard.rows and np.isnan(result[0].values.numpy()).all(), (rank, result[0])
    np.testing.assert_array_equal(result[1].numpy(), np.ones((2, 2)))
    print(f"rank {rank}: edge cases ok", flush=True)


def check_built_before_horovod_is_refused():
    """Building a model with row-sharded tables under horovodrun before Horovod starts is refused
    on every rank, naming the line to add (its tables would be sized for one process and the
    ranks would train apart)."""
    data = SyntheticCTR(seed=0, train_rows=64, test_rows=64, vocabulary_scale=0.002)
    try:
        models.build_model("deepfm", data.schema, hidden_units=[8], embedding_sharding="row")
    except UserError as error:
        assert "add `tfscale.distributed.init()` at the top of the script" in str(error), error
        print(f"rank {os.environ['HOROVOD_RANK']}: built before Horovod refused", flush=True)
        return
    raise AssertionError("a model was built under horovodrun before Horovod started")


def main(out_dir):
    if distributed.launched_by_horovodrun():
        check_built_before_horovod_is_refused()
        distributed.init()
        check_edge_cases()
        runs = [(run, "row") for run in RUNS_AT[distributed.size()]]
        if "float16_adam" in RUNS_AT[distributed.size()]:
            runs.append(("float16_adam", "replicated"))
        label = f"P{distributed.size()}-rank{distributed.rank()}"
    else:
        runs = [(run, "replicated") for run in RUNS if not run.startswith("float16")]
        label = "reference"
    rank, size = distributed.rank(), distributed.size()
    for run, sharding in runs:
        model, data = trained(run, sharding, rank, size)
        name = f"{run}-{label}" if label == "reference" else f"{run}-{sharding}-{label}"
        np.savez(os.path.join(out_dir, f"{name}.npz"),
                 *[np.zeros(0) if s is None else s for s in whole_state(model)])
        if run.startswith("float16") and sharding == "row":
            check_skip_on_inf(model, data, rank, size)
    print(f"rank {rank} of {size} done", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
