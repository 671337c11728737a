"""A job of tests/multiworker/jobs.py under horovodrun (2 ranks), with an output directory:
trains a float32 DeepFM with a dynamic loss scaler for STEPS steps, twice:
- with FusedAdam, feeding inf into rank 1's dense features at step BAD_STEP only; writes each
  rank's final variables, skipped-step count and loss scale to OUT_DIR/rank<r>.npz;
- with CowClip (whose tables take the allgathered row gradients with their counts), rank 1's
  embedding-table gradients alone set to inf at step BAD_STEP, before the exchange (its dense
  gradients stay finite); writes the same to OUT_DIR/embedding-rank<r>.npz, with the indices of
  the model and wrapped-optimizer variables that changed over step BAD_STEP (`changed`), the
  skipped-step count after each step (`skipped_by_step`) and the optimizer's step count
  (`iterations`)."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tests.multiworker.data_parallel_steps import (GLOBAL_BATCH, compiled_model,  # noqa: E402
                                                   model_state, rank_slice, source)
from tfscale import distributed  # noqa: E402
from tfscale.embedding.strategies import is_table  # noqa: E402
from tfscale.exchanges import AllgatherExchange  # noqa: E402
from tfscale.optimizers import CowClip, FusedAdam, RowSparseAdam  # noqa: E402
from tfscale.optimizers.loss_scaling import LossScaleOptimizer  # noqa: E402
from tfscale.row_gradients import with_values  # noqa: E402

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


class EmbeddingInfOnRank1(AllgatherExchange):
    """The allgather exchange, with rank 1's embedding-table row gradients set to inf at step
    BAD_STEP (0-based, counted by the exchange's calls) before they are gathered."""

    def __init__(self, rank):
        super().__init__()
        self._rank = rank
        self._calls = tf.Variable(0, dtype=tf.int64, trainable=False)

    def exchange(self, gradients, variables, optimizer):
        bad = tf.logical_and(tf.equal(self._calls, BAD_STEP), tf.equal(self._rank, 1))
        poisoned = []
        for gradient, variable in zip(gradients, variables):
            if isinstance(gradient, tf.IndexedSlices) and is_table(variable):
                gradient = with_values(gradient, tf.where(
                    bad, tf.fill(tf.shape(gradient.values), np.inf), gradient.values))
            poisoned.append(gradient)
        self._calls.assign_add(1)
        return super().exchange(poisoned, variables, optimizer)


class StateAround(keras.callbacks.Callback):
    """The model's and the wrapped optimizer's variables after batches `step` - 1 and `step`,
    and the scaler's count of skipped steps after each batch."""

    def __init__(self, step):
        super().__init__()
        self.step = step
        self.states = {}
        self.skipped_by_step = []

    def on_train_batch_end(self, batch, logs=None):
        self.skipped_by_step.append(int(self.model.optimizer.skipped_steps.numpy()))
        if batch in (self.step - 1, self.step):
            self.states[batch] = [np.array(v.numpy()) for v in list(self.model.variables)
                                  + list(self.model.optimizer.inner_optimizer.variables)]


def _write(path, model, optimizer, **extra):
    np.savez(path, *model_state(model), skipped_steps=optimizer.skipped_steps.numpy(),
             scale=optimizer.dynamic_scale.numpy(), **extra)


def main(out_dir):
    distributed.init()
    rank = distributed.rank()
    data = source()
    optimizer = LossScaleOptimizer(FusedAdam(learning_rate=1e-3), initial_scale=INITIAL_SCALE,
                                   dynamic_growth_steps=1000)
    model = compiled_model(data.schema, optimizer)
    batches = rank_slice(data.train_batches(GLOBAL_BATCH), rank, distributed.size()).take(STEPS)
    model.fit(poisoned_on_rank_1(batches, rank), epochs=1, verbose=0, shuffle=False)
    _write(os.path.join(out_dir, f"rank{rank}.npz"), model, optimizer)
    print(f"rank {rank}: skipped {int(optimizer.skipped_steps.numpy())} steps, loss scale "
          f"{float(optimizer.dynamic_scale.numpy()):g}", flush=True)

    optimizer = LossScaleOptimizer(
        CowClip(RowSparseAdam(1e-3, catch_up_l2=1e-4, name="embedding"),
                FusedAdam(1e-3, name="dense"), l2=1e-4),
        initial_scale=INITIAL_SCALE, dynamic_growth_steps=1000)
    model = compiled_model(data.schema, optimizer, embedding_exchange=EmbeddingInfOnRank1(rank))
    around = StateAround(BAD_STEP)
    model.fit(batches, epochs=1, verbose=0, shuffle=False, callbacks=[around])
    changed = [i for i, (a, b) in enumerate(zip(around.states[BAD_STEP - 1],
                                                around.states[BAD_STEP]))
               if not np.array_equal(a, b)]
    _write(os.path.join(out_dir, f"embedding-rank{rank}.npz"), model, optimizer,
           changed=np.array(changed, np.int64), iterations=optimizer.iterations.numpy(),
           skipped_by_step=np.array(around.skipped_by_step, np.int64))
    print(f"rank {rank}, inf in the embedding gradients only: skipped "
          f"{int(optimizer.skipped_steps.numpy())} steps, loss scale "
          f"{float(optimizer.dynamic_scale.numpy()):g}, changed over the skipped step: "
          f"{changed}", flush=True)
