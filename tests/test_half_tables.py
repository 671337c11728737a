"""Tables stored in half precision (tfscale.embedding.table_dtypes): stochastic rounding is
unbiased where round-to-nearest drops small updates, and seeded; every table kind trains with
half-precision rows and float32 optimizer state; checkpoints hold the stored dtype and resume
bitwise; a SavedModel serves the rows as stored; the loss scaler still skips a non-finite step;
an optimizer that cannot keep half-precision rows, a dense exchange and an unknown dtype are
refused before training, naming both."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfscale
from tfscale.embedding.by_row_checkpoint import BY_ROW
from tfscale.errors import UserError
from tfscale.optimizers import (LossScaleOptimizer, RowSparseAdam, RowSparseSGD, RowWiseAdagrad,
                                stochastic_rounding)
from tfscale.optimizers.table_state import OptimizerTableState, per_row_state
from tfscale.serving.model_export import export_model
from tfscale.checkpoints.store import CheckpointStore
from tests.test_row_updates import _op_counts

SIZES = [40, 30, 50]


def _batches(rows=512, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.integers(0, 30, (rows, 3)).astype("int64"),
            rng.integers(0, 2, (rows, 1)).astype("float32"))


def _model(table_dtype, optimizer, sharding="replicated", policy="float32"):
    keras.utils.set_random_seed(1)
    ids = keras.Input((3,), dtype="int64")
    vectors, linear = tfscale.FieldEmbedding(SIZES, embedding_dim=4, use_wide=True,
                                             sharding=sharding, table_dtype=table_dtype,
                                             dtype=policy, name="embedding")(ids)
    logit = keras.layers.Dense(1, dtype=policy, name="dense")(
        keras.layers.Flatten()(vectors)) + linear
    model = tfscale.FunctionalTrainStepModel(ids, keras.layers.Activation(
        "sigmoid", dtype="float32")(logit))
    model.compile(optimizer=optimizer, loss="binary_crossentropy")
    return model


def _tables(model):
    return [v for v in model.trainable_variables if v.path.endswith("/embeddings")]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_stochastic_rounding_is_unbiased_where_round_to_nearest_drops_the_update(dtype):
    target = 1.0 - 1e-4  # a step well below half a unit in the last place at 1.0
    values = tf.fill([200_000], target)
    rounded = stochastic_rounding.stochastically_rounded(values, dtype, tf.constant([1, 2]))
    nearest = tf.cast(values, dtype)
    np.testing.assert_array_equal(tf.cast(nearest, tf.float32).numpy(), 1.0)  # dropped
    below = float(tf.cast(tf.cast(1.0, dtype), tf.float32)) - np.spacing(np.float32(0.5)) * (
        2 ** 16 if dtype == "bfloat16" else 2 ** 13)  # the next value below 1.0 in `dtype`
    assert set(np.unique(tf.cast(rounded, tf.float32).numpy())) == {below, 1.0}
    p = (1.0 - target) / (1.0 - below)
    error = (1.0 - below) * np.sqrt(p * (1 - p) / values.shape[0])  # the mean's standard error
    mean = float(tf.reduce_mean(tf.cast(rounded, tf.float64)))
    assert abs(mean - target) < 5 * error, (mean, target, error)
    again = stochastic_rounding.stochastically_rounded(values, dtype, tf.constant([1, 2]))
    other = stochastic_rounding.stochastically_rounded(values, dtype, tf.constant([1, 3]))
    np.testing.assert_array_equal(again.numpy(), rounded.numpy())  # seeded
    assert not np.array_equal(other.numpy(), rounded.numpy())


def test_small_updates_move_a_half_precision_table_as_float32_on_average():
    """SGD steps of lr * g = 1e-4 on rows at 1.0: bfloat16 round-to-nearest would keep every
    row at 1.0 for ever; rounded stochastically, the rows' mean follows float32."""
    rows, steps, step_size = 4096, 20, 1e-4
    table = keras.Variable(np.ones((rows, 2), "float32"), dtype="bfloat16", name="embeddings")
    optimizer = RowSparseSGD(1.0)
    ids = tf.range(rows, dtype=tf.int64)
    gradient = tf.IndexedSlices(tf.fill([rows, 2], step_size), ids,
                                tf.constant([rows, 2], tf.int64))
    nearest = np.ones((rows, 2), "float32")
    for _ in range(steps):
        optimizer.apply([gradient], [table])
        nearest = np.asarray(tf.cast(tf.cast(nearest - step_size, "bfloat16"), tf.float32))
    assert np.all(nearest == 1.0)
    moved = np.asarray(tf.cast(table.value, tf.float32), np.float64)
    expected = 1.0 - steps * step_size
    # Each step's rounding adds an error of at most one unit (2**-8 below 1.0) with mean 0.
    error = 2 ** -8 * np.sqrt(steps / moved.size)
    assert abs(moved.mean() - expected) < 5 * error, (moved.mean(), expected)


