"""A user's own Keras model under horovodrun, as the library gives it (docs/own_model.md): a job
of tests/multiworker/jobs.py with an output directory.

`main("ranks", OUT_DIR)` on 2 ranks, each rank seeded differently (so only the broadcast makes
them equal), prints one "<check> ok" line per rank and check:
- broadcast: the README's model, its weights different before `fit` and equal on every rank at
  the first step's start and after the epoch;
- uneven arrays: 10 global batches and 37 rows, every rank runs 10 steps, 37 rows reported;
- unknown length: each rank's dataset of another, unknown length; every rank stops at the
  shortest part's step, the end reported;
- batch not divisible: refused with the numbers;
- metrics: `evaluate` and the epoch's logs the same on every rank, and equal to one process's
  Keras metrics over every rank's rows;
- load_weights: each rank loads another file; rank 0's weights end on every rank;
- plain model: a keras.Model compiled with RowSparseAdam is refused at its first step;
- callbacks: BackupAndRestore refused; ModelCheckpoint refused with row-sharded tables;
- in-job export: a SavedModel of row-sharded or dynamic tables refused on every rank; a
  replicated model's, written by rank 0, scores as the model;
- checkpoints: a model with row-sharded tables and one with dynamic tables trained one epoch
  with tfscale.callbacks.Checkpoint in OUT_DIR/<kind>-checkpoints, validated on test parts of
  17 and 16 batches (fit's validation loss and `evaluate` those of every test row), their predictions of a fixed
  batch (OUT_DIR/fixed_batch.npy) written to OUT_DIR/<kind>-predictions.npy.
`main("resume", OUT_DIR)` in one process: exports both runs with tfscale.serving.export_model to
OUT_DIR/<kind>-served, writing the restored model's predictions of the fixed batch to
OUT_DIR/<kind>-export-predictions.npy, then resumes the row-sharded run for a second epoch
(starting at epoch 2, its predictions right after the restore those of the 2-rank run)."""

import logging
import os

import keras
import numpy as np
import tensorflow as tf

import tfscale
from tfscale import distributed
from tfscale.data import rank_batches
from tfscale.errors import UserError
from tfscale.optimizers import RowSparseAdam
from tfscale.optimizers.table_state import local_variables
from tfscale.serving.saved_model import write_saved_model

FIELDS, ROWS_PER_FIELD, GLOBAL_BATCH = 4, 50, 64
KINDS = ("row", "dynamic")


def arrays(rows, seed=7):
    """(ids [rows, FIELDS] int64, labels [rows, 1]) with labels that follow the ids."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, ROWS_PER_FIELD, size=(rows, FIELDS)).astype(np.int64)
    labels = ((ids[:, 0] % 3 == 0) ^ (rng.random(rows) < 0.2)).astype(np.float32)[:, None]
    return ids, labels


def readme_model(sharding="replicated"):
    """The README's model: FieldEmbedding, a dense layer, a linear term."""
    ids = keras.Input((FIELDS,), dtype="int64", name="ids")
    vectors, linear = tfscale.FieldEmbedding([ROWS_PER_FIELD] * FIELDS, embedding_dim=4,
                                             use_wide=True, sharding=sharding)(ids)
    logit = keras.layers.Dense(1)(keras.layers.Flatten()(vectors)) + linear
    model = tfscale.FunctionalTrainStepModel(ids, keras.layers.Activation("sigmoid")(logit))
    model.compile(optimizer=RowSparseAdam(1e-2), loss="binary_crossentropy",
                  metrics=[keras.metrics.AUC(name="auc"), "accuracy"])
    return model


def shared_checksums(model):
    """Every rank's sum of the absolute values of its variables but its own shards."""
    local = {id(v) for v in local_variables(model)}
    total = sum(float(np.abs(v.numpy()).sum()) for v in model.variables if id(v) not in local)
    return distributed.allgather_array(np.array([total]), name="test_checksums")


class AtFirstStep(keras.callbacks.Callback):
    """Records every rank's weight checksums when the first step starts."""

    def on_train_batch_begin(self, batch, logs=None):
        if batch == 0:
            self.checksums = shared_checksums(self.model)


class Captured(logging.Handler):
    """The messages of the "tfscale" logger."""

    def __init__(self):
        super().__init__()
        self.messages = []
        logging.getLogger("tfscale").addHandler(self)

    def emit(self, record):
        self.messages.append(record.getMessage())


