"""Memory per rank of dynamic tables (docs/dynamic.md) against their capacity: DeepFM (the
launcher's default model and optimizer: embedding 10, DNN 400-400-400, RowSparseAdam) on the
synthetic data (vocabulary scale 1/20, 1.80M ids), 20 steps at a global batch of 8,192, a new
batch every step, with dynamic tables of capacity 3.4M, 33.8M and 135M ids and, beside them,
fixed row-sharded tables at the data's vocabulary:

    python -m benchmarks.dynamic_memory               # every run at P = 1 and 4, then the table
    python -m benchmarks.dynamic_memory --report      # the table of --results
    python -m benchmarks.dynamic_memory --ranks=4 --capacities=135000000 \
        --table_optimizer=rowwise_adagrad --table_dtype=bfloat16   # tables at fewer bytes a row

Each run is a process of its own (under `horovodrun -np 4 -H localhost:4 --gloo` at P = 4),
started by this script, which kills it when its processes pass --max_total_gb of resident
memory together. A run measures, per rank: the peak resident set size (VmHWM), the resident
set after the model and optimizer are built (before the first step), the seconds from its
launch to then and to the end of its first step, the median step time of steps 2-20, the rows
in use (summed over the ranks) and the bytes a row takes with its optimizer state and IdRows'
per-row state; rank 0 appends one JSON line per rank to --results and prints it."""

import json
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_list("capacities", ["3400000", "33800000", "135000000"],
                  "Dynamic tables' capacities (ids over all ranks).")
flags.DEFINE_list("ranks", ["1", "4"], "Numbers of ranks.")
flags.DEFINE_integer("batch_size", 8192, "Global batch, split evenly over the ranks.")
flags.DEFINE_integer("steps", 20, "Training steps (the first one traces).")
flags.DEFINE_float("vocabulary_scale", 1 / 20, "The synthetic data's vocabulary scale.")
flags.DEFINE_float("max_total_gb", 16.0, "Kill a run whose processes pass this resident memory.")
flags.DEFINE_string("results", "benchmarks/results/dynamic_memory.jsonl", "JSON lines file.")
flags.DEFINE_bool("report", False, "Only print the table of --results.")
flags.DEFINE_string("note", "", "What else ran on the machine (stored with each line).")
flags.DEFINE_enum("table_optimizer", "adam", ["adam", "rowwise_adagrad"],
                  "The tables' optimizer: RowSparseAdam or RowWiseAdagrad (docs/table_memory.md).")
flags.DEFINE_enum("table_dtype", "float32", ["float32", "bfloat16", "float16"],
                  "What the tables store their rows in.")
# A run's own flags (set by the script for the processes it starts).
flags.DEFINE_string("run", None, "'row' or a dynamic capacity: run one measurement.")
flags.DEFINE_float("launched_at", None, "time.time() when the run was launched.")


def status_bytes(field):
    """A memory field of /proc/self/status: VmRSS (resident now) or VmHWM (its peak; rusage's
    maxrss would start at the parent's, which Linux carries over a fork and exec)."""
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith(field))


def measure():
    """This rank's measurements of the run FLAGS.run."""
    import keras
    import numpy as np
    import tensorflow as tf

    import models
    from benchmarks.timing import cpu_flags, machine_description
    from tfscale import distributed
    from tfscale.data.synthetic import SyntheticCTR
    from tfscale.embedding.dynamic import DynamicTables
    from tfscale.embedding.initializers import RowSeededNormal
    from tfscale.optimizers import RowSparseAdam, RowWiseAdagrad
    from tfscale.optimizers.table_state import dynamic_row_bytes, per_row_state
    from tfscale.training.run import build_model_and_optimizer

    if distributed.launched_by_horovodrun():
        distributed.init()
    local_batch = distributed.local_batch_size(FLAGS.batch_size)
    source = SyntheticCTR(seed=0, train_rows=FLAGS.batch_size * FLAGS.steps, test_rows=1024,
                          vocabulary_scale=FLAGS.vocabulary_scale)
    ids = sum(source.schema.vocabulary_sizes)
    sharding = "row" if FLAGS.run == "row" else DynamicTables(capacity=int(FLAGS.run))
    keras.utils.set_random_seed(0)
    model = models.build_model("deepfm", source.schema, embedding_sharding=sharding,
                               embeddings_initializer=RowSeededNormal(stddev=0.01),
                               table_dtype=FLAGS.table_dtype)
    optimizer = (RowSparseAdam(learning_rate=1e-3, table_l2=1e-5)
                 if FLAGS.table_optimizer == "adam"
                 else RowWiseAdagrad(learning_rate=0.03, table_l2=1e-5))
    model.compile(optimizer=optimizer, loss=keras.losses.BinaryCrossentropy())
    build_model_and_optimizer(model, source.schema)
    built_rss, built_at = status_bytes("VmRSS"), time.time()
    seconds, first_step_at = [], None
    for batch in source.train_batches(local_batch, **distributed.data_shard()).take(FLAGS.steps):
        started = time.perf_counter()
        model.train_on_batch(*batch)
        seconds.append(time.perf_counter() - started)
        first_step_at = first_step_at or time.time()
    row_bytes = dynamic_row_bytes(model)
    if row_bytes:
        rows_in_use = model.summary_scalars()["dynamic/id_rows/rows_in_use"]
        rows_held, row_bytes = row_bytes[0][0].rows, row_bytes[0][1]
    else:  # every row of the shards: the tables and their per-row optimizer state
        tables = [v for v in model.trainable_variables if v.path.endswith("embeddings")]
        rows_in_use = ids
        rows_held = int(tables[0].shape[0])
        row_bytes = sum(int(np.prod(v.shape[1:])) * tf.as_dtype(v.dtype).size
                        for t in tables for v in [t, *per_row_state(model.optimizer, t)])
    return {
        "tables": "row" if FLAGS.run == "row" else "dynamic", "capacity": int(FLAGS.run)
        if FLAGS.run != "row" else ids, "ranks": distributed.size(), "rank": distributed.rank(),
        "ids": ids, "rows_held_per_rank": rows_held, "rows_in_use": int(rows_in_use),
        "bytes_per_row": row_bytes, "built_rss_bytes": built_rss,
        "peak_rss_bytes": status_bytes("VmHWM"),
        "launch_to_built_seconds": built_at - FLAGS.launched_at,
        "launch_to_first_step_seconds": first_step_at - FLAGS.launched_at,
        "median_step_seconds": statistics.median(seconds[1:]), "batch_size": FLAGS.batch_size,
        "steps": FLAGS.steps, "table_optimizer": FLAGS.table_optimizer,
        "table_dtype": FLAGS.table_dtype, "machine": machine_description(),
        "cpu_flags": cpu_flags(),
        "date": time.strftime("%Y-%m-%d"), "note": FLAGS.note,
    }


