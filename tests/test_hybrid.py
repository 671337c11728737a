"""Hybrid training in one process (docs/persia.md): host placement of the tables, de-duplicated
lookups (same forward values and summed gradients as plain ones, counts kept for CowClip), and
bounded-staleness embedding updates (staleness 0 is the synchronous step; with T >= 1 the tables
lag exactly T steps, the dense part not at all; a skipped step keeps the queue)."""

import json

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras import ops

from models import DeepFM
from tests.horovod_launch import python
from tfscale import exchanges
from tfscale.data.schema import FeatureSchema
from tfscale.embedding import dedup
from tfscale.embedding.field_embedding import FieldEmbedding
from tfscale.errors import UserError
from tfscale.optimizers import CowClip, RowSparseSGD
from tfscale.optimizers.loss_scaling import LossScaleOptimizer
from tfscale.row_gradients import CountedSlices, sum_duplicate_rows
from tfscale.checkpoints.store import CheckpointStore
from tfscale.training.train_step import TrainStepModel

SCHEMA = FeatureSchema(("d0", "d1"), ("c0", "c1", "c2"), (3, 6, 40))


def batches(count, size, seed=0, schema=SCHEMA):
    rng = np.random.default_rng(seed)
    for _ in range(count):
        # Zipf-like ids: many repeats within a batch, as in real CTR data.
        ids = np.minimum(rng.zipf(1.3, size=(size, schema.num_categorical)) - 1,
                         np.array(schema.vocabulary_sizes) - 1)
        features = {"dense": rng.random((size, schema.num_dense), dtype=np.float32),
                    "categorical": ids.astype(np.int64)}
        yield features, rng.integers(0, 2, size=(size, 1)).astype(np.float32)


# In a fresh process with two logical CPUs, the model is built under `tf.device("/CPU:1")`,
# which stands for an accelerator: the tables and their slots must still land on CPU:0.
PLACEMENT_SCRIPT = """
import json
import tensorflow as tf
cpu, = tf.config.list_physical_devices("CPU")
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import keras
from models import DeepFM
from tests.horovod_launch import python
from tfscale.embedding import placement_report
from tests.test_hybrid import SCHEMA
with tf.device("/CPU:1"):
    model = DeepFM(SCHEMA, hidden_units=(8,))
    model.build()
    model.compile(keras.optimizers.Adam(1e-3), "binary_crossentropy")
    model.optimizer.build(model.trainable_variables)
print(json.dumps({"line": placement_report.describe(model),
                  "gpus": len(tf.config.list_logical_devices("GPU")),
                  "devices": {v.path: v.value.device.rsplit("device:", 1)[-1]
                              for v in model.variables + model.optimizer.variables}}))
"""


def test_tables_and_their_optimizer_state_live_in_host_memory():
    result = python(["-c", PLACEMENT_SCRIPT])
    assert result.returncode == 0, result.stdout
    report = json.loads(result.stdout.strip().splitlines()[-1])
    devices = report["devices"]
    on_host = {path for path in devices if "_embedding" in path}
    assert len(on_host) == 6, devices  # 2 tables, 2 Adam slots each
    assert {devices[path] for path in on_host} == {"CPU:0"}, devices
    assert {d for path, d in devices.items() if path not in on_host} == {"CPU:1"}, devices
    accelerator = "" if report["gpus"] else " (no accelerator found)"
    assert report["line"] == ("placement: embedding tables on CPU:0, dense model on CPU:1"
                              f"{accelerator}")


def _lookup_and_gradient(deduplicate, ids, weights):
    layer = FieldEmbedding((5, 9), embedding_dim=4, use_wide=True, deduplicate=deduplicate)
    layer.build()
    layer.deep_table.embeddings.assign(weights)
    for table in layer.tables:
        table.start_step()
    with tf.GradientTape() as tape:
        embeddings, linear = layer(ids)
        loss = tf.reduce_sum(embeddings * tf.range(1.0, 5.0)) + tf.reduce_sum(linear ** 2)
    record = dedup.LookupRecord.of_step(layer.tables)
    tables = [table.variable for table in layer.tables]
    return embeddings, linear, tape.gradient(loss, tables), record, tables


