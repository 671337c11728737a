"""A job of tests/multiworker/jobs.py under horovodrun (2 ranks), with an output directory:
trains a float32 DeepFM with a dynamic loss scaler for STEPS steps, feeding inf into rank 1's
dense features at step BAD_STEP only, and writes each rank's final variables, skipped-step
count and loss scale to OUT_DIR/rank<r>.npz."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tests.multiworker.data_parallel_steps import (GLOBAL_BATCH, compiled_model,  # noqa: E402
                                                   model_state, rank_slice, source)
from tfscale import distributed  # noqa: E402
from tfscale.optimizers import FusedAdam  # noqa: E402
from tfscale.optimizers.loss_scaling import LossScaleOptimizer  # noqa: E402

STEPS = 4
BAD_STEP = 2
INITIAL_SCALE = 2.0 ** 10


def poisoned_on_rank_1(dataset, rank):
    """`dataset` with rank 1's dense features at batch BAD_STEP replaced by inf."""
    def poison(step, batch):
        features, labels = batch
        bad = tf.logical_and(tf.equal(step, BAD_STEP), tf.equal(rank, 1))
        dense = tf.where(bad, tf.fill(tf.shape(features["dense"]), np.inf), features["dense"])
        return dict(features, dense=dense), labels

    return dataset.enumerate().map(poison)


def main(out_dir):
    distributed.init()
    rank = distributed.rank()
    data = source()
    optimizer = LossScaleOptimizer(FusedAdam(learning_rate=1e-3), initial_scale=INITIAL_SCALE,
                                   dynamic_growth_steps=1000)
    model = compiled_model(data.schema, optimizer)
    batches = rank_slice(data.train_batches(GLOBAL_BATCH), rank, distributed.size()).take(STEPS)
    model.fit(poisoned_on_rank_1(batches, rank), epochs=1, verbose=0, shuffle=False)
    np.savez(os.path.join(out_dir, f"rank{rank}.npz"), *model_state(model),
             skipped_steps=optimizer.skipped_steps.numpy(), scale=optimizer.dynamic_scale.numpy())
    print(f"rank {rank}: skipped {int(optimizer.skipped_steps.numpy())} steps, loss scale "
          f"{float(optimizer.dynamic_scale.numpy()):g}", flush=True)
