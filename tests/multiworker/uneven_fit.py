"""Per-rank data of different lengths given to `fit` and `evaluate` through Keras's own data
adapters (docs/own_model.md, "Data of different lengths"): a job of tests/multiworker/jobs.py on
2 ranks, each rank seeded differently, on either engine. Prints one "<scenario> ok" line per
rank and scenario:
- arrays refused: 8,192 and 9,216 rows at `batch_size=1024` (8 and 9 steps) refused before the
  first step on every rank, naming each rank's rows and batches and rank_batches;
- datasets refused: tf.data.Datasets of 8 and 9 batches refused the same way, and a Python
  generator (its length unknown);
- equal steps train: 256 and 250 rows (8 batches each) train two epochs, one model on both
  ranks; uneven validation arrays of a replicated model pass, with the same metrics;
- unknown length agreed: filtered datasets of 5 and 7 batches end every epoch after 5 steps on
  both ranks, the end logged on rank 0, one model on both ranks; rank_batches' own agreed
  dataset is not agreed again;
- steps_per_epoch refused: 3 and 4 steps of an endless dataset refused, naming both;
- steps_per_epoch agreed: arrays of 8 and 9 batches read 2 steps an epoch for 2 epochs;
- row-sharded evaluation: validation and evaluation arrays of different batch counts refused;
  evaluation datasets of different lengths padded, the same metrics on both ranks."""

import logging

import keras
import numpy as np
import tensorflow as tf

import tfscale
from tfscale import distributed
from tfscale.data import rank_batches
from tfscale.data.rank_batches import agreed_batches
from tfscale.errors import UserError
from tfscale.optimizers import RowSparseAdam

FIELDS, ROWS_PER_FIELD, BATCH = 3, 20, 32


