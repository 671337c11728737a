"""Step time of CowClip(Adam), faithful and scalable, over plain Adam on the same DeepFM, side by
side in one process:

    python -m benchmarks.cowclip_overhead [--batch_sizes=8192,65536] [--steps=8]

Each optimizer trains the same model shape on the same synthetic batches, alternating, each
measured --repeats times (median shown); the ratio is CowClip's step time over Adam's."""

import os
import platform
import statistics

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402
from absl import app, flags  # noqa: E402

import models  # noqa: E402
from benchmarks.timing import examples_per_second  # noqa: E402
from tfscale.data.synthetic import SyntheticCTR  # noqa: E402
from tfscale.optimizers import CowClip, FusedAdam, RowSparseAdam  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_list("batch_sizes", ["8192", "65536"], "Batch sizes to measure.")
flags.DEFINE_integer("steps", 8, "Timed steps per measurement.")
flags.DEFINE_integer("warmup_steps", 3, "Untimed steps first (tracing, allocation).")
flags.DEFINE_integer("repeats", 2, "Measurements per optimizer and batch size (median shown).")

OPTIMIZERS = {
    "adam": lambda: FusedAdam(1e-3),
    "cowclip_faithful": lambda: CowClip(FusedAdam(1e-4), FusedAdam(1e-3), l2=1e-5, mode="faithful"),
    "cowclip_scalable": lambda: CowClip(RowSparseAdam(1e-4, catch_up_l2=1e-5), FusedAdam(1e-3),
                                        l2=1e-5, mode="scalable"),
}


def measure(batch_size):
    """{optimizer name: examples/s (median)} at `batch_size`."""
    num_batches = FLAGS.warmup_steps + FLAGS.steps
    source = SyntheticCTR(seed=0, train_rows=batch_size * num_batches, test_rows=batch_size)
    compiled = {}
    for name, make_optimizer in OPTIMIZERS.items():
        keras.utils.set_random_seed(0)
        compiled[name] = models.build_model("deepfm", source.schema)
        compiled[name].compile(make_optimizer(), keras.losses.BinaryCrossentropy())
    rates = {name: [] for name in OPTIMIZERS}
    for _ in range(FLAGS.repeats):
        for name, model in compiled.items():
            rates[name].append(examples_per_second(
                model, {"x": source.train_batches(batch_size)}, batch_size,
                FLAGS.warmup_steps, FLAGS.steps))
    return {name: statistics.median(values) for name, values in rates.items()}


def main(argv):
    del argv
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, TensorFlow {tf.__version__}")
    print("| batch | Adam (examples/s) | CowClip faithful | step time ratio | CowClip scalable | "
          "step time ratio |")
    print("|---|---|---|---|---|---|")
    for batch_size in (int(b) for b in FLAGS.batch_sizes):
        rate = measure(batch_size)
        print(f"| {batch_size:,} | {rate['adam']:,.0f} | {rate['cowclip_faithful']:,.0f} | "
              f"{rate['adam'] / rate['cowclip_faithful']:.2f}x | {rate['cowclip_scalable']:,.0f} | "
              f"{rate['adam'] / rate['cowclip_scalable']:.2f}x |", flush=True)


if __name__ == "__main__":
    app.run(main)
