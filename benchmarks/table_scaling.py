"""Does a step's cost follow the batch or the table? Each optimizer's default (tables updated by
row) against its dense update (every row every step), and each embedding exchange, on the built-in
data at two table sizes:

    python -m benchmarks.table_scaling [--scales=0.05,1] [--optimizers=adam,cowclip,came,adagrad,sgd]
        [--updates=row,dense] [--embedding_comms=allgather] [--ranks=1] [--batch_size=8192]
        [--steps=30] [--test_rows=4096] [--rounds=1] [--trees=.] [--out=FILE.jsonl]

Each run is `python -m launch.train` in a child process (no logs, no checkpoints, progress every
step). Measured per run: seconds from launch to the end of the first step (the launcher's
start-up: data source, model and tables, optimizer state, tracing); the median step time over
the steps after the first five; the child's peak resident memory (its rusage); and the bytes of
the tables and their optimizer state the launcher reports. Runs alternate (every configuration of
a round before the next round), and the CPU time other processes took during each run is
recorded, so a run that shared the machine can be told. Results go to --out as JSON lines and a
table is printed.

--ranks runs each configuration in one process (1) and under `horovodrun -np P -H localhost:P
--gloo` (P of 2 or more; --batch_size stays the global batch); the peak resident memory is then
the largest of the ranks' (rusage of horovodrun, whose descendants are all waited for).
--embedding_comms compares exchanges (the top-k ones at the launcher's default --density, each
rank keeping an error-feedback residual per table); the table gives each run's step against the
allgather run of the same round, table size and ranks.

--trees runs the launcher of each of several source trees (git worktrees: the code before and
after a change), alternating within every configuration, so that both meet the same load; each
result records its tree and commit. Start-up alone, before and after, at both table sizes:
`--optimizers=adam --updates=row --test_rows=8192 --rounds=3 --trees=OLD,NEW`."""

import json
import os
import pathlib
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
flags.DEFINE_list("embedding_comms", ["allgather"], "--embedding_comm values.")
flags.DEFINE_list("ranks", ["1"], "Numbers of processes: 1 runs the launcher alone, P > 1 under "
                  "horovodrun with P local ranks.")
flags.DEFINE_integer("batch_size", 8192, "Examples per step.")
flags.DEFINE_integer("steps", 30, "Training steps per run.")
flags.DEFINE_integer("test_rows", 4096, "Test rows (evaluated once, after the steps).")
flags.DEFINE_integer("rounds", 1, "Rounds over every configuration.")
flags.DEFINE_list("trees", ["."], "Source trees whose launcher runs, alternating.")
flags.DEFINE_string("out", "benchmarks/results/table_scaling.jsonl", "JSON lines output.")

STEP_LINE = re.compile(r"step (\d+): .*, ([\d.]+) ms/step")
TABLES_LINE = re.compile(r"tables (?:replicated|row-sharded[^:]*): ([\d,]+) rows, ([\d,]+) MB")
SKIPPED_STEPS = 5


def run_once(scale, optimizer, update, tree, comm="allgather", ranks=1):
    """One launcher run's measurements (a dict), the launcher being `tree`'s, with `ranks`
    processes (under horovodrun when above 1)."""
    launcher = []
    if ranks > 1:
        launcher = [str(pathlib.Path(sys.executable).parent / "horovodrun"), "-np", str(ranks),
                    "-H", f"localhost:{ranks}", "--gloo"]
    command = [*launcher, sys.executable, "-m", "launch.train",
               f"--synthetic_vocabulary_scale={scale}",
               f"--optimizer={optimizer}", f"--embedding_update={update}",
               f"--embedding_comm={comm}",
               f"--batch_size={FLAGS.batch_size}",
               f"--train_rows={FLAGS.batch_size * FLAGS.steps}", f"--test_rows={FLAGS.test_rows}",
               "--log_every_steps=1", "--logdir=none", "--checkpoint_dir=none"]
    if optimizer == "cowclip" or update == "dense":
        command.append("--l2=0")  # dense L2 regularizers stay out of the way of the comparison
    busy_before = machine_busy_seconds()
    load_before = _loadavg()
    started = time.perf_counter()
    tree = str(pathlib.Path(tree).resolve())
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, cwd=tree,
                               env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=tree))
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
            "embedding_comm": comm, "ranks": ranks, "tree": tree, "commit": _commit(tree),
            "batch_size": FLAGS.batch_size, "seconds_to_first_step": round(first_step_end, 2),
            "median_step_ms": float(np.median(step_ms)), "peak_rss_mb": usage.ru_maxrss / 1024,
            "wall_seconds": round(wall, 1), **(tables or {}),
            "other_processes_cpu_seconds": round(
                machine_busy_seconds() - busy_before - own_cpu, 1),
            "loadavg_1min_before_after": [load_before, _loadavg()]}


def _loadavg():
    """The machine's 1-minute load average (/proc/loadavg)."""
    with open("/proc/loadavg") as loadavg:
        return float(loadavg.read().split()[0])


def _commit(tree):
    """The tree's checked-out commit (short hash), with "+" if its tracked files have changes."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=tree, capture_output=True,
                          text=True).stdout.strip()
    changes = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=tree,
                             capture_output=True, text=True).stdout
    return head + ("+" if changes else "")


def main(argv):
    del argv
    print(machine_description(), flush=True)
    results = []
    for round_index in range(FLAGS.rounds):
        for ranks in FLAGS.ranks:
            for scale in FLAGS.scales:
                for optimizer in FLAGS.optimizers:
                    for update in FLAGS.updates:
                        for comm in FLAGS.embedding_comms:
                            for tree in FLAGS.trees:
                                result = dict(run_once(scale, optimizer, update, tree, comm,
                                                       int(ranks)), round=round_index)
                                print(json.dumps(result), flush=True)
                                results.append(result)
                                with open(FLAGS.out, "a") as out:
                                    out.write(json.dumps(result) + "\n")
    print("\n| round | ranks | table rows | optimizer | update | exchange | commit | start to "
          "first step (s) | step (ms) | step / smallest table's | step / allgather's | peak RSS "
          "(MB) | tables + state (MB) | other processes' CPU (s) |")
    print("|---|---|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for result in results:
        same = ("optimizer", "embedding_update", "embedding_comm", "ranks", "tree", "round")
        smallest = min((r for r in results if all(r[key] == result[key] for key in same)),
                       key=lambda r: r["scale"])
        allgather = next((r for r in results if r["embedding_comm"] == "allgather"
                          and all(r[key] == result[key] for key in
                                  ("optimizer", "embedding_update", "ranks", "tree", "round",
                                   "scale"))), None)
        versus = (f"{result['median_step_ms'] / allgather['median_step_ms']:.2f}"
                  if allgather else "")
        print(f"| {result['round']} | {result['ranks']} | {result.get('rows', 0):,} | "
              f"{result['optimizer']} | {result['embedding_update']} | "
              f"{result['embedding_comm']} | {result['commit']} | "
              f"{result['seconds_to_first_step']:.1f} | "
              f"{result['median_step_ms']:.0f} | "
              f"{result['median_step_ms'] / smallest['median_step_ms']:.2f} | {versus} | "
              f"{result['peak_rss_mb']:,.0f} | "
              f"{result.get('megabytes_with_optimizer_state', 0):,} | "
              f"{result['other_processes_cpu_seconds']:.1f} |")


if __name__ == "__main__":
    app.run(main)