def arrays(rows, seed):
    """(ids [rows, FIELDS] int64, labels [rows, 1]) drawn with `seed`."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, ROWS_PER_FIELD, size=(rows, FIELDS)).astype(np.int64)
    return ids, (ids[:, :1] % 2).astype(np.float32)


def batches(rows, seed, unknown=False):
    """`arrays(rows, seed)` as a tf.data.Dataset of BATCH-row batches (of unknown length)."""
    examples = tf.data.Dataset.from_tensor_slices(arrays(rows, seed))
    return (examples.filter(lambda *_: True) if unknown else examples).batch(BATCH)


def arrays_in_batches(seed):
    """Two BATCH-row batches of `arrays`."""
    ids, labels = arrays(2 * BATCH, seed)
    return [(ids[:BATCH], labels[:BATCH]), (ids[BATCH:], labels[BATCH:])]


def model(sharding="replicated"):
    ids = keras.Input((FIELDS,), dtype="int64")
    vectors = tfscale.FieldEmbedding([ROWS_PER_FIELD] * FIELDS, embedding_dim=2,
                                     sharding=sharding)(ids)
    built = tfscale.FunctionalTrainStepModel(
        ids, keras.layers.Dense(1, activation="sigmoid")(keras.layers.Flatten()(vectors)))
    built.compile(optimizer=RowSparseAdam(1e-2), loss="binary_crossentropy",
                  metrics=[keras.metrics.AUC(name="auc")])
    return built


def refused(action, *parts):
    """The UserError `action()` raises, checked to hold every one of `parts`."""
    try:
        action()
    except UserError as error:
        for part in parts:
            assert part in str(error), (part, str(error))
        return error
    raise AssertionError(f"not refused: expected {parts}")


def same_on_every_rank(value, name):
    """Asserts `value` (numbers or arrays) is the same on every rank."""
    values = distributed.engine().allgather_object(value, name)
    for other in values[1:]:
        for mine, theirs in zip(tf.nest.flatten(values[0]), tf.nest.flatten(other)):
            np.testing.assert_array_equal(mine, theirs)


def weights(trained):
    return [v.numpy() for v in trained.variables]


class Captured(logging.Handler):
    """The messages of the "tfscale" logger."""

    def __init__(self):
        super().__init__()
        self.messages = []
        logging.getLogger("tfscale").addHandler(self)

    def emit(self, record):
        self.messages.append(record.getMessage())


def arrays_refused(rank):
    trained = model()
    x, y = arrays(8192 + 1024 * rank, seed=rank)
    refused(lambda: trained.fit(x, y, batch_size=1024, verbose=0),
            "`fit`'s data must run the same number of steps on every rank",
            "rank 0: 8,192 rows, 8 batches; rank 1: 9,216 rows, 9 batches",
            "give every rank the same number of rows", "tfscale.data.rank_batches(")
    assert int(trained.optimizer.iterations) == 0
    print(f"rank {rank}: arrays refused ok", flush=True)

    refused(lambda: trained.fit(batches(256 + 32 * rank, seed=rank), verbose=0),
            "rank 0: a tf.data.Dataset of 8 batches; rank 1: a tf.data.Dataset of 9 batches")
    refused(lambda: trained.fit((batch for batch in arrays_in_batches(rank)), verbose=0),
            "rank 0: a generator, whose length is not known")
    assert int(trained.optimizer.iterations) == 0
    print(f"rank {rank}: datasets refused ok", flush=True)


def equal_steps_train(rank):
    trained = model()
    x, y = arrays(256 - 6 * rank, seed=rank)  # 8 batches on both ranks
    history = trained.fit(x, y, batch_size=BATCH, epochs=2, verbose=0,
                          validation_data=arrays(100 + 40 * rank, seed=10 + rank))
    assert int(trained.optimizer.iterations) == 16, int(trained.optimizer.iterations)
    same_on_every_rank(weights(trained), "test_equal_steps_weights")
    same_on_every_rank(history.history["val_loss"], "test_equal_steps_validation")
    evaluation = trained.evaluate(*arrays(70 + 50 * rank, seed=20 + rank), verbose=0)
    same_on_every_rank(evaluation, "test_equal_steps_evaluation")
    print(f"rank {rank}: equal steps train ok", flush=True)


def unknown_length_agreed(rank, log):
    trained = model()
    trained.fit(batches(160 + 64 * rank, seed=rank, unknown=True), epochs=2, verbose=0)
    assert int(trained.optimizer.iterations) == 10, int(trained.optimizer.iterations)
    same_on_every_rank(weights(trained), "test_unknown_length_weights")
    if rank == 0:
        assert any("the epoch ended after 5 steps, when rank(s) [0] ran out" in m
                   for m in log.messages), log.messages
    unknown = tf.data.Dataset.from_tensor_slices(arrays(300, seed=rank)).filter(lambda *_: True)
    agreed = rank_batches(unknown, 2 * BATCH)
    assert agreed_batches(agreed) is agreed
    print(f"rank {rank}: unknown length agreed ok", flush=True)


def steps_per_epoch_checked(rank):
    trained = model()
    endless = batches(64, seed=rank).repeat()
    refused(lambda: trained.fit(endless, steps_per_epoch=3 + rank, verbose=0),
            "rank 0: an endless tf.data.Dataset, steps_per_epoch=3; "
            "rank 1: an endless tf.data.Dataset, steps_per_epoch=4",
            "the same number of rows and `steps_per_epoch`")
    assert int(trained.optimizer.iterations) == 0
    print(f"rank {rank}: steps_per_epoch refused ok", flush=True)

    x, y = arrays(256 + 32 * rank, seed=rank)  # 8 and 9 batches, 2 read an epoch
    trained.fit(x, y, batch_size=BATCH, steps_per_epoch=2, epochs=2, verbose=0)
    assert int(trained.optimizer.iterations) == 4, int(trained.optimizer.iterations)
    same_on_every_rank(weights(trained), "test_steps_per_epoch_weights")
    print(f"rank {rank}: steps_per_epoch agreed ok", flush=True)


def row_sharded_evaluation(rank):
    trained = model(sharding="row")
    x, y = arrays(128, seed=rank)
    refused(lambda: trained.fit(x, y, batch_size=BATCH, verbose=0,
                                validation_data=arrays(64 + 32 * rank, seed=rank)),
            "`fit`'s validation data must run the same number of steps",
            "rank 0: 64 rows, 2 batches; rank 1: 96 rows, 3 batches", "drop_remainder=False")
    refused(lambda: trained.evaluate(*arrays(64 + 32 * rank, seed=rank), batch_size=BATCH,
                                     verbose=0),
            "`evaluate`'s data must run the same number of steps")
    assert int(trained.optimizer.iterations) == 0
    trained.fit(x, y, batch_size=BATCH, verbose=0,
                validation_data=batches(64 + 32 * rank, seed=10 + rank))
    result = trained.evaluate(batches(70 + 50 * rank, seed=20 + rank, unknown=True),
                              verbose=0, return_dict=True)
    same_on_every_rank(result, "test_row_sharded_evaluation")
    print(f"rank {rank}: row-sharded evaluation ok", flush=True)


def main():
    distributed.init()
    rank = distributed.rank()
    keras.utils.set_random_seed(rank)
    log = Captured()
    arrays_refused(rank)
    equal_steps_train(rank)
    unknown_length_agreed(rank, log)
    steps_per_epoch_checked(rank)
    row_sharded_evaluation(rank)
    return 0
