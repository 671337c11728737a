"""Step time, exchange time and bytes per step of DeepFM with plain and de-duplicated embedding
lookups, and with synchronous and one-step-stale embedding updates (docs/persia.md), or
(`--compare=sharding`) with replicated and row-sharded tables (docs/sharding.md; the sharded
lookup's rows and gradients in float32 and in bfloat16 on the wire), all de-duplicated and
synchronous:

    horovodrun -np P -H localhost:P --gloo python -m benchmarks.hybrid_steps --batch_size=B

(`BENCHMARK=benchmarks.hybrid_steps benchmarks/run_under_1gbit.sh P --batch_size=B` runs it on a
loopback shaped to 1 Gbit.) Each rank builds one DeepFM (embedding 10, DNN 400-400-400) with
FusedAdam and the allgather exchange per variant, from the same seed, and trains each on its
fixed B/P slice of one global batch of the synthetic data. After the warm-up, every round runs
one step of each variant in turn, so machine load hits all alike. Per step the train step itself
records the bytes it exchanged (the exchange's modelled bytes, Gloo ring model), the
unique-id rate of the rank's batch and the wall time of the exchange (all gradients in one
grouped collective when synchronous; the embedding gradients alone, overlapping the step's
computation, when stale); with row-sharded tables the bytes also count the lookup's alltoalls
and their backward pass, and the exchange time is the lookup's plus the dense allreduce's (the
backward alltoall is inside the step's backward pass, not timed apart). Rank 0 prints one
markdown row per variant; times are rank 0's medians."""

import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
from absl import app, flags  # noqa: E402

import models  # noqa: E402
from benchmarks.timing import machine_description, start_horovod_ranks  # noqa: E402
from tfscale import distributed  # noqa: E402
from tfscale.data.synthetic import SyntheticCTR  # noqa: E402
from tfscale.embedding.row_sharding import RowSharded  # noqa: E402
from tfscale.optimizers import FusedAdam  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_integer("batch_size", 65536, "Global batch, split evenly over the ranks.")
flags.DEFINE_integer("warmup_steps", 3, "Untimed steps per variant (the first one traces).")
flags.DEFINE_integer("rounds", 5, "Timed rounds; each times one step of every variant.")
flags.DEFINE_enum("compare", "hybrid", ["hybrid", "sharding"],
                  "hybrid: de-duplication and staleness; sharding: replicated against row-sharded.")

# (de-duplicated lookups, embedding staleness, tables); the first of each is the baseline.
VARIANTS = {
    "hybrid": ((False, 0, "replicated"), (False, 1, "replicated"), (True, 0, "replicated"),
               (True, 1, "replicated")),
    "sharding": ((True, 0, "replicated"), (True, 0, "row"), (True, 0, "row, bfloat16 wire")),
}
# The variants' table strategies (FieldEmbedding's `sharding`) by the name their rows print.
STRATEGIES = {"replicated": "replicated", "row": "row",
              "row, bfloat16 wire": RowSharded(wire_dtype="bfloat16")}


class VariantRun:
    """One DeepFM trained with one variant on this rank's fixed batch, and its per-step
    numbers."""

    def __init__(self, deduplicate, staleness, sharding, schema, batch):
        keras.utils.set_random_seed(0)
        self.deduplicate, self.staleness, self.sharding = deduplicate, staleness, sharding
        self.model = models.build_model("deepfm", schema, deduplicate_ids=deduplicate,
                                        embedding_sharding=STRATEGIES[sharding])
        self.model.compile(optimizer=FusedAdam(learning_rate=1e-3),
                           loss=keras.losses.BinaryCrossentropy(),
                           embedding_exchange="allgather", embedding_staleness=staleness)
        self.features, self.labels = batch
        self.records = []

    @property
    def label(self):
        lookups = "de-duplicated" if self.deduplicate else "plain"
        return f"{self.sharding} | {lookups} | {self.staleness}"

    def step(self, timed):
        started = time.perf_counter()
        self.model.train_on_batch(self.features, self.labels)
        seconds = time.perf_counter() - started
        if timed:
            scalars = self.model.summary_scalars()
            exchange = scalars.get("exchange/embedding_seconds", scalars.get("exchange/seconds"))
            exchange += scalars.get("sharding/lookup_seconds", 0.0)
            nbytes = sum(scalars.get(name, 0.0) for name in (
                "exchange/bytes_sent", "exchange/bytes_received",
                "sharding/alltoall_bytes_sent", "sharding/alltoall_bytes_received"))
            self.records.append((seconds, exchange, nbytes,
                                 scalars.get("embedding/unique_id_rate")))

    def median(self, column):
        values = [record[column] for record in self.records]
        return None if values[0] is None else statistics.median(values)


def main(argv):
    del argv
    start_horovod_ranks()
    local_batch = distributed.local_batch_size(FLAGS.batch_size)
    source = SyntheticCTR(seed=0, train_rows=FLAGS.batch_size, test_rows=1024)
    batch = next(iter(source.train_batches(local_batch, **distributed.data_shard())))
    runs = [VariantRun(*variant, source.schema, batch) for variant in VARIANTS[FLAGS.compare]]
    for run in runs:
        for _ in range(FLAGS.warmup_steps):
            run.step(timed=False)
    for _ in range(FLAGS.rounds):
        for run in runs:
            run.step(timed=True)
    if distributed.is_chief():
        report(runs, source.schema, distributed.size(), local_batch)


def report(runs, schema, ranks, local_batch):
    """Rank 0's description line, table header and one row per variant."""
    print(f"Machine: {machine_description()}.")
    print(f"DeepFM (embedding 10, DNN 400-400-400, {schema.num_categorical} fields, "
          f"{sum(schema.vocabulary_sizes):,} ids) with FusedAdam and the allgather exchange "
          "(row-sharded tables: alltoall lookups, the allgather exchange for the rest); "
          f"global batch {FLAGS.batch_size:,} over {ranks} ranks ({local_batch:,} each); "
          f"medians of rank 0 over {FLAGS.rounds} rounds alternating the variants after "
          f"{FLAGS.warmup_steps} warm-up steps each; MB = 10^6 bytes.\n")
    print("| P | global batch | tables | lookups | staleness | unique-id rate | step (s) | "
          "/ baseline | exchange (s) | exchange / step | MB sent+received per rank per step | "
          "/ baseline |")
    print("|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    base_step, base_bytes = runs[0].median(0), runs[0].median(2)
    for run in runs:
        step, exchange, nbytes, rate = (run.median(column) for column in range(4))
        rate_text = "" if rate is None else f"{rate:.3f}"
        print(f"| {ranks} | {FLAGS.batch_size:,} | {run.label} | {rate_text} | {step:.2f} | "
              f"{step / base_step:.2f} | {exchange:.2f} | {exchange / step:.2f} | "
              f"{nbytes / 1e6:,.1f} | {nbytes / base_bytes:.2f} |", flush=True)


if __name__ == "__main__":
    app.run(main)