def check_broadcast_and_metrics(rank, ids, labels):
    keras.utils.set_random_seed(100 + rank)
    model = readme_model()
    before = shared_checksums(model)
    assert before[0] != before[1], before
    first = AtFirstStep()
    history = model.fit(rank_batches((ids, labels), GLOBAL_BATCH), epochs=1, verbose=0,
                        callbacks=[first])
    assert first.checksums[0] == first.checksums[1], first.checksums
    after = shared_checksums(model)
    assert after[0] == after[1], after
    print(f"rank {rank}: broadcast ok", flush=True)

    epoch_logs = distributed.allgather_array(
        np.array([history.history["loss"][-1], history.history["auc"][-1]]), name="test_logs")
    np.testing.assert_array_equal(epoch_logs[:2], epoch_logs[2:])
    test_ids, test_labels = arrays(1001, seed=8)
    result = model.evaluate(rank_batches((test_ids, test_labels), GLOBAL_BATCH,
                                         drop_remainder=False), return_dict=True, verbose=0)
    gathered = distributed.allgather_array(
        np.array([result["loss"], result["auc"], result["accuracy"]]), name="test_results")
    np.testing.assert_array_equal(gathered[:3], gathered[3:])
    predictions = model.predict(test_ids, batch_size=256, verbose=0)  # every row, one rank
    auc, accuracy = keras.metrics.AUC(), keras.metrics.BinaryAccuracy()
    auc.update_state(test_labels, predictions)
    accuracy.update_state(test_labels, predictions)
    loss = float(keras.losses.binary_crossentropy(test_labels[:, 0], predictions[:, 0]))
    np.testing.assert_allclose([result["auc"], result["accuracy"], result["loss"]],
                               [float(auc.result()), float(accuracy.result()), loss],
                               rtol=1e-5)
    print(f"rank {rank}: metrics ok", flush=True)


def check_uneven_data(rank, ids, labels, log):
    keras.utils.set_random_seed(0)
    model = readme_model()
    rows = 10 * GLOBAL_BATCH + 37
    model.fit(rank_batches((ids[:rows], labels[:rows]), GLOBAL_BATCH), epochs=1, verbose=0)
    assert int(model.optimizer.iterations) == 10, int(model.optimizer.iterations)
    if rank == 0:
        assert any("10 steps an epoch, 37 rows left out" in m for m in log.messages), log.messages
    print(f"rank {rank}: uneven arrays ok", flush=True)

    mine = 300 + 100 * rank  # rank 0: 150 rows of its shard (4 batches), rank 1: 200 (6)
    unknown = tf.data.Dataset.from_tensor_slices((ids[:mine], labels[:mine])).filter(
        lambda *_: True)
    model.fit(rank_batches(unknown, GLOBAL_BATCH), epochs=1, verbose=0)
    assert int(model.optimizer.iterations) == 14, int(model.optimizer.iterations)
    if rank == 0:
        assert any("the epoch ended after 4 steps, when rank(s) [0] ran out" in m
                   for m in log.messages), log.messages
    print(f"rank {rank}: unknown length ok", flush=True)

    try:
        rank_batches((ids, labels), 65)
    except UserError as error:
        assert "`batch_size=65` is the global batch" in str(error), error
        assert "multiple of 2" in str(error), error
        print(f"rank {rank}: batch not divisible ok", flush=True)


def check_load_weights(rank, out_dir):
    keras.utils.set_random_seed(200 + rank)
    model = readme_model()
    path = os.path.join(out_dir, f"weights-rank{rank}.weights.h5")
    keras.Model.save_weights(model, path)
    model.load_weights(path)
    checksums = shared_checksums(model)
    assert checksums[0] == checksums[1], checksums
    print(f"rank {rank}: load_weights ok", flush=True)


def check_refusals(rank, ids, labels, out_dir):
    inputs = keras.Input((FIELDS,), dtype="int64")
    plain = keras.Model(inputs, keras.layers.Dense(1, activation="sigmoid")(
        keras.layers.Flatten()(keras.layers.Embedding(ROWS_PER_FIELD, 4)(inputs))))
    plain.compile(optimizer=RowSparseAdam(1e-2), loss="binary_crossentropy")
    try:
        plain.fit(ids[:GLOBAL_BATCH], labels[:GLOBAL_BATCH], batch_size=32, verbose=0)
        raise AssertionError("a plain keras.Model trained under horovodrun")
    except UserError as error:
        assert "tfscale.FunctionalTrainStepModel(inputs, outputs)" in str(error), error
    print(f"rank {rank}: plain model refused ok", flush=True)

    model = readme_model(sharding="row")
    data = rank_batches((ids, labels), GLOBAL_BATCH)
    for callback, expected in (
            (keras.callbacks.BackupAndRestore(os.path.join(out_dir, "backup")),
             "tfscale.callbacks.Checkpoint"),
            (keras.callbacks.ModelCheckpoint(os.path.join(out_dir, "m.weights.h5"),
                                             save_weights_only=True),
             "saves rank 0's rows only")):
        try:
            model.fit(data, epochs=1, verbose=0, callbacks=[callback])
            raise AssertionError(f"{type(callback).__name__} was taken")
        except UserError as error:
            assert expected in str(error), error
    print(f"rank {rank}: callbacks refused ok", flush=True)


