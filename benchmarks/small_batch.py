"""Training speed at small and large batch: tfscale's DeepFM under each of its embedding update
paths against the PyTorch DeepFM (benchmarks.torch_deepfm: sparse tables, SparseAdam + Adam) and
a plain Keras 3 DeepFM (benchmarks.plain_keras_deepfm), on identical batches.

    python -m benchmarks.small_batch [--batch_sizes=1024,8192,65536] [--rounds=2]
        [--before=/path/to/an/earlier/checkout --before_modes=row_sparse_adam,...]

The batches (the synthetic data's, 1,802,049 ids at the default vocabulary scale) are written
once to a file; every (mode, batch size) then runs in a fresh process of its own, in an order
that alternates from round to round, and reports examples/s over `--steps` timed steps after
`--warmup_steps`. The table shows every round's figure and the ratio of the medians to PyTorch.
With --before, the --before_modes also run from another checkout (MODE@before), so a change is
measured against the code before it in the same run.

Modes:
  torch             the PyTorch DeepFM (one step: zero_grad, forward, backward, two optimizers)
  adam              tfscale, FusedAdam: every row of both tables and their moments every step
  row_sparse_adam   tfscale, RowSparseAdam: only the batch's rows and their moments
  launcher_default  tfscale, the launcher's default on the built-in data: FusedAdam for the dense
                    weights, RowSparseAdam with L2 on the batch's rows for the tables
  cowclip_scalable  tfscale, CowClip scalable (RowSparseAdam tables) with clipping on (r = 1)
  cowclip_faithful  tfscale, CowClip faithful (the official dense update of every row)
  plain_keras       plain Keras 3, one Embedding per field and kind, Adam
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
from absl import app, flags

FLAGS = flags.FLAGS
MODES = ("torch", "adam", "row_sparse_adam", "launcher_default", "cowclip_scalable",
         "cowclip_faithful", "plain_keras")
flags.DEFINE_list("batch_sizes", ["1024", "8192", "65536"], "Batch sizes to measure.")
flags.DEFINE_list("modes", list(MODES), f"Modes to measure, of {', '.join(MODES)}.")
flags.DEFINE_integer("rounds", 2, "Measurements per mode and batch size, in alternating order.")
flags.DEFINE_integer("steps", 0, "Timed steps (0: 2^21 examples' worth, 8 to 200 steps).")
flags.DEFINE_integer("warmup_steps", 5, "Untimed steps first (tracing, allocation).")
flags.DEFINE_float("vocabulary_scale", 1 / 20, "Synthetic vocabulary scale (default: the "
                   "launcher's, 1,802,049 ids).")
flags.DEFINE_string("before", None, "Another checkout of tfscale (e.g. a git worktree of an "
                    "earlier commit): each tfscale mode of --before_modes is also run from there, "
                    "as MODE@before, on the same batches.")
flags.DEFINE_list("before_modes", [], "Modes to run from --before too.")
flags.DEFINE_string("worker", None, "Internal: run one mode on --batch_file and print JSON.")
flags.DEFINE_string("batch_file", None, "Internal: the batches' .npz file.")


def _steps(batch_size):
    return FLAGS.steps or int(np.clip(2**21 // batch_size, 8, 200))


def write_batches(path, batch_size, num_batches):
    """The synthetic data's first `num_batches` training batches, with its schema."""
    from tfscale.data.synthetic import SyntheticCTR

    source = SyntheticCTR(seed=0, train_rows=batch_size * num_batches, test_rows=batch_size,
                          vocabulary_scale=FLAGS.vocabulary_scale)
    dense, categorical, labels = [], [], []
    for x, y in source.train_batches(batch_size).take(num_batches):
        dense.append(x["dense"].numpy())
        categorical.append(x["categorical"].numpy())
        labels.append(y.numpy())
    np.savez(path, dense=np.stack(dense), categorical=np.stack(categorical),
             labels=np.stack(labels))


def _schema():
    from tfscale.data.synthetic import SyntheticCTR

    return SyntheticCTR(seed=0, train_rows=1, test_rows=1,
                        vocabulary_scale=FLAGS.vocabulary_scale).schema


def run_torch(batches, steps, warmup):
    import torch

    from benchmarks.torch_deepfm import TorchDeepFM, trainer

    torch.manual_seed(0)
    schema = _schema()
    model = TorchDeepFM(schema.vocabulary_sizes, schema.num_dense)
    step = trainer(model)
    data = [(torch.from_numpy(d), torch.from_numpy(c), torch.from_numpy(y[:, 0]))
            for d, c, y in zip(batches["dense"], batches["categorical"], batches["labels"])]
    for i in range(warmup):
        step(*data[i % len(data)])
    started = time.perf_counter()
    for i in range(steps):
        loss = step(*data[(warmup + i) % len(data)])
    float(loss)
    return time.perf_counter() - started


