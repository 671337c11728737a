"""What the built-in data's per-id tables cost in memory at Criteo's cardinalities, and what
making a tf.data iterator over them adds:

    python -m benchmarks.synthetic_memory [--scale=1] [--trees=.] [--rounds=1]

SyntheticCTR keeps, per id, its place in the id order and the teacher's draws (a first-order
weight and an 8-wide hidden vector: 1.35 GB at scale 1), and reads them in its tf.data map
(held by reference: tfscale.data.pipeline.held_by_reference).
Each configuration runs in a fresh child process of each source tree given (--trees: checkouts
to compare), which prints the resident memory (RSS) after importing
TensorFlow, after the tables are built (with the process's peak so far, its rusage), and after
making the first iterator over the train batches (with the seconds that took): with tf.data's
static rewrites on or off, and with op determinism (the launcher's --deterministic, its
default) on or off. Memory only; the seconds are noisy on a shared machine."""

import json
import os
import pathlib
import resource
import subprocess
import sys
import time

from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_float("scale", 1.0, "--synthetic_vocabulary_scale of the data (1: Criteo's).")
flags.DEFINE_list("trees", ["."], "Source trees whose tfscale builds the data, in turn.")
flags.DEFINE_integer("rounds", 1, "Rounds over every configuration.")
flags.DEFINE_string("out", None, "JSON lines output (default: none).")
flags.DEFINE_list("child", None, "Internal: measure in this process (static rewrites, op "
                  "determinism) and print one JSON line.")

CONFIGURATIONS = [  # (static rewrites, op determinism)
    ("off", "on"), ("on", "on"), ("off", "off"), ("on", "off")]


def _rss_mb():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) / 1024 for line in status if line.startswith("VmRSS"))


def _peak_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure(scale, rewrites, determinism):
    """In this process: the memory and seconds the module docstring lists, as a dict."""
    import tensorflow as tf

    from tfscale.data.synthetic import SyntheticCTR

    if determinism == "on":
        tf.config.experimental.enable_op_determinism()
    result = {"rss_after_import_mb": _rss_mb()}
    source = SyntheticCTR(seed=0, vocabulary_scale=scale, train_rows=8192 * 4, test_rows=8192)
    tables = source._tables()  # waits for the background build
    result.update(
        tables_mb=sum(tensor.shape.num_elements() * tensor.dtype.size for tensor in tables
                      if isinstance(tensor, tf.Tensor)) / 2**20,
        rss_after_tables_mb=_rss_mb(), peak_after_tables_mb=_peak_mb())
    options = tf.data.Options()
    options.experimental_optimization.apply_default_optimizations = rewrites == "on"
    batches = source.train_batches(8192).with_options(options)
    started = time.perf_counter()
    next(iter(batches))
    result.update(first_batch_seconds=round(time.perf_counter() - started, 2),
                  rss_after_iterator_mb=_rss_mb(), peak_after_iterator_mb=_peak_mb())
    return result


def run_child(tree, scale, rewrites, determinism):
    """measure() in a fresh process whose tfscale is `tree`'s."""
    tree = str(pathlib.Path(tree).resolve())
    command = [sys.executable, __file__, f"--scale={scale}", f"--child={rewrites},{determinism}"]
    environment = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=tree)
    output = subprocess.run(command, capture_output=True, text=True, cwd=tree, env=environment)
    if output.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed in {tree}:\n{output.stderr[-3000:]}")
    return json.loads(output.stdout.strip().splitlines()[-1])


def _commit(tree):
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=tree, capture_output=True,
                          text=True).stdout.strip()


def main(argv):
    del argv
    if FLAGS.child:
        print(json.dumps(measure(FLAGS.scale, *FLAGS.child)))
        return
    results = []
    for round_index in range(FLAGS.rounds):
        for rewrites, determinism in CONFIGURATIONS:
            for tree in FLAGS.trees:
                result = dict(run_child(tree, FLAGS.scale, rewrites, determinism),
                              commit=_commit(tree), scale=FLAGS.scale, static_rewrites=rewrites,
                              op_determinism=determinism, round=round_index)
                print(json.dumps(result), flush=True)
                results.append(result)
                if FLAGS.out:
                    with open(FLAGS.out, "a") as out:
                        out.write(json.dumps(result) + "\n")
    print("\n| commit | static rewrites | op determinism | per-id tables (MB) | RSS after import "
          "(MB) | after the tables: RSS / peak (MB) | after the first iterator: RSS / peak (MB) "
          "| first batch (s) |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for r in results:
        print(f"| {r['commit']} | {r['static_rewrites']} | {r['op_determinism']} | "
              f"{r['tables_mb']:,.0f} | {r['rss_after_import_mb']:,.0f} | "
              f"{r['rss_after_tables_mb']:,.0f} / {r['peak_after_tables_mb']:,.0f} | "
              f"{r['rss_after_iterator_mb']:,.0f} / {r['peak_after_iterator_mb']:,.0f} | "
              f"{r['first_batch_seconds']:.2f} |")


if __name__ == "__main__":
    app.run(main)