def check_in_job_export(rank, out_dir):
    """A SavedModel written in the job: refused for tables spread over the ranks (each holds its
    share); a replicated model, the same on every rank, written by rank 0 scores as it does."""
    signature = [tf.TensorSpec([None, FIELDS], tf.int64, name="ids")]
    for kind in KINDS:
        model = readme_model(sharding=kind)
        try:
            write_saved_model(model, os.path.join(out_dir, f"{kind}-in-job-{rank}"),
                              [("serve", model.__call__, signature)])
            raise AssertionError(f"a SavedModel of {kind} tables was written in the job")
        except UserError as error:
            assert "spread over the 2 ranks" in str(error), error
    if rank == 0:
        model = readme_model()
        path = os.path.join(out_dir, "replicated-in-job")
        write_saved_model(model, path, [("serve", model.__call__, signature)])
        loaded = tf.saved_model.load(path)
        np.testing.assert_allclose(loaded.serve(tf.constant(fixed_batch())).numpy(),
                                   model.predict(fixed_batch(), verbose=0), atol=1e-6)
    print(f"rank {rank}: in-job export ok", flush=True)


def fixed_batch():
    return arrays(32, seed=9)[0]


def train_with_checkpoints(rank, kind, ids, labels, out_dir):
    keras.backend.clear_session()  # layer names counted from scratch, as in the resuming run
    keras.utils.set_random_seed(300 + rank)
    model = readme_model(sharding=kind)
    directory = os.path.join(out_dir, f"{kind}-checkpoints")
    # 1,025 test rows: rank 0's part is 17 batches of 32 rows, rank 1's 16.
    test_ids, test_labels = arrays(1025, seed=8)
    tests = rank_batches((test_ids, test_labels), GLOBAL_BATCH, drop_remainder=False)
    history = model.fit(rank_batches((ids, labels), GLOBAL_BATCH), epochs=1, verbose=0,
                        validation_data=tests,
                        callbacks=[tfscale.callbacks.Checkpoint(directory)])
    result = model.evaluate(tests, return_dict=True, verbose=0)
    every_row = model.predict(test_ids, batch_size=256, verbose=0)  # all rows on every rank
    loss = float(keras.losses.binary_crossentropy(test_labels[:, 0], every_row[:, 0]))
    auc = keras.metrics.AUC()
    auc.update_state(test_labels, every_row)
    np.testing.assert_allclose([result["loss"], result["auc"]], [loss, float(auc.result())],
                               rtol=1e-5)
    np.testing.assert_allclose(history.history["val_loss"][-1], loss, rtol=1e-5)
    print(f"rank {rank}: {kind} uneven evaluation ok", flush=True)
    predictions = model.predict(fixed_batch(), verbose=0)  # each rank looks the rows up
    if rank == 0:
        np.save(os.path.join(out_dir, f"{kind}-predictions.npy"), predictions)
    print(f"rank {rank}: {kind} checkpoint written", flush=True)


class AtTrainBegin(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        self.step = int(self.model.optimizer.iterations)
        self.predictions = self.model.predict(fixed_batch(), verbose=0)


def export_and_resume(out_dir):
    for kind in KINDS:
        keras.backend.clear_session()
        model = readme_model(sharding=kind)
        tfscale.serving.export_model(model, os.path.join(out_dir, f"{kind}-served"),
                                     checkpoint_dir=os.path.join(out_dir,
                                                                 f"{kind}-checkpoints"))
        np.save(os.path.join(out_dir, f"{kind}-export-predictions.npy"),
                model.predict(fixed_batch(), verbose=0))
    print("exported ok", flush=True)

    keras.backend.clear_session()
    ids, labels = arrays(2048)
    model = readme_model(sharding="row")
    restored = AtTrainBegin()
    history = model.fit(rank_batches((ids, labels), GLOBAL_BATCH), epochs=2, verbose=0,
                        callbacks=[tfscale.callbacks.Checkpoint(
                            os.path.join(out_dir, "row-checkpoints")), restored])
    steps = 2048 // GLOBAL_BATCH
    assert restored.step == steps and len(history.epoch) == 1, (restored.step, history.epoch)
    assert int(model.optimizer.iterations) == 2 * steps
    np.testing.assert_allclose(restored.predictions,
                               np.load(os.path.join(out_dir, "row-predictions.npy")), rtol=1e-6)
    print("resumed at another number of ranks ok", flush=True)


def main(step, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    if step == "resume":
        export_and_resume(out_dir)
        return 0
    distributed.init()
    rank = distributed.rank()
    log = Captured()
    ids, labels = arrays(2048)
    check_broadcast_and_metrics(rank, ids, labels)
    check_uneven_data(rank, ids, labels, log)
    check_load_weights(rank, out_dir)
    check_refusals(rank, ids, labels, out_dir)
    check_in_job_export(rank, out_dir)
    if rank == 0:
        np.save(os.path.join(out_dir, "fixed_batch.npy"), fixed_batch())
    for kind in KINDS:
        train_with_checkpoints(rank, kind, ids, labels, out_dir)
    return 0