def test_deduplicated_lookup_gives_the_plain_values_and_summed_gradients_with_counts():
    ids = tf.constant([[1, 2], [1, 2], [4, 2], [1, 0]], tf.int64)
    weights = np.random.default_rng(0).standard_normal((14, 4)).astype("float32")
    plain = _lookup_and_gradient(False, ids, weights)
    deduplicated = _lookup_and_gradient(True, ids, weights)
    np.testing.assert_array_equal(plain[0], deduplicated[0])
    np.testing.assert_array_equal(plain[1], deduplicated[1])
    for plain_gradient, dedup_gradient in zip(plain[2], deduplicated[2]):
        assert len(plain_gradient.indices) == 8  # one row per occurrence
        assert len(dedup_gradient.indices) == 4  # one per unique row: 1, 4 and 5+2, 5+0
        np.testing.assert_allclose(tf.convert_to_tensor(plain_gradient),
                                   tf.convert_to_tensor(dedup_gradient), rtol=1e-6)
    assert not plain[3].tables
    counted = dedup.attach_counts(deduplicated[2], deduplicated[4], deduplicated[3])
    assert all(isinstance(g, CountedSlices) for g in counted)
    ids_plain, rows_plain, counts_plain = sum_duplicate_rows(plain[2][0])
    ids_dedup, rows_dedup, counts_dedup = sum_duplicate_rows(counted[0])
    order_plain, order_dedup = np.argsort(ids_plain), np.argsort(ids_dedup)
    np.testing.assert_array_equal(np.asarray(ids_plain)[order_plain],
                                  np.asarray(ids_dedup)[order_dedup])
    np.testing.assert_array_equal(np.asarray(counts_plain)[order_plain], [3, 1, 1, 3])
    np.testing.assert_array_equal(np.asarray(counts_dedup)[order_dedup], [3, 1, 1, 3])
    np.testing.assert_allclose(np.asarray(rows_plain)[order_plain],
                               np.asarray(rows_dedup)[order_dedup], rtol=1e-6)


def test_a_table_looked_up_twice_in_one_step_is_refused():
    layer = FieldEmbedding((10,), embedding_dim=3)
    layer.build()
    (table,) = layer.tables
    table.start_step()
    layer(tf.constant([[1], [2]]))
    layer(tf.constant([[3]]))
    with pytest.raises(ValueError, match="looked up more than once in one step"):
        dedup.LookupRecord.of_step(layer.tables)
    table.start_step()
    layer(tf.constant([[3]]))
    assert list(dedup.LookupRecord.of_step(layer.tables).tables) == [table.variable.path]


def _trained(optimizer_factory, deduplicate=True, staleness=0, steps=6, size=64, seed=0):
    keras.utils.set_random_seed(seed)
    model = DeepFM(SCHEMA, hidden_units=(8, 8), deduplicate_ids=deduplicate)
    model.build()
    model.compile(optimizer_factory(), "binary_crossentropy", embedding_staleness=staleness)
    for features, labels in batches(steps, size, seed=seed):
        model.train_on_batch(features, labels)
    return model


