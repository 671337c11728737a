"""Tables sized from the data, and the exported model's serving speed: two measurements, each a
ratio against a baseline in the same run:

1. `--part=default_change`: the 10K-line sample (8K train / 2K test by line hash, batch 256,
   DeepFM, CowClip, one epoch) trained by `launch.train` in a fresh process per setting: every
   field hashed into 1M buckets against the default (the automatic vocabulary), and hashing with
   buckets fitted to the data. Reports parameters, peak memory, training
   examples/s and test AUC.
   Peak memory is the training process's high-water resident set (VmHWM).
2. `--part=serving`: rows/s of the exported SavedModel's `score_lines` (raw lines in, parsing
   and encoding in the graph) at batch 1, 64 and 4,096, against calling the Keras model on
   already preprocessed batches of the same rows, alternating the two, median of `--rounds`.

    python -m benchmarks.predict_serving --data=FILE [--part=default_change|serving|both]

With no --data, a 10,000-line Criteo-format file is written by the synthetic generator (there
is no real Criteo data on the machines these ran on). Output: markdown on stdout.
"""

import os
import re
import subprocess
import sys
import tempfile
import time

from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_string("data", None, "A Criteo TSV file (default: 10,000 synthetic lines).")
flags.DEFINE_enum("part", "both", ["default_change", "serving", "both"], "What to measure.")
flags.DEFINE_integer("rounds", 5, "Serving: timed rounds per setting (median).")
flags.DEFINE_integer("epochs", 3, "Training epochs per setting.")
flags.DEFINE_string("workdir", None, "Where runs and the SavedModel go (default: a temp dir).")

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMON = ["--data=criteo", "--batch_size=256", "--test_fraction=0.2", "--logdir=none",
          "--log_every_steps=1000"]
SETTINGS = [
    ("hash, 1M buckets per field (old default)",
     ["--categorical_encoding=hash", "--hash_buckets=1000000", "--nofit_hash_buckets"]),
    ("automatic vocabulary, min count 10 (new default)", []),
    ("hash, buckets fitted to the data (2x distinct, at most 1M)",
     ["--categorical_encoding=hash", "--hash_buckets=1000000"]),
]


def synthetic_sample(directory):
    from tfscale.data.synthetic import SyntheticCTR

    path = os.path.join(directory, "criteo_10k.txt")
    SyntheticCTR(seed=0, train_rows=10_000, test_rows=10).write_criteo_tsv(path, 0, 10_000)
    return path


def train_once(data, flags_, checkpoint_dir):
    """One launch.train in a fresh process: (stdout, peak resident memory in MB of that
    process, its VmHWM; ru_maxrss would not do: Linux carries it over from the parent across
    exec)."""
    command = [sys.executable, "-c",
               "import re, runpy, sys; sys.argv = ['launch.train'] + sys.argv[1:]\n"
               "try:\n    runpy.run_module('launch.train', run_name='__main__')\n"
               "finally:\n    print('peak_rss_kb', re.search(r'VmHWM:\\s+(\\d+)', "
               "open('/proc/self/status').read()).group(1), flush=True)",
               *COMMON, f"--epochs={FLAGS.epochs}", f"--train_path={data}",
               f"--checkpoint_dir={checkpoint_dir}", *flags_]
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(done.stdout + done.stderr)
    peak = int(re.search(r"peak_rss_kb (\d+)", done.stdout).group(1)) / 1024
    return done.stdout, peak


