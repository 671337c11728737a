"""Training throughput of tfscale's DeepFM (models.deepfm fed by the streaming synthetic source)
against a plain Keras 3 DeepFM of the same shape (benchmarks.plain_keras_deepfm: Adam,
`model.fit` on in-memory numpy arrays), side by side in one process; and the Criteo reader's
rows/s on a Criteo-format file written by the synthetic generator.

    python -m benchmarks.throughput [--batch_sizes=1024,8192,65536] [--steps=8]

Prints a markdown table; the README's results table comes from it. Both models run the same
number of timed steps after the same warm-up, alternating, and each is measured `--repeats`
times; the table shows the median."""

import os
import platform
import statistics
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from absl import app, flags  # noqa: E402

import models  # noqa: E402
from benchmarks.plain_keras_deepfm import plain_keras_deepfm  # noqa: E402
from benchmarks.timing import examples_per_second  # noqa: E402
from tfscale.data.criteo import CriteoTSV  # noqa: E402
from tfscale.data.synthetic import SyntheticCTR  # noqa: E402
from tfscale.optimizers import FusedAdam  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_list("batch_sizes", ["1024", "8192", "65536"], "Batch sizes to measure.")
flags.DEFINE_integer("steps", 8, "Timed steps per measurement.")
flags.DEFINE_integer("warmup_steps", 3, "Untimed steps first (tracing, allocation).")
flags.DEFINE_integer("repeats", 2, "Measurements per model and batch size (median shown).")
flags.DEFINE_integer("reader_rows", 400_000, "Rows in the Criteo-format file for the reader.")


def _in_memory_arrays(source, batch_size, num_batches):
    features, labels = {"dense": [], "categorical": []}, []
    for x, y in source.train_batches(batch_size).take(num_batches):
        features["dense"].append(x["dense"].numpy())
        features["categorical"].append(x["categorical"].numpy())
        labels.append(y.numpy())
    return {k: np.concatenate(v) for k, v in features.items()}, np.concatenate(labels)


def measure_training(batch_size, warmup, steps, repeats):
    """{"tfscale": examples/s, "plain_keras": examples/s} (medians) at `batch_size`."""
    num_batches = warmup + steps
    source = SyntheticCTR(seed=0, train_rows=batch_size * num_batches, test_rows=batch_size)
    x, y = _in_memory_arrays(source, batch_size, num_batches)
    keras.utils.set_random_seed(0)
    ours = models.build_model("deepfm", source.schema)
    ours.compile(FusedAdam(1e-3), keras.losses.BinaryCrossentropy())  # the launcher's --optimizer=adam
    baseline = plain_keras_deepfm(source.schema)
    baseline.compile(keras.optimizers.Adam(1e-3), keras.losses.BinaryCrossentropy())
    results = {"tfscale": [], "plain_keras": []}
    for _ in range(repeats):
        results["tfscale"].append(examples_per_second(
            ours, {"x": source.train_batches(batch_size)}, batch_size, warmup, steps))
        results["plain_keras"].append(examples_per_second(
            baseline, {"x": x, "y": y, "batch_size": batch_size}, batch_size, warmup, steps))
    return {name: statistics.median(values) for name, values in results.items()}


def measure_reader(num_rows, batch_size=65536):
    """Rows/s of the Criteo TSV reader (hashed ids, log1p integers) over a file of `num_rows`."""
    source = SyntheticCTR(seed=1, train_rows=num_rows, test_rows=1)
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "train.txt")
        source.write_criteo_tsv(path, 0, num_rows)
        reader = CriteoTSV([path], test_fraction=0.0)
        started, rows = time.perf_counter(), 0
        for _, labels in reader.train_batches(batch_size):
            rows += int(labels.shape[0])
        return rows / (time.perf_counter() - started)


def main(argv):
    del argv
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"TensorFlow {tf.__version__}, Keras {keras.__version__}")
    print("| batch | tfscale DeepFM (examples/s) | plain Keras DeepFM (examples/s) | ratio |")
    print("|---|---|---|---|")
    largest_batch_rate = None
    for batch_size in (int(b) for b in FLAGS.batch_sizes):
        result = measure_training(batch_size, FLAGS.warmup_steps, FLAGS.steps, FLAGS.repeats)
        ratio = result["tfscale"] / result["plain_keras"]
        print(f"| {batch_size:,} | {result['tfscale']:,.0f} | {result['plain_keras']:,.0f} | "
              f"{ratio:.2f}x |", flush=True)
        largest_batch_rate = result["tfscale"]  # batch sizes are given in increasing order
    reader_rate = measure_reader(FLAGS.reader_rows)
    print(f"\nCriteo TSV reader: {reader_rate:,.0f} rows/s over {FLAGS.reader_rows:,} rows "
          f"({reader_rate / largest_batch_rate:.1f}x tfscale's training rate at the largest batch)")


if __name__ == "__main__":
    app.run(main)