@pytest.mark.parametrize("optimizer", ["adam", "cowclip"])
def test_deduplicated_and_plain_lookups_train_alike(optimizer):
    def factory():
        if optimizer == "adam":
            return keras.optimizers.Adam(1e-2)
        # A small r clips many rows, so wrong counts would change the update.
        return CowClip(embedding_optimizer=keras.optimizers.Adam(1e-2), l2=1e-4, r=0.05)

    deduplicated = _trained(factory, deduplicate=True)
    plain = _trained(factory, deduplicate=False)
    for a, b in zip(deduplicated.get_weights(), plain.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    if optimizer == "cowclip":  # the counts reached the clip, which clipped rows
        clip, plain_clip = (sorted(m.optimizer.summary_scalars().values())
                            for m in (deduplicated, plain))
        assert clip == pytest.approx(plain_clip, rel=1e-5)
        assert 0 < clip[0] < 1, clip  # the clipped fraction


def test_staleness_zero_is_the_synchronous_step():
    synchronous = _trained(lambda: keras.optimizers.Adam(1e-2))
    zero = _trained(lambda: keras.optimizers.Adam(1e-2), staleness=0)
    assert not isinstance(zero.embedding_exchange, exchanges.StaleExchange)
    for a, b in zip(synchronous.get_weights(), zero.get_weights()):
        np.testing.assert_array_equal(a, b)


class LinearProbe(TrainStepModel):
    """y = sum of the ids' embedding rows + x . w, trained to lower mean(y): every gradient is a
    constant of the batch (1/B per occurrence, mean(x) for w), whatever the weights, so a table
    that lags T steps equals the synchronous table T steps earlier, exactly."""

    def __init__(self, sharding="replicated", **kwargs):
        super().__init__(**kwargs)
        self.embedding = FieldEmbedding(SCHEMA.vocabulary_sizes, embedding_dim=1,
                                        sharding=sharding)
        self.linear = keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")

    def build(self, input_shape=None):
        self.embedding.build()
        self.linear.build((None, SCHEMA.num_dense))

    def call(self, features):
        rows = ops.sum(self.embedding(features["categorical"]), axis=(1, 2))
        return rows[:, None] + self.linear(features["dense"])


def _probe_tables(staleness, steps, scaled=False, sharding="replicated"):
    """The table and kernel after each step, trained with SGD (by row: a row-sharded table
    refuses an optimizer that would update it whole) at `staleness`."""
    keras.utils.set_random_seed(0)
    model = LinearProbe(sharding)
    model.build()
    optimizer = RowSparseSGD(0.5)
    if scaled:
        optimizer = LossScaleOptimizer(optimizer, initial_scale=2.0 ** 10)
    model.compile(optimizer, loss=lambda y, p: ops.mean(p), embedding_staleness=staleness)
    tables, kernels = [model.embedding.deep_table.embeddings.numpy()], [model.linear.kernel.numpy()]
    for features, labels in batches(steps, 32):
        model.train_on_batch(features, labels)
        tables.append(model.embedding.deep_table.embeddings.numpy())
        kernels.append(model.linear.kernel.numpy())
    return model, tables, kernels


@pytest.mark.parametrize("sharding", ["replicated", "row"])
@pytest.mark.parametrize("staleness", [1, 2])
def test_stale_tables_lag_exactly_t_steps_and_dense_weights_none(staleness, sharding):
    """(Row-sharded: the owner queues its shard's gradients; one process owns every row.)"""
    _, synchronous, sync_kernels = _probe_tables(0, 6, sharding=sharding)
    model, stale, stale_kernels = _probe_tables(staleness, 6, sharding=sharding)
    for step in range(7):
        np.testing.assert_allclose(stale[step], synchronous[max(step - staleness, 0)],
                                   rtol=1e-6, err_msg=f"step {step}")
        np.testing.assert_array_equal(stale_kernels[step], sync_kernels[step])
    assert not np.allclose(stale[6], synchronous[6])  # the lag is real
    assert model.summary_scalars()["embedding/staleness"] == staleness
    assert 0 < model.summary_scalars()["embedding/unique_id_rate"] < 1


@pytest.mark.parametrize("sharding", ["replicated", "row"])
def test_a_skipped_step_keeps_the_queue_and_delays_it(sharding):
    model, _, _ = _probe_tables(1, 3, scaled=True, sharding=sharding)
    queue = {name: v.numpy() for name, v in model.per_rank_variables().items()}
    table = model.embedding.deep_table.embeddings.numpy()
    features, labels = next(batches(1, 32, seed=7))
    features["dense"][0, 0] = np.inf  # a non-finite gradient: the scaler skips the step
    model.train_on_batch(features, labels)
    assert int(model.optimizer.skipped_steps.numpy()) == 1
    for name, variable in model.per_rank_variables().items():
        np.testing.assert_array_equal(variable.numpy(), queue[name], err_msg=name)
    np.testing.assert_array_equal(model.embedding.deep_table.embeddings.numpy(), table)
    features, labels = next(batches(1, 32, seed=8))  # the next step applies the kept gradient
    model.train_on_batch(features, labels)
    assert not np.array_equal(model.embedding.deep_table.embeddings.numpy(), table)


def test_loss_scaled_stale_updates_equal_unscaled_ones():
    _, unscaled, _ = _probe_tables(1, 4)
    _, scaled, _ = _probe_tables(1, 4, scaled=True)
    for a, b in zip(unscaled, scaled):
        np.testing.assert_array_equal(a, b)


def test_staleness_refuses_topk_exchanges_and_negative_values():
    model = DeepFM(SCHEMA, hidden_units=(8,))
    model.build()
    with pytest.raises(UserError, match="`embedding_staleness=1` cannot be used with "
                                        "`embedding_exchange=gtopk`"):
        model.compile("adam", "binary_crossentropy", embedding_exchange="gtopk",
                      embedding_staleness=1)
    with pytest.raises(UserError, match="`embedding_staleness=-1`: give 0"):
        model.compile("adam", "binary_crossentropy", embedding_staleness=-1)


def test_a_regularised_table_cannot_be_stale():
    """An L2 regularizer makes a table's gradient dense: there are no rows to queue."""
    model = DeepFM(SCHEMA, hidden_units=(8,), l2_embedding=1e-4)
    model.build()
    model.compile("adam", "binary_crossentropy", embedding_staleness=1)
    features, labels = next(batches(1, 16))
    with pytest.raises(UserError, match="give the embedding tables no regularizer"):
        model.train_on_batch(features, labels)


def test_a_stale_checkpoint_resumes_only_into_its_sharding(tmp_path):
    """A row-sharded table's queue holds local rows: a replicated stale checkpoint must not fill
    it (nor the reverse), however many ranks."""
    keras.backend.clear_session()  # the same layer names in both models
    replicated, _, _ = _probe_tables(1, 2)
    CheckpointStore(str(tmp_path), model=replicated, optimizer=replicated.optimizer,
                    per_rank_variables=replicated.per_rank_variables()).save(2, {})
    keras.backend.clear_session()
    sharded, _, _ = _probe_tables(1, 1, sharding="row")
    store = CheckpointStore(str(tmp_path), model=sharded, optimizer=sharded.optimizer,
                            per_rank_variables=sharded.per_rank_variables())
    with pytest.raises(UserError, match="row-sharded-over-1.*resume with the flags it was"):
        store.restore_latest()
