"""Step time and bytes per step of the two averaging embedding gradient exchanges
(tfscale.exchanges: allgather of IndexedSlices, or dense whole-table allreduce) for DeepFM at a
64K global batch:

    horovodrun -np P -H localhost:P --gloo python -m benchmarks.embedding_exchange [--flags]

(`benchmarks/run_under_1gbit.sh P [--flags]` runs it on a loopback shaped to 1 Gbit.) Each rank
builds one DeepFM (embedding 10, DNN 400-400-400) with FusedAdam per exchange, from the same
seed, and trains both on its fixed B/P slice of one global batch of the synthetic data. After
the warm-up, every round runs one step of each model, then the exchange alone (the grouped
allreduce of the train step, on that batch's gradients) of each method, so machine load hits
both alike. Bytes per rank are the exchanges' modelled bytes of the same gradients. Rank 0
prints one markdown row per exchange; times are rank 0's medians."""

import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402
from absl import app, flags  # noqa: E402

import models  # noqa: E402
from benchmarks.timing import machine_description, start_horovod_ranks  # noqa: E402
from tfscale import distributed, exchanges  # noqa: E402
from tfscale.data.synthetic import SyntheticCTR  # noqa: E402
from tfscale.exchanges.averaging import AveragingExchange  # noqa: E402
from tfscale.optimizers import FusedAdam  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_integer("batch_size", 65536, "Global batch, split evenly over the ranks.")
flags.DEFINE_integer("warmup_steps", 3, "Untimed steps per exchange (the first one traces).")
flags.DEFINE_integer("rounds", 5, "Timed rounds; each times one step and one exchange of each "
                     "method.")

BASELINE = "allgather"


class ExchangeRun:
    """One DeepFM whose train step uses one embedding exchange, on this rank's fixed batch."""

    def __init__(self, name, schema, batch):
        keras.utils.set_random_seed(0)
        self.exchange = exchanges.get(name)
        self.model = models.build_model("deepfm", schema)
        self.model.compile(optimizer=FusedAdam(learning_rate=1e-3),
                           loss=keras.losses.BinaryCrossentropy(), embedding_exchange=self.exchange)
        self.features, self.labels = batch
        self.exchange_alone = tf.function(
            lambda gradients: self.exchange.average(gradients))
        self.step_seconds = []
        self.exchange_seconds = []

    def step(self):
        started = time.perf_counter()
        self.model.train_on_batch(self.features, self.labels)
        return time.perf_counter() - started

    def exchange_only(self, gradients):
        started = time.perf_counter()
        self.exchange_alone(gradients)
        return time.perf_counter() - started


def batch_gradients(model, features, labels):
    """The gradients of `model`'s loss on one batch, as its train step sees them before the
    exchange (embedding gradients as IndexedSlices)."""
    with tf.GradientTape() as tape:
        predictions = model(features, training=True)
        loss = model.compute_loss(x=features, y=labels, y_pred=predictions)
    return tape.gradient(loss, model.trainable_variables)


def main(argv):
    del argv
    start_horovod_ranks()
    ranks = distributed.size()
    local_batch = distributed.local_batch_size(FLAGS.batch_size)
    source = SyntheticCTR(seed=0, train_rows=FLAGS.batch_size, test_rows=1024)
    batch = next(iter(source.train_batches(local_batch, **distributed.data_shard())))
    runs = [ExchangeRun(name, source.schema, batch)
            for name, exchange_class in exchanges.EXCHANGES.items()
            if issubclass(exchange_class, AveragingExchange)]
    gradients = batch_gradients(runs[0].model, *batch)
    for run in runs:
        for _ in range(FLAGS.warmup_steps):
            run.step()
        run.exchange_only(gradients)
    for _ in range(FLAGS.rounds):
        for run in runs:
            run.step_seconds.append(run.step())
        for run in runs:
            run.exchange_seconds.append(run.exchange_only(gradients))
    if distributed.is_chief():
        report(runs, gradients, source.schema, ranks, local_batch)


def report(runs, gradients, schema, ranks, local_batch):
    """Rank 0's description line, table header and one row per exchange."""
    embedding_rows = sum(int(g.values.shape[0]) for g in gradients
                         if isinstance(g, tf.IndexedSlices))
    print(f"Machine: {machine_description()}.")
    print(f"DeepFM (embedding 10, DNN 400-400-400, {schema.num_categorical} fields, "
          f"{sum(schema.vocabulary_sizes):,} ids) with FusedAdam; global batch "
          f"{FLAGS.batch_size:,} over {ranks} ranks ({local_batch:,} each, {embedding_rows:,} "
          f"embedding gradient rows per rank); medians of rank 0 over {FLAGS.rounds} rounds "
          f"alternating the methods after {FLAGS.warmup_steps} warm-up steps each; MB = 10^6 "
          f"bytes.\n")
    print("| P | embedding exchange | step (s) | / allgather | exchange alone (s) | / allgather | "
          "MB sent+received per rank per step | / allgather | MB over the shared link per "
          "step |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    base = next(run for run in runs if run.exchange.name == BASELINE)
    base_step = statistics.median(base.step_seconds)
    base_exchange = statistics.median(base.exchange_seconds)
    base_bytes = float(base.exchange.modelled_bytes(gradients, ranks))
    for run in runs:
        step = statistics.median(run.step_seconds)
        exchange = statistics.median(run.exchange_seconds)
        nbytes = float(run.exchange.modelled_bytes(gradients, ranks))
        # Every rank sends half its sent+received bytes, all over the one loopback.
        print(f"| {ranks} | {run.exchange} | {step:.2f} | {step / base_step:.2f} | "
              f"{exchange:.2f} | {exchange / base_exchange:.2f} | {nbytes / 1e6:,.1f} | "
              f"{nbytes / base_bytes:.2f} | {ranks * nbytes / 2 / 1e6:,.1f} |", flush=True)


if __name__ == "__main__":
    app.run(main)
