"""A job of tests/multiworker/jobs.py under horovodrun (2 ranks) with an output directory: online
training (tfscale.training.train_progressively) of a small DeepFM on DAYS drifting days, each
rank on its shard of every day. First the first day alone, checkpointed; then, in a fresh model
resumed from that checkpoint, every day. Each rank writes to OUT_DIR/progressive-rank<r>.npz its
final variables (`model_state` order), the per-day metrics of both runs, and its own evaluation,
alone and over every row, of day 2 by the model the first run left (which the resumed run's
progressive validation of day 2 must equal). Used by tests/test_distributed.py."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import keras  # noqa: E402
import numpy as np  # noqa: E402

import models  # noqa: E402
from tests.multiworker.data_parallel_steps import model_state  # noqa: E402
from tfscale import distributed, metrics  # noqa: E402
from tfscale.data import drifting_days  # noqa: E402
from tfscale.data.drifting import DriftingCTR  # noqa: E402
from tfscale.optimizers import FusedAdam  # noqa: E402
from tfscale.training import ProgressiveConfig, train_progressively  # noqa: E402

GLOBAL_BATCH = 256
DAYS = 3
ROWS_PER_DAY = 1536  # 6 steps of 2 x 128 a day
METRICS = ("day", "auc", "logloss", "examples", "steps")


def days():
    stream = DriftingCTR(seed=0, days=DAYS, rows_per_day=ROWS_PER_DAY, vocabulary_scale=0.002,
                         half_life_days=2)
    return drifting_days.drifting_days(stream, drifting_days.hashed_ids(500))


def compiled_model(schema):
    """A small DeepFM seeded alike on every rank; one name for every model and optimizer of the
    process, as checkpoints key tables and their state by variable path."""
    keras.utils.set_random_seed(0)
    model = models.MODELS["deepfm"](schema, hidden_units=[16, 16], name="deepfm")
    model.compile(optimizer=FusedAdam(learning_rate=1e-3, name="adam"),
                  loss=keras.losses.BinaryCrossentropy())
    return model


def alone(model, source):
    """[AUC, log loss, examples] of this process alone over every row of `source`'s test
    split."""
    labels, predictions = [], []
    for features, batch_labels in source.test_batches(GLOBAL_BATCH):
        predictions.append(model(features, training=False).numpy().reshape(-1))
        labels.append(batch_labels.numpy().reshape(-1))
    labels, predictions = np.concatenate(labels), np.concatenate(predictions)
    return [metrics.exact_auc(labels, predictions), metrics.log_loss(labels, predictions),
            labels.size]


def as_array(result):
    return np.array([[day[key] for key in METRICS] for day in result.days], np.float64)


def main(out_dir):
    distributed.init()
    every_day = days()
    schema = every_day[0][1].schema
    checkpoint_dir = os.path.join(out_dir, "progressive-checkpoints")
    model = compiled_model(schema)
    first = train_progressively(model, every_day[:1], ProgressiveConfig(
        GLOBAL_BATCH, checkpoint_dir=checkpoint_dir))
    day_2_alone = alone(model, every_day[1][1])
    resumed_model = compiled_model(schema)
    resumed = train_progressively(resumed_model, every_day, ProgressiveConfig(
        GLOBAL_BATCH, checkpoint_dir=checkpoint_dir, resume=True))
    np.savez(os.path.join(out_dir, f"progressive-rank{distributed.rank()}.npz"),
             *model_state(resumed_model), first=as_array(first), resumed=as_array(resumed),
             day_2_alone=np.array(day_2_alone), global_step=resumed.global_step)
    print(f"rank {distributed.rank()}: {len(resumed.days)} days, global step "
          f"{resumed.global_step}", flush=True)