def run_one():
    from tfscale import distributed

    line = measure()
    lines = [line]
    if distributed.is_active():
        lines = distributed.engine().allgather_object(line, "dynamic_memory")
    if distributed.is_chief():
        with open(FLAGS.results, "a") as results:
            for entry in lines:
                results.write(json.dumps(entry) + "\n")
                print(json.dumps(entry), flush=True)


def launch(what, ranks):
    """Runs one measurement in processes of its own; kills them when together they pass
    --max_total_gb resident. Returns whether it finished."""
    command = [sys.executable, "-m", "benchmarks.dynamic_memory", f"--run={what}",
               f"--launched_at={time.time()}", f"--batch_size={FLAGS.batch_size}",
               f"--steps={FLAGS.steps}", f"--vocabulary_scale={FLAGS.vocabulary_scale}",
               f"--results={FLAGS.results}", f"--note={FLAGS.note}",
               f"--table_optimizer={FLAGS.table_optimizer}", f"--table_dtype={FLAGS.table_dtype}"]
    if ranks > 1:
        horovodrun = os.path.join(os.path.dirname(sys.executable), "horovodrun")
        command = [horovodrun, "-np", str(ranks), "-H", f"localhost:{ranks}", "--gloo",
                   *command]
    process = subprocess.Popen(command, start_new_session=True)
    while process.poll() is None:
        total = tree_rss_bytes(process.pid)
        if total > FLAGS.max_total_gb * 1e9:
            print(f"killed P={ranks} {what}: {total / 1e9:.1f} GB resident", flush=True)
            os.killpg(process.pid, 9)
            process.wait()
            return False
        time.sleep(0.5)
    return process.returncode == 0


def tree_rss_bytes(root):
    """The resident bytes of process `root` and its descendants (ps)."""
    listed = subprocess.run(["ps", "-e", "-o", "pid=,ppid=,rss="], capture_output=True,
                            text=True).stdout
    children, rss = {}, {}
    for line in listed.splitlines():
        pid, ppid, kilobytes = map(int, line.split())
        children.setdefault(ppid, []).append(pid)
        rss[pid] = kilobytes * 1024
    total, pending = 0, [root]
    while pending:
        pid = pending.pop()
        total += rss.get(pid, 0)
        pending += children.get(pid, [])
    return total


def report(path):
    rows = [json.loads(line) for line in open(path)]
    print(f"Machine: {rows[-1]['machine']}; CPU flags {rows[-1]['cpu_flags']}.\n")
    print("| P | tables | optimizer, dtype | capacity | rows held per rank | rows in use (all "
          "ranks) | bytes per row | rank | RSS built (GB) | peak RSS (GB) | launch to built (s) "
          "| launch to first step (s) | step (ms) |")
    print("|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        setting = f"{r.get('table_optimizer', 'adam')}, {r.get('table_dtype', 'float32')}"
        print(f"| {r['ranks']} | {r['tables']} | {setting} | {r['capacity']:,} | "
              f"{r['rows_held_per_rank']:,} | {r['rows_in_use']:,} | {r['bytes_per_row']} | "
              f"{r['rank']} | {r['built_rss_bytes'] / 1e9:.2f} | {r['peak_rss_bytes'] / 1e9:.2f} "
              f"| {r['launch_to_built_seconds']:.1f} | {r['launch_to_first_step_seconds']:.1f} | "
              f"{r['median_step_seconds'] * 1e3:,.0f} |")


def main(argv):
    del argv
    if FLAGS.run:
        run_one()
        return
    if not FLAGS.report:
        for ranks in map(int, FLAGS.ranks):
            for what in ["row", *FLAGS.capacities]:
                launch(what, ranks)
    report(FLAGS.results)


if __name__ == "__main__":
    app.run(main)
