"""Memory per rank of replicated against row-sharded embedding tables
(tfscale.embedding.row_sharding): DeepFM over the synthetic data's schema at Criteo's full
cardinalities (--vocabulary_scale=1, 33.8M ids), FusedAdam, a few training steps at a global batch
of 8,192 on batches of uniformly drawn ids (the synthetic generator's planted teacher holds several
GB per process at this scale, which would hide the tables; a table's memory does not depend on which
ids are drawn):

    python -m benchmarks.sharding_memory --sharding=replicated                  # P = 1
    horovodrun -np P -H localhost:P --gloo python -m benchmarks.sharding_memory --sharding=row

Every rank measures the bytes of the embedding tables and their optimizer state it holds
(the tables and Adam moments their checkpoint format stores) and its peak resident set
size (getrusage) after the steps; rank 0 appends one JSON line per rank to --results and prints
them. `--report` prints the markdown table of every line in --results, with sharded state as a
fraction of the replicated state at the same P."""

import json
import os
import resource
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

import models  # noqa: E402
from benchmarks.timing import machine_description  # noqa: E402
from tfscale import distributed  # noqa: E402
from tfscale.data.schema import FeatureSchema  # noqa: E402
from tfscale.data.synthetic import scaled_cardinalities  # noqa: E402
from tfscale.optimizers import FusedAdam  # noqa: E402
from tfscale.embedding.table import tables_of  # noqa: E402
from tfscale.optimizers.table_state import per_row_state  # noqa: E402
from tfscale.training.run import build_model_and_optimizer  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_enum("sharding", "row", ["replicated", "row"], "How the tables are held.")
flags.DEFINE_integer("embedding_dim", 10, "Embedding width.")
flags.DEFINE_float("vocabulary_scale", 1.0, "Synthetic data: Criteo's cardinalities times this.")
flags.DEFINE_integer("batch_size", 8192, "Global batch.")
flags.DEFINE_integer("steps", 3, "Training steps.")
flags.DEFINE_string("results", "benchmarks/results/sharding_memory.jsonl", "JSON lines file.")
flags.DEFINE_bool("report", False, "Only print the table of --results.")


def measure():
    """This rank's measurements after FLAGS.steps training steps."""
    ranks, rank = distributed.size(), distributed.rank()
    sizes = tuple(c + 1 for c in scaled_cardinalities(FLAGS.vocabulary_scale))
    schema = FeatureSchema(tuple(f"I{j}" for j in range(13)),
                           tuple(f"C{f}" for f in range(len(sizes))), sizes)
    keras.utils.set_random_seed(0)
    started = time.perf_counter()
    model = models.build_model("deepfm", schema, embedding_dim=FLAGS.embedding_dim,
                               embedding_sharding=FLAGS.sharding)
    model.compile(optimizer=FusedAdam(1e-3), loss="binary_crossentropy")
    build_model_and_optimizer(model, schema)
    build_seconds = time.perf_counter() - started
    local = FLAGS.batch_size // ranks
    rng = np.random.default_rng(rank)
    step_seconds = []
    for _ in range(FLAGS.steps):
        features = {"dense": rng.normal(size=(local, 13)).astype(np.float32),
                    "categorical": np.stack([rng.integers(0, n, local) for n in sizes], axis=1)}
        started = time.perf_counter()
        model.train_on_batch(features, rng.integers(0, 2, (local, 1)).astype(np.float32))
        step_seconds.append(time.perf_counter() - started)
    tables = [table.variable for table in tables_of(model.variables)]
    held = tables + [slot for table in tables for slot in per_row_state(model.optimizer, table)]
    return {
        "sharding": FLAGS.sharding, "ranks": ranks, "rank": rank,
        "embedding_dim": FLAGS.embedding_dim, "ids": int(sum(sizes)),
        "ids_held": int(max(variable.shape[0] for variable in held)),
        "table_and_slot_bytes": int(sum(np.prod(variable.shape) * 4 for variable in held)),
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "build_seconds": build_seconds, "median_step_seconds": statistics.median(step_seconds),
        "batch_size": FLAGS.batch_size, "machine": machine_description(),
    }


def report(path):
    rows = [json.loads(line) for line in open(path)]
    replicated = {(r["ranks"], r["embedding_dim"]): r["table_and_slot_bytes"] for r in rows
                  if r["sharding"] == "replicated"}
    print(f"Machine: {rows[-1]['machine']}.\n")
    print("| dim | P | tables | rank | ids held | tables + Adam state (GB) | / replicated at P "
          "| peak RSS (GB) | build (s) | step (s) |")
    print("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        base = replicated.get((r["ranks"], r["embedding_dim"])) or replicated.get(
            (1, r["embedding_dim"]))
        ratio = f"{r['table_and_slot_bytes'] / base:.3f}" if base else "n/a"
        print(f"| {r['embedding_dim']} | {r['ranks']} | {r['sharding']} | {r['rank']} | "
              f"{r['ids_held']:,} | {r['table_and_slot_bytes'] / 1e9:.2f} | {ratio} | "
              f"{r['peak_rss_bytes'] / 1e9:.2f} | {r['build_seconds']:.1f} | "
              f"{r['median_step_seconds']:.2f} |")


def main(argv):
    del argv
    if FLAGS.report:
        report(FLAGS.results)
        return
    if distributed.launched_by_horovodrun():
        distributed.init()
    line = measure()
    lines = [line]
    if distributed.is_active():
        lines = distributed.engine().allgather_object(line, "sharding_memory")
    if distributed.is_chief():
        with open(FLAGS.results, "a") as f:
            for entry in lines:
                f.write(json.dumps(entry) + "\n")
                print(json.dumps(entry), flush=True)


if __name__ == "__main__":
    app.run(main)