@pytest.mark.parametrize("sharding", ["replicated", "row", "dynamic"])
@pytest.mark.parametrize("dtype, make_optimizer", [
    ("bfloat16", lambda: RowWiseAdagrad(0.05)),
    ("float16", lambda: RowSparseAdam(1e-2)),
], ids=["bfloat16-rowwise", "float16-adam"])
def test_every_table_kind_trains_half_precision_rows_with_float32_state(sharding, dtype,
                                                                       make_optimizer):
    model = _model(dtype, make_optimizer(), sharding)
    x, y = _batches()
    history = model.fit(x, y, batch_size=64, epochs=3, verbose=0).history["loss"]
    assert history[-1] < history[0]
    for table in _tables(model):
        assert table.dtype == dtype
        for state in per_row_state(model.optimizer, table):
            assert state.dtype in ("float32", "int32"), state.path
    predicted = model.predict(x[:8], verbose=0)
    assert predicted.dtype == np.float32 and np.all(np.isfinite(predicted))


def test_a_checkpoint_holds_the_stored_dtype_and_resumes_bitwise(tmp_path):
    model = _model("bfloat16", RowWiseAdagrad(0.05, name="tables"))
    x, y = _batches()
    model.fit(x, y, batch_size=64, epochs=1, verbose=0)
    CheckpointStore(str(tmp_path), model=model, optimizer=model.optimizer).save(8, {"epoch": 1})
    saved = [np.asarray(v.value) for v in _tables(model)]
    files = list(tmp_path.rglob("tables-0-of-1.npz"))
    assert len(files) == 1
    with np.load(files[0]) as arrays:
        stored = [name for name in arrays.files if name.endswith("/embeddings@bfloat16")]
        assert len(stored) == 2 and all(arrays[name].dtype == np.uint16 for name in stored)
    other = _model("bfloat16", RowWiseAdagrad(0.05, name="tables"))
    other.fit(x[:64], y[:64], batch_size=64, epochs=1, verbose=0)  # built, and different
    CheckpointStore(str(tmp_path), model=other, optimizer=other.optimizer).restore_latest()
    for before, after in zip(saved, _tables(other)):
        np.testing.assert_array_equal(before.view(np.uint16), np.asarray(after.value).view(
            np.uint16))
    assert BY_ROW.parts(_tables(other), OptimizerTableState(other.optimizer))


@pytest.mark.parametrize("sharding", ["replicated", "dynamic"])
def test_a_saved_model_serves_the_rows_as_stored(tmp_path, sharding):
    model = _model("bfloat16", RowWiseAdagrad(0.05), sharding)
    x, y = _batches()
    model.fit(x, y, batch_size=64, epochs=1, verbose=0)
    export_model(model, str(tmp_path / "served"))
    served = tf.saved_model.load(str(tmp_path / "served"))
    scores = served.serve(tf.constant(x[:16])) if hasattr(served, "serve") else None
    if scores is None:
        scores = served.signatures["serving_default"](tf.constant(x[:16]))
    scores = next(iter(scores.values())) if isinstance(scores, dict) else scores
    np.testing.assert_allclose(np.asarray(scores).reshape(-1),
                               model.predict(x[:16], verbose=0).reshape(-1), rtol=1e-5)
    held = [v for v in served.variables if "embedding" in v.name and v.shape.rank == 2
            and v.shape[1] == 4 and "unknown" not in v.name]  # the fields' unknown rows: float32
    assert held and all(v.dtype == tf.bfloat16 for v in held), [(v.name, v.dtype) for v in held]


class _MixedModel(tfscale.TrainStepModel):
    """FieldEmbedding and a Dense layer in `policy` (a subclassed model: the model's call sets the
    layers' autocast)."""

    def __init__(self, table_dtype, policy):
        super().__init__(dtype=policy, name="mixed_model")
        self.embedding = tfscale.FieldEmbedding(SIZES, embedding_dim=4, table_dtype=table_dtype,
                                                dtype=policy)
        self.flatten = keras.layers.Flatten(dtype=policy)
        self.logit = keras.layers.Dense(1, dtype=policy)

    def call(self, ids):
        return keras.activations.sigmoid(tf.cast(self.logit(self.flatten(self.embedding(ids))),
                                                 tf.float32))


