"""Does a step's cost follow the batch or the table? Each optimizer's default (tables updated by
row) against its dense update (every row every step), on the built-in data at two table sizes,
one process each:

    python -m benchmarks.table_scaling [--scales=0.05,1] [--optimizers=adam,cowclip,came,adagrad,sgd]
        [--updates=row,dense] [--batch_size=8192] [--steps=30] [--rounds=1] [--out=FILE.jsonl]

Each run is `python -m launch.train` in a child process (no logs, no checkpoints, progress every
step). Measured per run: seconds from launch to the end of the first step (the launcher's
start-up: data source, model and tables, optimizer state, tracing); the median step time over
the steps after the first five; the child's peak resident memory (its rusage); and the bytes of
the tables and their optimizer state the launcher reports. Runs alternate (every configuration of
a round before the next round), and the CPU time other processes took during each run is
recorded, so a run that shared the machine can be told. Results go to --out as JSON lines and a
table is printed."""

import json
import os
import re
import subprocess
import sys
import time

import numpy as np
from absl import app, flags

from benchmarks.timing import machine_busy_seconds, machine_description

FLAGS = flags.FLAGS
flags.DEFINE_list("scales", ["0.05", "1"], "--synthetic_vocabulary_scale values (0.05: 1.8M "
                  "ids, 1: 33.8M, Criteo's cardinalities).")
flags.DEFINE_list("optimizers", ["adam", "cowclip", "came", "adagrad", "sgd"], "--optimizer values.")
flags.DEFINE_list("updates", ["row", "dense"], "--embedding_update values.")
flags.DEFINE_integer("batch_size", 8192, "Examples per step.")
flags.DEFINE_integer("steps", 30, "Training steps per run.")
flags.DEFINE_integer("rounds", 1, "Rounds over every configuration.")
flags.DEFINE_string("out", "benchmarks/results/table_scaling.jsonl", "JSON lines output.")

STEP_LINE = re.compile(r"step (\d+): .*, ([\d.]+) ms/step")
TABLES_LINE = re.compile(r"tables (?:replicated|row-sharded[^:]*): ([\d,]+) rows, ([\d,]+) MB")
SKIPPED_STEPS = 5


def run_once(scale, optimizer, update):
    """One launcher run's measurements (a dict)."""
    command = [sys.executable, "-m", "launch.train", f"--synthetic_vocabulary_scale={scale}",
               f"--optimizer={optimizer}", f"--embedding_update={update}",
               f"--batch_size={FLAGS.batch_size}",
               f"--train_rows={FLAGS.batch_size * FLAGS.steps}", "--test_rows=4096",
               "--log_every_steps=1", "--logdir=none", "--checkpoint_dir=none"]
    if optimizer == "cowclip" or update == "dense":
        command.append("--l2=0")  # dense L2 regularizers stay out of the way of the comparison
    busy_before = machine_busy_seconds()
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    first_step_end, step_ms, tables, output = None, [], None, []
    for line in process.stdout:
        output.append(line)
        match = STEP_LINE.search(line)
        if match:
            step, ms = int(match.group(1)), float(match.group(2))
            if first_step_end is None:  # the first line comes at step 2's end
                first_step_end = time.perf_counter() - started - ms / 1000
            if step > SKIPPED_STEPS:
                step_ms.append(ms)
        match = TABLES_LINE.search(line)
        if match:
            tables = {"rows": int(match.group(1).replace(",", "")),
                      "megabytes_with_optimizer_state": int(match.group(2).replace(",", ""))}
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - started
    if status != 0 or not step_ms:
        raise RuntimeError(f"{' '.join(command)} failed:\n{''.join(output[-30:])}")
    own_cpu = usage.ru_utime + usage.ru_stime
    return {"scale": float(scale), "optimizer": optimizer, "embedding_update": update,
            "batch_size": FLAGS.batch_size, "seconds_to_first_step": round(first_step_end, 2),
            "median_step_ms": float(np.median(step_ms)), "peak_rss_mb": usage.ru_maxrss / 1024,
            "wall_seconds": round(wall, 1), **(tables or {}),
            "other_processes_cpu_seconds": round(
                machine_busy_seconds() - busy_before - own_cpu, 1)}


def main(argv):
    del argv
    print(machine_description(), flush=True)
    results = []
    for round_index in range(FLAGS.rounds):
        for scale in FLAGS.scales:
            for optimizer in FLAGS.optimizers:
                for update in FLAGS.updates:
                    result = dict(run_once(scale, optimizer, update), round=round_index)
                    print(json.dumps(result), flush=True)
                    results.append(result)
                    with open(FLAGS.out, "a") as out:
                        out.write(json.dumps(result) + "\n")
    print("\n| table rows | optimizer | update | start to first step (s) | step (ms) | "
          "step / smallest table's | peak RSS (MB) | tables + state (MB) |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for result in results:
        smallest = min((r for r in results if r["optimizer"] == result["optimizer"]
                        and r["embedding_update"] == result["embedding_update"]),
                       key=lambda r: r["scale"])
        print(f"| {result.get('rows', 0):,} | {result['optimizer']} | "
              f"{result['embedding_update']} | {result['seconds_to_first_step']:.1f} | "
              f"{result['median_step_ms']:.0f} | "
              f"{result['median_step_ms'] / smallest['median_step_ms']:.2f} | "
              f"{result['peak_rss_mb']:,.0f} | "
              f"{result.get('megabytes_with_optimizer_state', 0):,} |")


if __name__ == "__main__":
    app.run(main)
