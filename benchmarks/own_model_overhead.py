"""Step time of the README's own-model example under horovodrun with and without what tfscale
adds to a user's `fit` (docs/own_model.md), and with the per-batch agreement of data of unknown
length:

    horovodrun -np 2 -H localhost:2 --gloo python -m benchmarks.own_model_overhead

Each rank builds the README's model (26 fields, FieldEmbedding with a wide term, one dense
layer, RowSparseAdam, allgather exchange) and trains it on its part of random arrays at the
global batch --batch_size, in three variants taken in turn every round (each round starting
with another), so machine load hits all alike:
- `tfscale fit`: `model.fit(rank_batches(arrays, B))`, TrainStep's fit (the model and optimizer
  built and broadcast before the first step, Keras's file writers on rank 0, the epoch's
  metrics summed over the ranks);
- `Keras fit`: `keras.Model.fit(model, ...)` on the same batches, skipping TrainStep's fit (the
  epoch-end metric sum still runs, after the timed steps);
- `unknown length`: `model.fit` on the same batches behind `agreed_batches`, which agrees over
  the ranks before each batch whether all of them still have one.
Each fit runs --steps steps; the first of each is left out (it includes the fit's start). Rank 0
prints the machine, then one markdown row per variant: median step time over the rounds' steps,
its ratio to Keras fit's, and the range of the per-round medians' ratios."""

import os
import statistics
import subprocess

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

import tfscale  # noqa: E402
from benchmarks.timing import (OtherProcessesCPU, StepTimer, machine_description,  # noqa: E402
                               start_horovod_ranks)
from tfscale import distributed  # noqa: E402
from tfscale.data.rank_batches import agreed_batches, rank_batches  # noqa: E402
from tfscale.optimizers import RowSparseAdam  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_integer("batch_size", 8192, "Global batch, split evenly over the ranks.")
flags.DEFINE_integer("steps", 12, "Steps per fit; the first is not timed.")
flags.DEFINE_integer("rounds", 9, "Rounds; each fits every variant once.")
flags.DEFINE_integer("rows_per_field", 10_000, "Rows of each of the 26 fields' tables.")

FIELDS = 26


def readme_model(rows_per_field):
    ids = keras.Input((FIELDS,), dtype="int64")
    vectors, linear = tfscale.FieldEmbedding([rows_per_field] * FIELDS, embedding_dim=16,
                                             use_wide=True)(ids)
    logit = keras.layers.Dense(1)(keras.layers.Flatten()(vectors)) + linear
    model = tfscale.FunctionalTrainStepModel(ids, keras.layers.Activation("sigmoid")(logit))
    model.compile(optimizer=RowSparseAdam(1e-3), loss="binary_crossentropy",
                  metrics=[keras.metrics.AUC(name="auc")], embedding_exchange="allgather")
    return model


def step_seconds(fit, batches):
    """The durations of the steps after the first of one `fit(batches, callbacks=...)`."""
    timer = StepTimer()
    fit(batches, epochs=1, verbose=0, shuffle=False, callbacks=[timer])
    return list(np.diff(timer.times))


def cpu_flags():
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    return next((line.split(":", 1)[1].strip() for line in out.splitlines()
                 if line.startswith("Flags")), "unknown")


def main(argv):
    del argv
    start_horovod_ranks()
    rng = np.random.default_rng(0)
    rows = FLAGS.steps * FLAGS.batch_size
    ids = rng.integers(0, FLAGS.rows_per_field, size=(rows, FIELDS)).astype(np.int64)
    labels = (rng.random((rows, 1)) < 0.3).astype(np.float32)
    model = readme_model(FLAGS.rows_per_field)
    batches = rank_batches((ids, labels), FLAGS.batch_size)
    variants = {
        "tfscale fit": lambda: step_seconds(model.fit, batches),
        "Keras fit": lambda: step_seconds(lambda *a, **k: keras.Model.fit(model, *a, **k),
                                          batches),
        "unknown length": lambda: step_seconds(model.fit, agreed_batches(batches)),
    }
    for run in variants.values():  # warm-up: traces the step, builds and broadcasts
        run()
    seconds = {name: [] for name in variants}
    others = OtherProcessesCPU()
    names = list(variants)
    for round_ in range(FLAGS.rounds):  # each round in another order: no variant always first
        for name in names[round_ % len(names):] + names[:round_ % len(names)]:
            seconds[name] += variants[name]()
    if distributed.is_chief():
        base = statistics.median(seconds["Keras fit"])
        steps = FLAGS.steps - 1
        print(f"machine: {machine_description()}; {distributed.size()} ranks; other processes' "
              f"CPU during the rounds: {others.seconds():.1f} s (both ranks included)")
        print(f"lscpu flags: {cpu_flags()}")
        print(f"global batch {FLAGS.batch_size:,}, {FLAGS.rounds} rounds of "
              f"{FLAGS.steps - 1} timed steps per variant\n")
        print("| variant | median step (ms) | ratio to Keras fit | per-round ratios |\n"
              "|---|---|---|---|")
        for name, values in seconds.items():
            median = statistics.median(values)
            per_round = [statistics.median(values[i:i + steps]) /
                         statistics.median(seconds["Keras fit"][i:i + steps])
                         for i in range(0, len(values), steps)]
            print(f"| {name} | {median * 1000:.1f} | {median / base:.3f} | "
                  f"{min(per_round):.3f}-{max(per_round):.3f} |")


if __name__ == "__main__":
    app.run(main)