def _tfscale_optimizer(mode):
    from tfscale.optimizers import (CowClip, FusedAdam, RowSparseAdam, factory,
                                    large_batch_settings)

    if mode == "adam":
        return FusedAdam(1e-3)
    if mode == "row_sparse_adam":
        return RowSparseAdam(1e-3)
    if mode == "launcher_default":
        return factory.build_optimizer(large_batch_settings(1024, "sqrt", "synthetic"), "adam",
                                       warmup_steps=1000)
    return CowClip(None, FusedAdam(1e-3, name="dense"), r=1.0, zeta=1e-5, l2=1e-5,
                   mode=mode.removeprefix("cowclip_"))


def build_compiled(mode):
    """The DeepFM of `mode` (a Keras mode of MODES), compiled, seeded with 0."""
    import keras

    import models
    from benchmarks.plain_keras_deepfm import plain_keras_deepfm

    keras.utils.set_random_seed(0)
    schema = _schema()
    if mode == "plain_keras":
        model = plain_keras_deepfm(schema)
        model.compile(keras.optimizers.Adam(1e-3), keras.losses.BinaryCrossentropy())
    else:
        model = models.build_model("deepfm", schema)
        model.compile(_tfscale_optimizer(mode), keras.losses.BinaryCrossentropy())
    return model


def run_keras(mode, batches, steps, warmup):
    import tensorflow as tf

    from benchmarks.timing import StepTimer

    model = build_compiled(mode)
    dataset = tf.data.Dataset.from_tensor_slices(
        ({"dense": batches["dense"], "categorical": batches["categorical"]},
         batches["labels"])).repeat().take(warmup + steps)
    timer = StepTimer()
    model.fit(dataset, callbacks=[timer], verbose=0)
    return timer.times[warmup + steps - 1] - timer.times[warmup - 1]


def worker(mode, batch_file):
    with np.load(batch_file) as stored:
        batches = {name: stored[name] for name in stored.files}
    batch_size = batches["labels"].shape[1]
    steps, warmup = _steps(batch_size), FLAGS.warmup_steps
    if mode == "torch":
        seconds = run_torch(batches, steps, warmup)
    else:
        seconds = run_keras(mode, batches, steps, warmup)
    print(json.dumps({"mode": mode, "batch_size": batch_size,
                      "examples_per_second": batch_size * steps / seconds}), flush=True)


def measure(mode, batch_file):
    """Examples/s of `mode` (MODE@before: from the --before checkout) in a fresh process."""
    mode, _, where = mode.partition("@")
    checkout = FLAGS.before if where else os.getcwd()
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=checkout)
    done = subprocess.run([sys.executable, "-m", "benchmarks.small_batch", f"--worker={mode}",
                           f"--batch_file={batch_file}", f"--warmup_steps={FLAGS.warmup_steps}",
                           f"--steps={FLAGS.steps}", f"--vocabulary_scale={FLAGS.vocabulary_scale}"],
                          capture_output=True, text=True, env=env, cwd=checkout, check=False)
    if done.returncode:
        raise RuntimeError(f"{mode} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])["examples_per_second"]


def main(argv):
    del argv
    if FLAGS.worker:
        return worker(FLAGS.worker, FLAGS.batch_file)
    from benchmarks.timing import machine_description

    unknown = set(FLAGS.modes + FLAGS.before_modes) - set(MODES)
    if unknown:
        raise app.UsageError(f"--modes, --before_modes: unknown {sorted(unknown)}; give some of "
                             f"{MODES}")
    if bool(FLAGS.before) != bool(FLAGS.before_modes):
        raise app.UsageError("--before and --before_modes go together")
    modes = FLAGS.modes + [f"{mode}@before" for mode in FLAGS.before_modes]
    print(f"machine: {machine_description()}")
    print("examples/s per round (processes alternate), and the ratio of medians to torch")
    header = " | ".join(modes)
    print(f"| batch | {header} |\n|---|{'---|' * len(modes)}")
    with tempfile.TemporaryDirectory() as directory:
        for batch_size in (int(b) for b in FLAGS.batch_sizes):
            batch_file = os.path.join(directory, f"batches-{batch_size}.npz")
            num_batches = min(FLAGS.warmup_steps + _steps(batch_size), max(4, 2**20 // batch_size))
            write_batches(batch_file, batch_size, num_batches)
            rates = {mode: [] for mode in modes}
            for round_index in range(FLAGS.rounds):
                order = modes if round_index % 2 == 0 else modes[::-1]
                for mode in order:
                    rates[mode].append(measure(mode, batch_file))
            cells = []
            for mode in modes:
                figures = " / ".join(f"{rate:,.0f}" for rate in rates[mode])
                ratio = ""
                if "torch" in rates and mode != "torch":
                    ratio = (f" ({statistics.median(rates[mode]) / statistics.median(rates['torch']):.2f}x)")
                cells.append(figures + ratio)
            print(f"| {batch_size:,} | {' | '.join(cells)} |", flush=True)


if __name__ == "__main__":
    app.run(main)
