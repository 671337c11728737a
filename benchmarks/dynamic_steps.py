"""Step time of DeepFM with fixed tables against dynamic tables (docs/dynamic.md) at the same batch:

    python -m benchmarks.dynamic_steps --batch_size=8192
    horovodrun -np 4 -H localhost:4 --gloo python -m benchmarks.dynamic_steps --batch_size=8192

Fixed tables are replicated in one process and row-sharded under Horovod (the fixed layout that
also spreads tables over ranks). Dynamic tables run twice: with room for every id of the data
(capacity = the vocabulary sizes summed: nothing is evicted) and with room for 1.5 times the
first batch's ids (ids keep being evicted and admitted every step or two, the batched
least-recently-used pass included). Every variant is the
launcher's default model and optimizer (DeepFM, embedding 10, DNN 400-400-400, RowSparseAdam),
built from the same seed, and trains on the same stream of distinct global batches of the
synthetic data (so new ids keep arriving); every round runs one step of each variant in turn,
so machine load hits all alike. Rank 0 prints one markdown row per variant: the median step
time over the rounds and its ratio to the fixed tables'."""

import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

import models  # noqa: E402
from benchmarks.timing import machine_description, start_horovod_ranks  # noqa: E402
from tfscale import distributed  # noqa: E402
from tfscale.data.synthetic import SyntheticCTR  # noqa: E402
from tfscale.embedding.dynamic import DynamicTables  # noqa: E402
from tfscale.embedding.initializers import RowSeededNormal  # noqa: E402
from tfscale.optimizers import RowSparseAdam  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_integer("batch_size", 8192, "Global batch, split evenly over the ranks.")
flags.DEFINE_integer("warmup_steps", 3, "Untimed steps per variant (the first one traces).")
flags.DEFINE_integer("rounds", 10, "Timed rounds; each times one step of every variant.")
flags.DEFINE_float("vocabulary_scale", 1 / 20, "The synthetic data's vocabulary scale.")


class VariantRun:
    """One DeepFM with one table strategy, stepping through the shared batch stream."""

    def __init__(self, label, sharding, schema):
        keras.utils.set_random_seed(0)
        self.label = label
        self.model = models.build_model(
            "deepfm", schema, embedding_sharding=sharding,
            embeddings_initializer=RowSeededNormal(stddev=0.01))
        self.model.compile(optimizer=RowSparseAdam(learning_rate=1e-3, table_l2=1e-5),
                           loss=keras.losses.BinaryCrossentropy())
        self.seconds = []
        self.evicted = 0.0

    def step(self, batch, timed):
        started = time.perf_counter()
        self.model.train_on_batch(*batch)
        if timed:
            self.seconds.append(time.perf_counter() - started)
            self.evicted += self.model.summary_scalars().get("dynamic/id_rows/evicted", 0.0)


def main(argv):
    del argv
    if distributed.launched_by_horovodrun():
        start_horovod_ranks()
    local_batch = distributed.local_batch_size(FLAGS.batch_size)
    steps = FLAGS.warmup_steps + FLAGS.rounds
    source = SyntheticCTR(seed=0, train_rows=FLAGS.batch_size * steps, test_rows=1024,
                          vocabulary_scale=FLAGS.vocabulary_scale)
    ids = sum(source.schema.vocabulary_sizes)
    fixed = "replicated" if distributed.size() == 1 else "row"
    batches = source.train_batches(local_batch, **distributed.data_shard())
    first = next(iter(batches))[0]["categorical"].numpy()
    one_and_a_half_batches = 3 * distributed.size() * sum(
        len(np.unique(first[:, field])) for field in range(first.shape[1])) // 2
    runs = [VariantRun(f"fixed ({fixed})", fixed, source.schema),
            VariantRun("dynamic, room for every id", DynamicTables(capacity=ids), source.schema),
            VariantRun(f"dynamic, {one_and_a_half_batches:,} rows (evicting)",
                       DynamicTables(capacity=one_and_a_half_batches), source.schema)]
    for step, batch in enumerate(batches.take(steps)):
        for run in runs:
            run.step(batch, timed=step >= FLAGS.warmup_steps)
    if distributed.is_chief():
        report(runs, ids, local_batch)


def report(runs, ids, local_batch):
    """Rank 0's description line, table header and one row per variant."""
    print(f"Machine: {machine_description()}.")
    print(f"DeepFM (embedding 10, DNN 400-400-400) with RowSparseAdam on the synthetic data "
          f"({ids:,} ids); global batch {FLAGS.batch_size:,} over {distributed.size()} ranks "
          f"({local_batch:,} each), a new batch every step; medians of rank 0 over "
          f"{FLAGS.rounds} rounds alternating the variants after {FLAGS.warmup_steps} warm-up "
          "steps each.\n")
    print("| P | global batch | tables | step (ms) | / fixed | ids evicted in the timed steps |")
    print("|---|---:|---|---:|---:|---:|")
    base = statistics.median(runs[0].seconds)
    for run in runs:
        step = statistics.median(run.seconds)
        print(f"| {distributed.size()} | {FLAGS.batch_size:,} | {run.label} | {step * 1e3:,.0f} "
              f"| {step / base:.2f} | {run.evicted:,.0f} |", flush=True)


if __name__ == "__main__":
    app.run(main)
