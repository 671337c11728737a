"""How long the end of a Keras epoch waits for tf.data with its autotuning on (TF's default)
and off (tfscale's pipelines, `tfscale.data.pipeline`):

    python -m benchmarks.iterator_teardown

DeepFM (Adam) trains one epoch of the built-in data's training pipeline per `fit` call, the
dataset cut to its known length as `tfscale.training.run` does, the two settings alternating
--repeats times. "Wait" is the time from the end of the epoch's last step to
`fit` returning: Keras deleting the epoch's iterator, plus its callbacks' epoch end (the same in
both settings). What autotuning off costs is read on the Criteo reader, whose parse map it leaves
at a fixed default parallelism: its rows/s over a Criteo-format file written by the generator, the
settings alternating."""

import os
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from absl import app, flags  # noqa: E402

import models  # noqa: E402
from benchmarks.timing import OtherProcessesCPU, machine_description  # noqa: E402
from tfscale.data.criteo import CriteoTSV  # noqa: E402
from tfscale.data.synthetic import SyntheticCTR  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_integer("repeats", 2, "Epochs per setting.")
flags.DEFINE_integer("batch_size", 65536, "Rows per batch.")
flags.DEFINE_integer("train_rows", 4_000_000, "Rows per epoch (the launcher's default data).")
flags.DEFINE_integer("reader_rows", 400_000, "Rows in the Criteo-format file for the reader.")
flags.DEFINE_integer("reader_repeats", 3, "Reader passes per setting.")


class LastStepTime(keras.callbacks.Callback):
    """Keeps the time the last training step ended."""

    def on_train_batch_end(self, batch, logs=None):
        self.time = time.perf_counter()


def with_autotuning(dataset, enabled):
    """`dataset` with tf.data's autotuning set to `enabled` (tfscale's sources turn it off)."""
    options = tf.data.Options()
    options.autotune.enabled = enabled
    return dataset.with_options(options)


def timed_epoch(model, source, autotune):
    """(epoch seconds, seconds from the last step's end to `fit` returning, other processes' CPU
    seconds) of one epoch."""
    steps = source.train_steps_per_epoch(FLAGS.batch_size)
    # As tfscale.training.run hands an epoch to Keras: with a known length, so Keras stops after the
    # last step rather than at the end of the data.
    dataset = with_autotuning(source.train_batches(FLAGS.batch_size), autotune).take(steps).apply(
        tf.data.experimental.assert_cardinality(steps))
    last_step, others = LastStepTime(), OtherProcessesCPU()
    started = time.perf_counter()
    model.fit(dataset, epochs=1, verbose=0, callbacks=[last_step])
    ended = time.perf_counter()
    return ended - started, ended - last_step.time, others.seconds()


def reader_rates(num_rows, repeats, batch_size=65536):
    """{autotune: [rows/s of each pass]} of the Criteo reader (hashed ids) over one file."""
    rates = {True: [], False: []}
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "train.txt")
        SyntheticCTR(seed=1, train_rows=num_rows, test_rows=1).write_criteo_tsv(path, 0, num_rows)
        reader = CriteoTSV([path], test_fraction=0.0)
        for _ in range(repeats):
            for autotune in (True, False):
                started, rows = time.perf_counter(), 0
                for _, labels in with_autotuning(reader.train_batches(batch_size), autotune):
                    rows += int(labels.shape[0])
                rates[autotune].append(rows / (time.perf_counter() - started))
    return rates


def main(argv):
    del argv
    tf.get_logger().setLevel("ERROR")  # with_options logs each change of the option
    source = SyntheticCTR(seed=0, train_rows=FLAGS.train_rows, test_rows=1)
    model = models.build_model("deepfm", source.schema)
    model.compile(keras.optimizers.Adam(1e-3), keras.losses.BinaryCrossentropy())
    print(machine_description())
    runs = {True: [], False: []}
    for _ in range(FLAGS.repeats):
        for autotune in (True, False):
            runs[autotune].append(timed_epoch(model, source, autotune))
    print(f"DeepFM, batch {FLAGS.batch_size:,}, {source.train_steps_per_epoch(FLAGS.batch_size)} "
          "steps an epoch, settings alternating\n"
          "| autotune | epoch seconds | wait after the last step (s) | other processes' CPU s "
          "| mean epoch s |\n|---|---|---|---|---|")
    for autotune in (True, False):
        epochs, waits, others = zip(*runs[autotune])
        print(f"| {'on (TF default)' if autotune else 'off (tfscale)'} | "
              + " | ".join(", ".join(f"{value:.1f}" for value in column)
                           for column in (epochs, waits, others))
              + f" | {np.mean(epochs):.1f} |")
    rates = reader_rates(FLAGS.reader_rows, FLAGS.reader_repeats)
    print(f"\nCriteo reader over {FLAGS.reader_rows:,} rows, settings alternating\n"
          "| autotune | rows/s, each pass | median |\n|---|---|---|")
    for autotune in (True, False):
        print(f"| {'on (TF default)' if autotune else 'off (tfscale)'} | "
              + ", ".join(f"{rate:,.0f}" for rate in rates[autotune])
              + f" | {np.median(rates[autotune]):,.0f} |")


if __name__ == "__main__":
    app.run(main)
