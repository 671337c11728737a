"""Online training on the drifting stream with the three kinds of tables, at equal memory
(docs/dynamic.md):

    python -m benchmarks.online_tables --days=7 --rows_per_day=200000

Each variant is one `launch.train --data=drifting --progressive` run (DeepFM, the launcher's
defaults, the same seed and days): every day is scored by the model as it stands (progressive
AUC and log loss), then trained on once. The variants:
- vocabulary: every id of day 1 (`--vocabulary_min_count=1`; ids later days bring read their
  field's out-of-vocabulary row);
- hashing fitted to day 1: the launcher's default, twice day 1's distinct ids per field (so twice
  the vocabulary's rows);
- hashing at equal rows: the vocabulary's rows split evenly over the fields (`--nofit_hash_buckets
  --hash_buckets=N`), so small fields keep every id and large ones collide;
- dynamic, min_count 1 and 3: raw ids, rows given as ids arrive, least recently used evicted,
  with as many rows as the day-1 vocabulary holds (equal memory: the vocabulary run goes first
  and its row count is the capacity).
The runs go one after another; the table gives each day's progressive AUC, the mean of the last
three days, the rows each run's tables hold, its peak RSS (the process's maximum resident set)
and its training examples/s, and --plot writes the AUC per day as a PNG."""

import os
import re
import subprocess
import sys

from absl import app, flags

from benchmarks.timing import machine_description
from tfscale.data.drifting import CATEGORICAL_NAMES

FLAGS = flags.FLAGS
flags.DEFINE_integer("days", 7, "Days of the drifting stream.")
flags.DEFINE_integer("rows_per_day", 200_000, "Rows of each day.")
flags.DEFINE_integer("batch_size", 4096, "Global batch.")
flags.DEFINE_string("plot", None, "Write the progressive AUC per day to this PNG.")

DAY = re.compile(r"^day (\d+)/\d+: progressive AUC ([\d.]+), logloss ([\d.]+)", re.M)
TRAINED = re.compile(r"^day \d+/\d+: trained \d+ steps in [\d.]+ s \(([\d,]+) examples/s\)", re.M)
ROWS = re.compile(r"tables [^:]*: ([\d,]+) rows")


def launcher_run(*flags_given):
    """(stdout, peak RSS in GB) of one launch.train run with the benchmark's data flags."""
    command = [sys.executable, "-m", "launch.train", "--data=drifting", "--progressive",
               f"--days={FLAGS.days}", f"--rows_per_day={FLAGS.rows_per_day}",
               f"--batch_size={FLAGS.batch_size}", "--logdir=none", "--checkpoint_dir=none",
               *flags_given]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    output = process.stdout.read()
    _, status, usage = os.wait4(process.pid, 0)
    if status != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{output[-3000:]}")
    return output, usage.ru_maxrss * 1024 / 1e9


def parse(label, output, peak_gb):
    days = sorted((int(d), float(auc)) for d, auc, _ in DAY.findall(output))
    speeds = [float(s.replace(",", "")) for s in TRAINED.findall(output)]
    rows = ROWS.search(output)
    return {"label": label, "auc": [auc for _, auc in days], "peak_gb": peak_gb,
            "rows": int(rows.group(1).replace(",", "")) if rows else None,
            "examples_per_second": sum(speeds) / len(speeds)}


def main(argv):
    del argv
    runs = []
    output, peak = launcher_run("--categorical_encoding=vocabulary", "--vocabulary_min_count=1")
    runs.append(parse("vocabulary of day 1", output, peak))
    print(runs[-1], file=sys.stderr, flush=True)  # each run as it ends, in case of a stop
    capacity = runs[0]["rows"] // 2  # the deep and the wide table hold as many rows each
    output, peak = launcher_run("--categorical_encoding=hash")
    runs.append(parse("hashing fitted to day 1", output, peak))
    print(runs[-1], file=sys.stderr, flush=True)
    buckets = max(1, capacity // len(CATEGORICAL_NAMES))
    output, peak = launcher_run("--categorical_encoding=hash", "--nofit_hash_buckets",
                                f"--hash_buckets={buckets}")
    runs.append(parse("hashing at equal rows", output, peak))
    print(runs[-1], file=sys.stderr, flush=True)
    for min_count in (1, 3):
        output, peak = launcher_run("--categorical_encoding=raw", "--embedding_sharding=dynamic",
                                    f"--dynamic_capacity={capacity}",
                                    f"--dynamic_min_count={min_count}")
        runs.append(parse(f"dynamic, min_count {min_count}", output, peak))
        print(runs[-1], file=sys.stderr, flush=True)
    report(runs)
    if FLAGS.plot:
        plot(runs, FLAGS.plot)


def report(runs):
    print(f"Machine: {machine_description()}.")
    print(f"DeepFM, launch.train's defaults, --data=drifting --progressive: {FLAGS.days} days of "
          f"{FLAGS.rows_per_day:,} rows, batch {FLAGS.batch_size:,}, one process; progressive "
          "AUC = the day scored before training on it. Rows: both tables' (deep and wide); the "
          "dynamic tables hold as many as the day-1 vocabulary.\n")
    days = " | ".join(f"day {d + 1}" for d in range(FLAGS.days))
    print(f"| tables | {days} | mean of the last 3 | rows | peak RSS (GB) | examples/s |")
    print("|---|" + "---:|" * (FLAGS.days + 4))
    for run in runs:
        aucs = " | ".join(f"{auc:.4f}" for auc in run["auc"])
        last = sum(run["auc"][-3:]) / len(run["auc"][-3:])
        print(f"| {run['label']} | {aucs} | {last:.4f} | {run['rows']:,} | "
              f"{run['peak_gb']:.2f} | {run['examples_per_second']:,.0f} |", flush=True)


def plot(runs, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4))
    for run in runs:
        axes.plot(range(1, len(run["auc"]) + 1), run["auc"], marker="o", label=run["label"])
    axes.set_xlabel("day")
    axes.set_ylabel("progressive AUC")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)


if __name__ == "__main__":
    app.run(main)
