"""What RowSparseAdam's catch-up of absent rows costs (tfscale.optimizers.row_sparse_adam):

    python -m benchmarks.catch_up [--rows=1802049,33762577] [--dim=10] [--unique_ids=100000]
        [--rounds=3]

On one [rows, dim] table (DeepFM's deep table at the built-in data's two sizes), timed side by
side in one process, alternating, the median of --rounds:
  - a row step without catch-up (lazy Adam) and with it, on --unique_ids random rows (about a
    batch of 8,192 at 1.8M ids after de-duplication): what the catch-up adds to every step;
  - `catch_up_every_row` (the whole-table pass tfscale.training.callbacks.CatchUpRows runs once per
    epoch) against one step of the dense update (FusedAdam on the densified gradient), which
    the dense path pays every step.
Prints one markdown row per table size, with the machine and the CPU time other processes took."""

import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from absl import app, flags  # noqa: E402

from benchmarks.timing import OtherProcessesCPU, machine_description  # noqa: E402
from tfscale.optimizers import FusedAdam, RowSparseAdam  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_list("rows", ["1802049", "33762577"], "Table rows (the built-in data's ids at "
                  "--synthetic_vocabulary_scale 0.05 and 1).")
flags.DEFINE_integer("dim", 10, "Table width (the launcher's DeepFM).")
flags.DEFINE_integer("unique_ids", 100_000, "Rows in each row step.")
flags.DEFINE_integer("rounds", 3, "Timed repetitions of each measurement (median reported).")


def _table(rows, name):
    return keras.Variable(tf.random.stateless_normal([rows, FLAGS.dim], [0, 1]) * 0.01,
                          name=name, autocast=False)


def _row_step(optimizer, table, rows):
    ids = tf.constant(np.random.default_rng(0).choice(rows, FLAGS.unique_ids, replace=False))
    values = tf.random.stateless_normal([FLAGS.unique_ids, FLAGS.dim], [0, 2]) * 1e-3
    gradient = tf.IndexedSlices(values, ids, tf.constant([rows, FLAGS.dim], tf.int64))
    step = tf.function(lambda: optimizer.apply([gradient], [table]))
    step()  # trace and build
    return step


def _timed(function):
    started = time.perf_counter()
    function()
    return time.perf_counter() - started


def measure(rows):
    lazy_table, caught_up_table, dense_table = (
        _table(rows, "embeddings") for _ in range(3))
    lazy = _row_step(RowSparseAdam(1e-3, table_l2=1e-5, catch_up=False), lazy_table, rows)
    caught_up_optimizer = RowSparseAdam(1e-3, table_l2=1e-5)
    caught_up = _row_step(caught_up_optimizer, caught_up_table, rows)
    dense_gradient = tf.random.stateless_normal([rows, FLAGS.dim], [0, 3]) * 1e-3
    dense_optimizer = FusedAdam(1e-3)
    dense = tf.function(lambda: dense_optimizer.apply([dense_gradient], [dense_table]))
    dense()
    caught_up_optimizer.catch_up_every_row()  # first call: eager op kernels warmed
    times = {"lazy": [], "catch_up": [], "dense": [], "every_row": []}
    others = OtherProcessesCPU()
    for _ in range(FLAGS.rounds):
        for _ in range(10):
            times["lazy"].append(_timed(lazy))
            times["catch_up"].append(_timed(caught_up))
        times["dense"].append(_timed(dense))
        times["every_row"].append(_timed(caught_up_optimizer.catch_up_every_row))
    median = {name: float(np.median(values)) for name, values in times.items()}
    return median, others.seconds()


def main(argv):
    del argv
    print(machine_description())
    print("| table rows | row step, lazy (ms) | row step, catch-up (ms) | ratio | "
          "catch_up_every_row (s) | dense step (s) | ratio | other processes' CPU s |")
    print("|---|---|---|---|---|---|---|---|")
    for rows in map(int, FLAGS.rows):
        median, other_seconds = measure(rows)
        print(f"| {rows:,} | {median['lazy'] * 1e3:.1f} | {median['catch_up'] * 1e3:.1f} | "
              f"{median['catch_up'] / median['lazy']:.2f}x | {median['every_row']:.2f} | "
              f"{median['dense']:.2f} | {median['every_row'] / median['dense']:.2f}x | "
              f"{other_seconds:.0f} |", flush=True)


if __name__ == "__main__":
    app.run(main)
