"""RowSparseAdam's row step (tfscale.optimizers.row_sparse_adam) against the same step of another
checkout, alternating in one process, so both see the same load:

    python -m benchmarks.row_step --before=/path/to/a/worktree [--rows_per_step=20000,100000]

One [--rows, --dim] table (DeepFM's deep table at the built-in data's default size) per
optimizer; 8 prepared row gradients of --rows_per_step unique rows each; --steps steps of each
optimizer in turn (the order flips every step), with and without the catch-up. The other
checkout's `tfscale/optimizers/row_sparse_adam.py` is loaded on top of this checkout's package
(its imports must still exist here). Prints the median ms per step of each, their ratio, and the
CPU time other processes took."""

import importlib.util
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from absl import app, flags  # noqa: E402

from benchmarks.timing import OtherProcessesCPU, machine_description  # noqa: E402
from tfscale.optimizers import RowSparseAdam  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_string("before", None, "Another checkout of tfscale (e.g. a git worktree of main).")
flags.DEFINE_integer("rows", 1_802_049, "Table rows.")
flags.DEFINE_integer("dim", 10, "Table width.")
flags.DEFINE_list("rows_per_step", ["20000", "100000"], "Unique rows in each step's gradient "
                  "(about batch 1,024 and 8,192 of the built-in data after de-duplication).")
flags.DEFINE_integer("steps", 60, "Timed steps of each optimizer.")
flags.mark_flag_as_required("before")


def _before_class():
    path = os.path.join(FLAGS.before, "tfscale", "optimizers", "row_sparse_adam.py")
    spec = importlib.util.spec_from_file_location("row_sparse_adam_before", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.RowSparseAdam


def _steps(optimizer_class, rows_per_step, catch_up):
    """8 traced steps of a fresh table and optimizer, one per prepared gradient."""
    table = keras.Variable(tf.random.stateless_normal([FLAGS.rows, FLAGS.dim], [0, 1]) * 0.01,
                           name="embeddings", autocast=False)
    optimizer = optimizer_class(1e-3, table_l2=1e-5, catch_up=catch_up)
    rng = np.random.default_rng(0)
    steps = []
    for seed in range(8):
        ids = tf.constant(rng.choice(FLAGS.rows, rows_per_step, replace=False))
        values = tf.random.stateless_normal([rows_per_step, FLAGS.dim], [seed, 2]) * 1e-3
        gradient = tf.IndexedSlices(values, ids, tf.constant([FLAGS.rows, FLAGS.dim], tf.int64))
        step = tf.function(lambda gradient=gradient: optimizer.apply([gradient], [table]))
        step()  # trace (and build, the first time)
        steps.append(step)
    return steps


def main(argv):
    del argv
    before = _before_class()
    print(machine_description())
    print("| rows a step | catch-up | this checkout (ms) | --before (ms) | ratio | "
          "other processes' CPU s |\n|---|---|---|---|---|---|")
    for rows_per_step in map(int, FLAGS.rows_per_step):
        for catch_up in (True, False):
            runs = {"this": _steps(RowSparseAdam, rows_per_step, catch_up),
                    "before": _steps(before, rows_per_step, catch_up)}
            times = {name: [] for name in runs}
            others = OtherProcessesCPU()
            for i in range(FLAGS.steps):
                for name in (("this", "before") if i % 2 else ("before", "this")):
                    started = time.perf_counter()
                    runs[name][i % 8]()
                    times[name].append(time.perf_counter() - started)
            median = {name: float(np.median(values)) * 1e3 for name, values in times.items()}
            print(f"| {rows_per_step:,} | {'on' if catch_up else 'off'} | {median['this']:.1f} | "
                  f"{median['before']:.1f} | {median['this'] / median['before']:.2f}x | "
                  f"{others.seconds():.0f} |", flush=True)


if __name__ == "__main__":
    app.run(main)