def default_change(data, workdir):
    print("| setting | parameters | peak memory (MB) | / old | train examples/s | / old | "
          "test AUC | test logloss |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    base = None
    for index, (name, extra) in enumerate(SETTINGS):
        out, peak = train_once(data, extra, os.path.join(workdir, f"run{index}"))
        parameters = int(re.search(r"\(([\d,]+) parameters\)", out).group(1).replace(",", ""))
        speeds = re.findall(r"\(([\d,]+) examples/s\)", out)  # per epoch; the median
        speed = sorted(float(v.replace(",", "")) for v in speeds)[len(speeds) // 2]
        auc, logloss = map(float, re.search(r"final test AUC ([\d.]+), logloss ([\d.]+)",
                                            out).groups())
        base = base or (peak, speed)
        print(f"| {name} | {parameters:,} | {peak:,.0f} | {peak / base[0]:.2f} | {speed:,.0f} | "
              f"{speed / base[1]:.2f} | {auc:.4f} | {logloss:.4f} |", flush=True)
    return os.path.join(workdir, "run1")


def serving(data, checkpoint_dir, workdir):
    import numpy as np
    import tensorflow as tf

    from launch import run_record

    saved_model = os.path.join(workdir, "served")
    if not os.path.exists(saved_model):
        done = subprocess.run([sys.executable, "-m", "launch.export",
                               f"--checkpoint_dir={checkpoint_dir}", f"--output={saved_model}"],
                              cwd=REPO_ROOT, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(done.stderr)
    record = run_record.read(checkpoint_dir)
    model, _ = record.restored_model()
    preprocessing = record.preprocessing()
    score_lines = tf.saved_model.load(saved_model).signatures["score_lines"]
    with open(data) as stream:
        lines = stream.read().splitlines()
    from tfscale.serving.export import RawScorer

    scorer = RawScorer(model, preprocessing, record.raw_inputs())
    parse = tf.function(scorer.line_features)
    in_process = tf.function(scorer.lines)
    keras_call = tf.function(lambda features: model(features, training=False))
    print("| batch | SavedModel score_lines, raw lines (rows/s) | Keras model on preprocessed "
          "batches (rows/s) | SavedModel / Keras | the same raw-line function in process, not "
          "saved (rows/s) | / Keras |")
    print("|---:|---:|---:|---:|---:|---:|")
    for batch_size in (1, 64, 4096):
        calls = max(1, min(2000, 40_000 // batch_size))
        batches = [tf.constant(lines[(i * batch_size) % (len(lines) - batch_size):][:batch_size])
                   for i in range(calls)]
        features = [parse(batch) for batch in batches]
        # trace and warm up
        score_lines(lines=batches[0]), keras_call(features[0]), in_process(batches[0])
        timings = {"saved": [], "keras": [], "in_process": []}
        for _ in range(FLAGS.rounds):
            started = time.perf_counter()
            for batch in batches:
                score_lines(lines=batch)["probability"].numpy()
            timings["saved"].append(time.perf_counter() - started)
            started = time.perf_counter()
            for batch in features:
                keras_call(batch).numpy()
            timings["keras"].append(time.perf_counter() - started)
            started = time.perf_counter()
            for batch in batches:
                in_process(batch).numpy()
            timings["in_process"].append(time.perf_counter() - started)
        rows = calls * batch_size
        saved, keras_, direct = (rows / np.median(timings[k])
                                 for k in ("saved", "keras", "in_process"))
        print(f"| {batch_size:,} | {saved:,.0f} | {keras_:,.0f} | {saved / keras_:.2f} | "
              f"{direct:,.0f} | {direct / keras_:.2f} |", flush=True)


def main(argv):
    del argv
    workdir = FLAGS.workdir or tempfile.mkdtemp(prefix="predict_serving-")
    os.makedirs(workdir, exist_ok=True)
    data = FLAGS.data or synthetic_sample(workdir)
    print(f"data: {data}; workdir {workdir}; peak memory is the training process's VmHWM\n")
    checkpoint_dir = os.path.join(workdir, "run1")
    if FLAGS.part in ("default_change", "both"):
        checkpoint_dir = default_change(data, workdir)
        print()
    if FLAGS.part in ("serving", "both"):
        if not os.path.exists(checkpoint_dir):
            train_once(data, SETTINGS[1][1], checkpoint_dir)
        serving(data, checkpoint_dir, workdir)


if __name__ == "__main__":
    app.run(main)