def test_the_loss_scaler_skips_a_non_finite_step_of_a_half_precision_table():
    keras.utils.set_random_seed(1)
    model = _MixedModel(table_dtype="bfloat16", policy="mixed_float16")
    model.compile(optimizer=LossScaleOptimizer(RowWiseAdagrad(0.05)), loss="binary_crossentropy")
    x, y = _batches(64)
    model.fit(x, y, batch_size=64, epochs=1, verbose=0)
    before = [np.asarray(v.value).copy() for v in _tables(model)]
    skipped = int(model.optimizer.skipped_steps.numpy())
    model.fit(x, np.full_like(y, np.nan), batch_size=64, epochs=1, verbose=0)
    assert int(model.optimizer.skipped_steps.numpy()) == skipped + 1
    for saved, table in zip(before, _tables(model)):
        np.testing.assert_array_equal(saved.view(np.uint16), np.asarray(table.value).view(
            np.uint16))


def test_an_optimizer_that_cannot_keep_half_precision_rows_is_refused_naming_both():
    with pytest.raises(UserError, match=r"table_dtype=bfloat16.*Adam cannot keep half-precision"):
        _model("bfloat16", keras.optimizers.Adam(1e-3))  # at compile, the model built


def test_a_dense_gradient_of_a_half_precision_table_is_refused():
    """As the `dense` exchange hands it over in a job of several ranks."""
    table = keras.Variable(np.ones((6, 2), "float32"), dtype="float16", name="embeddings")
    with pytest.raises(UserError, match=r"float16 and got a dense gradient.*by row only"):
        RowSparseAdam(1e-3).apply([tf.ones((6, 2))], [table])


def test_an_unknown_table_dtype_is_refused_naming_the_argument():
    with pytest.raises(ValueError, match=r"`table_dtype='int8'`.*float32, bfloat16, float16"):
        tfscale.FieldEmbedding(SIZES, table_dtype="int8")


@pytest.mark.parametrize("table_dtype", ["float32", "bfloat16"])
def test_a_field_embedding_in_another_policy_than_its_functional_model_trains(table_dtype):
    """The tables are not autocast: a mixed FieldEmbedding in a float32 model reads them by
    row."""
    model = _model(table_dtype, RowSparseAdam(1e-2), policy="mixed_bfloat16")
    x, y = _batches(256)
    history = model.fit(x, y, batch_size=64, epochs=2, verbose=0).history["loss"]
    assert np.all(np.isfinite(history))
    assert all(table.dtype == table_dtype for table in _tables(model))


def test_the_top_k_exchange_hands_a_half_precision_table_float32_rows():
    model = _model("bfloat16", RowWiseAdagrad(0.05))
    model.compile(optimizer=RowWiseAdagrad(0.05), loss="binary_crossentropy",
                  embedding_exchange="topk")
    before = [np.asarray(v.value).copy() for v in _tables(model)]
    x, y = _batches(256)
    history = model.fit(x, y, batch_size=64, epochs=2, verbose=0).history["loss"]
    assert np.all(np.isfinite(history))
    assert all(np.any(saved != np.asarray(table.value))
               for saved, table in zip(before, _tables(model)))


@pytest.mark.parametrize("sharding", ["replicated", "dynamic"])
def test_a_half_precision_tables_step_reads_and_writes_only_its_rows(sharding):
    """No whole read of the table or its accumulator (which a step would pay with a copy of
    the table), and the gradient handed to the optimizer is float32."""
    model = _model("bfloat16", RowWiseAdagrad(0.05), sharding)
    x, y = _batches(64)
    model.fit(x, y, batch_size=64, epochs=1, verbose=0)
    step = tf.function(model.train_step).get_concrete_function(
        (tf.constant(x[:64]), tf.constant(y[:64])))
    for table in _tables(model):
        for variable in [table, *per_row_state(model.optimizer, table)]:
            ops = _op_counts(step.graph, variable)
            # (a dynamic table also writes the rows it hands out, and resets their state)
            assert ops["ResourceScatterUpdate"] == (2 if sharding == "dynamic" else 1), (
                variable.path, ops)
            assert not ops.keys() & {"ReadVariableOp", "AssignVariableOp"}, (variable.path, ops)
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(model(tf.constant(x[:8]), training=True))
    gradients = tape.gradient(loss, _tables(model))
    assert all(isinstance(g, tf.IndexedSlices) and g.values.dtype == tf.float32
               for g in gradients), gradients
