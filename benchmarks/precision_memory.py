"""Memory and step time of one DeepFM training step under each precision, side by side in one
process:

    python -m benchmarks.precision_memory [--batch_size=65536] [--optimizer=cowclip]

For float32, mixed_float16 (with dynamic loss scaling) and mixed_bfloat16 it builds the same
DeepFM with CowClip (or Adam) on the synthetic data and reports, from TensorFlow's allocator
statistics (tf.config.experimental.get_memory_info), the bytes held before a step (weights,
optimizer state, the batch) and the peak during one step; the difference is what the step itself
allocates (activations, gradients, temporaries). Step times are medians of rounds that alternate
between the precisions, so machine load hits all alike. Memory is the point on a CPU: TF's
float16 matrix products on this CPU are not accelerated (a 64K-batch float16 step took over ten
minutes here), so compare float16 at a smaller --batch_size."""

import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402
from absl import app, flags  # noqa: E402

import models  # noqa: E402
from benchmarks.timing import machine_description  # noqa: E402
from tfscale.data.synthetic import SyntheticCTR  # noqa: E402
from tfscale.optimizers import factory  # noqa: E402
from tfscale.optimizers.scaling import large_batch_settings  # noqa: E402
from tfscale.training.precision import PRECISIONS, parse_loss_scale, with_loss_scaling  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_integer("batch_size", 65536, "Examples per step.")
flags.DEFINE_enum("optimizer", "cowclip", ["cowclip", "adam"], "Optimizer of every model.")
flags.DEFINE_list("precisions", list(PRECISIONS), "Precisions to compare (float32 first: the "
                  "baseline of the ratios).")
flags.DEFINE_integer("rounds", 5, "Timing rounds (each runs --steps_per_round of every model).")
flags.DEFINE_integer("steps_per_round", 3, "Steps per model per round.")

CPU = "CPU:0"


class PrecisionRun:
    """One DeepFM compiled for one precision, trained on one fixed batch."""

    def __init__(self, precision, source, batch):
        keras.utils.set_random_seed(0)
        settings = large_batch_settings(FLAGS.batch_size, "cowclip", "criteo")
        self.precision = precision
        self.model = models.build_model(
            "deepfm", source.schema, dtype=precision,
            **factory.model_regularization(settings, FLAGS.optimizer))
        optimizer = factory.build_optimizer(settings, FLAGS.optimizer, warmup_steps=10)
        self.model.compile(with_loss_scaling(optimizer, parse_loss_scale(None, precision)),
                           keras.losses.BinaryCrossentropy())
        self.features, self.labels = batch
        self.seconds = []
        self.step()  # traces the step and builds the optimizer

    def step(self):
        started = time.perf_counter()
        self.model.train_on_batch(self.features, self.labels)
        return time.perf_counter() - started

    def measure_memory(self):
        """(bytes held before a step, peak bytes during it)."""
        tf.config.experimental.reset_memory_stats(CPU)
        held = tf.config.experimental.get_memory_info(CPU)["current"]
        self.step()
        return held, tf.config.experimental.get_memory_info(CPU)["peak"]


def main(argv):
    del argv
    source = SyntheticCTR(seed=0, train_rows=FLAGS.batch_size, test_rows=1024)
    batch = next(iter(source.train_batches(FLAGS.batch_size, epoch=0)))
    if FLAGS.precisions[0] != "float32" or not set(FLAGS.precisions) <= set(PRECISIONS):
        raise app.UsageError(f"--precisions: float32 first, then any of {PRECISIONS}")
    runs, memory = [], {}
    for precision in FLAGS.precisions:
        runs.append(PrecisionRun(precision, source, batch))
        memory[precision] = runs[-1].measure_memory()
        print(f"{precision}: {memory[precision][0]:,} bytes held, peak {memory[precision][1]:,}",
              flush=True)
    for _ in range(FLAGS.rounds):
        for run in runs:
            run.seconds.extend(run.step() for _ in range(FLAGS.steps_per_round))

    print(f"Machine: {machine_description()}.")
    print(f"DeepFM (embedding 10, DNN 400-400-400, {source.schema.num_categorical} fields, "
          f"{sum(source.schema.vocabulary_sizes):,} ids) with {FLAGS.optimizer}, one step at "
          f"batch {FLAGS.batch_size:,}; TensorFlow allocator statistics; step time = median of "
          f"{FLAGS.rounds * FLAGS.steps_per_round} steps alternating between precisions.\n")
    print("| precision | held before the step (MB) | peak in the step (MB) | allocated by the "
          "step (MB) | / float32 | step time (ms) | / float32 |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    base_step = memory["float32"][1] - memory["float32"][0]
    base_time = statistics.median(runs[0].seconds)
    for run in runs:
        held, peak = memory[run.precision]
        seconds = statistics.median(run.seconds)
        print(f"| {run.precision} | {held / 2**20:,.0f} | {peak / 2**20:,.0f} | "
              f"{(peak - held) / 2**20:,.0f} | {(peak - held) / base_step:.2f} | "
              f"{1000 * seconds:,.0f} | {seconds / base_time:.2f} |")


if __name__ == "__main__":
    app.run(main)
