"""A SavedModel export of dynamic tables (docs/dynamic.md, tfscale.serving.saved_model): its
variables directory, seconds and peak memory at capacity 33.8M ids, for the library of each
code tree given (the baseline first), side by side in one invocation:

    python -m benchmarks.dynamic_export --trees=before=/path/to/baseline/checkout,after=.
    python -m benchmarks.dynamic_export --report      # the table of --results

Each tree's run is a process of its own, started with the tree as its working directory and
PYTHONPATH: DeepFM as the launcher builds it (embedding 10, DNN 400-400-400, RowSparseAdam) on the
synthetic data (vocabulary scale 1/20), --steps training steps at --batch_size, then
`tfscale.serving.export_model` into a new directory. It measures the rows in use, the seconds of
the export, the bytes of the SavedModel's variables directory, the resident set before the
export and its peak during it (VmHWM, reset before the export through /proc/self/clear_refs),
and appends one JSON line to --results."""

import json
import os
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_list("trees", ["after=."], "label=path of each code tree to measure, baseline first.")
flags.DEFINE_integer("capacity", 33_800_000, "The dynamic tables' capacity (ids).")
flags.DEFINE_integer("batch_size", 1024, "Training batch.")
flags.DEFINE_integer("steps", 5, "Training steps before the export.")
flags.DEFINE_float("vocabulary_scale", 1 / 20, "The synthetic data's vocabulary scale.")
flags.DEFINE_string("results", os.path.abspath("benchmarks/results/dynamic_export.jsonl"),
                    "JSON lines file.")
flags.DEFINE_bool("report", False, "Only print the table of --results.")
flags.DEFINE_string("note", "", "What else ran on the machine (stored with each line).")
flags.DEFINE_string("run", None, "A tree's label: run its measurement in this process.")


def status_bytes(field):
    """VmRSS (resident now) or VmHWM (its peak since the last reset) of this process."""
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith(field))


def directory_bytes(path):
    return sum(os.path.getsize(os.path.join(folder, name))
               for folder, _, names in os.walk(path) for name in names)


def measure():
    """The measurement of this process's tree (FLAGS.run)."""
    import keras
    import tensorflow as tf

    import models
    import tfscale
    from benchmarks.timing import cpu_flags, machine_description
    from tfscale.data.synthetic import SyntheticCTR
    from tfscale.embedding.dynamic import DynamicTables
    from tfscale.optimizers import RowSparseAdam
    from tfscale.training.run import build_model_and_optimizer

    source = SyntheticCTR(seed=0, train_rows=FLAGS.batch_size * FLAGS.steps, test_rows=1024,
                          vocabulary_scale=FLAGS.vocabulary_scale)
    keras.utils.set_random_seed(0)
    model = models.build_model("deepfm", source.schema,
                               embedding_sharding=DynamicTables(capacity=FLAGS.capacity))
    model.compile(optimizer=RowSparseAdam(learning_rate=1e-3), loss="binary_crossentropy")
    build_model_and_optimizer(model, source.schema)
    for batch in source.train_batches(FLAGS.batch_size).take(FLAGS.steps):
        model.train_on_batch(*batch)
    rows_in_use = int(model.summary_scalars()["dynamic/id_rows/rows_in_use"])
    before_rss = status_bytes("VmRSS")
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")  # VmHWM := VmRSS, so the peak below is the export's
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "served", "1")
        started = time.perf_counter()
        tfscale.serving.export_model(model, path, input_signature=[{
            "dense": tf.TensorSpec([None, source.schema.num_dense], tf.float32),
            "categorical": tf.TensorSpec([None, source.schema.num_categorical], tf.int64)}])
        seconds = time.perf_counter() - started
        peak_rss = status_bytes("VmHWM")
        variables = directory_bytes(os.path.join(path, "variables"))
        graph = directory_bytes(path) - variables
    return {
        "tree": FLAGS.run, "library": os.path.dirname(tfscale.__file__),
        "capacity": FLAGS.capacity, "rows_in_use": rows_in_use,
        "export_seconds": seconds, "variables_bytes": variables, "graph_bytes": graph,
        "rss_before_export_bytes": before_rss, "peak_rss_in_export_bytes": peak_rss,
        "batch_size": FLAGS.batch_size, "steps": FLAGS.steps,
        "vocabulary_scale": FLAGS.vocabulary_scale, "machine": machine_description(),
        "cpu_flags": cpu_flags(), "date": time.strftime("%Y-%m-%d"), "note": FLAGS.note,
    }


def launch(label, tree):
    """Runs the measurement of the library in `tree` in a process of its own."""
    tree = os.path.abspath(tree)
    command = [sys.executable, os.path.abspath(__file__), f"--run={label}",
               f"--capacity={FLAGS.capacity}", f"--batch_size={FLAGS.batch_size}",
               f"--steps={FLAGS.steps}", f"--vocabulary_scale={FLAGS.vocabulary_scale}",
               f"--results={os.path.abspath(FLAGS.results)}", f"--note={FLAGS.note}"]
    # This file runs by its path (the baseline's tree may not have it), so the library and the
    # models come from `tree`, first on the path.
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    subprocess.run(command, cwd=tree, check=True,
                   env=dict(os.environ, PYTHONPATH=f"{tree}{os.pathsep}{here}"))


def report(path):
    rows = [json.loads(line) for line in open(path)]
    print(f"Machine: {rows[-1]['machine']}; CPU flags {rows[-1]['cpu_flags']}.\n")
    print("| tree | capacity | rows in use | variables (MB) | graph (MB) | export (s) | RSS "
          "before (GB) | peak RSS in export (GB) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['tree']} | {r['capacity']:,} | {r['rows_in_use']:,} | "
              f"{r['variables_bytes'] / 1e6:,.2f} | {r['graph_bytes'] / 1e6:,.2f} | "
              f"{r['export_seconds']:.1f} | {r['rss_before_export_bytes'] / 1e9:.2f} | "
              f"{r['peak_rss_in_export_bytes'] / 1e9:.2f} |")


def main(argv):
    del argv
    if FLAGS.run:
        line = measure()
        with open(FLAGS.results, "a") as results:
            results.write(json.dumps(line) + "\n")
        print(json.dumps(line), flush=True)
        return
    if not FLAGS.report:
        for label, tree in (entry.split("=", 1) for entry in FLAGS.trees):
            launch(label, tree)
    report(FLAGS.results)


if __name__ == "__main__":
    app.run(main)
