"""Tables at fewer bytes a row: Adam with float32 rows (the launcher's default on the built-in
data), row-wise Adagrad with float32 and with bfloat16 rows, and Adam with bfloat16 rows, on
DeepFM and the built-in synthetic data:

    python -m benchmarks.table_memory [--embedding_dim=16] [--batch_sizes=8192,32768]
        [--seeds=0,1] [--auc_rows=1000000] [--rowwise_rates=0.01,0.03,0.1] [--timed_steps=20]
        [--parts=rate_sweep,step,auc]
    python -m benchmarks.table_memory --report     # the markdown tables of --out

Each setting is built as `python -m launch.train --optimizer=... --table_dtype=...` builds it
(--scaling_rule=sqrt for every setting, the built-in data's rule; row-wise Adagrad's tables take
--embedding_learning_rate from a sweep of --rowwise_rates at the first batch size and seed, or
--rowwise_rate).
Measured:

- bytes a row of the deep table: its row and its per-row optimizer state, counted from the
  variables (built, not trained);
- step time: all four built in one process, --timed_steps steps of each in turn (the order
  rotates every step, so machine load hits all alike), median and ratio to the default's, at
  each batch size;
- test AUC: the launcher itself (a child process per run) for one epoch of --auc_rows rows at
  each batch size and seed.

Writes benchmarks/results/table_memory.jsonl (one line per measurement, with the machine);
--report prints its tables as docs/results/table_memory.md shows them."""

import json
import os
import re
import statistics
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags  # noqa: E402

from launch import train  # noqa: E402,F401  (defines every launcher flag)

FLAGS = flags.FLAGS
SETTINGS = (("adam", "float32"), ("rowwise_adagrad", "float32"),
            ("rowwise_adagrad", "bfloat16"), ("adam", "bfloat16"))
flags.DEFINE_list("batch_sizes", ["8192", "32768"], "Batch sizes measured.")
flags.DEFINE_list("seeds", ["0", "1"], "Seeds of the AUC runs.")
flags.DEFINE_integer("auc_rows", 1_000_000, "Training rows of each AUC run.")
flags.DEFINE_list("rowwise_rates", ["0.01", "0.03", "0.1"],
                  "Row-wise Adagrad's table learning rates swept first.")
flags.DEFINE_integer("timed_steps", 20, "Timed steps of each setting at each batch size.")
flags.DEFINE_string("out", "benchmarks/results/table_memory.jsonl", "Raw results.")
flags.DEFINE_bool("report", False, "Only print the markdown tables of --out.")
flags.DEFINE_float("rowwise_rate", None,
                   "Row-wise Adagrad's rate for the step and AUC parts (default: the best swept).")
flags.DEFINE_list("parts", ["rate_sweep", "step", "auc"],
                  "What to measure; the results file keeps the records of the other parts (and "
                  "the rates swept before: the best of all is row-wise Adagrad's rate).")
FLAGS.set_default("embedding_dim", 16)
EPOCH_LINE = re.compile(r"epoch 1/1: test AUC ([\d.]+)")


def _flags(optimizer, dtype, rate):
    flags_ = [f"--optimizer={optimizer}", f"--table_dtype={dtype}", "--scaling_rule=sqrt"]
    return flags_ + ([f"--embedding_learning_rate={rate}"] if optimizer != "adam" else [])


def _built(optimizer, dtype, rate, schema, steps_per_epoch):
    """The model launch.train builds for the setting, compiled."""
    import keras

    from launch import common_flags, optimization_flags

    FLAGS.optimizer, FLAGS.table_dtype, FLAGS.scaling_rule = optimizer, dtype, "sqrt"
    FLAGS.embedding_learning_rate = float(rate) if optimizer != "adam" else None
    settings = optimization_flags.resolve_settings()
    keras.utils.set_random_seed(0)
    model = common_flags.build_model(schema, settings, optimizer)
    model.compile(optimizer=optimization_flags.build_optimizer(settings, steps_per_epoch),
                  loss=keras.losses.BinaryCrossentropy(), auto_scale_loss=False)
    return model


def row_bytes(model):
    """Bytes a row of the deep table: the row and its per-row optimizer state."""
    import numpy as np
    import tensorflow as tf

    from tfscale.embedding.table_names import is_deep_table
    from tfscale.optimizers.table_state import per_row_state

    model.optimizer.build(model.trainable_variables)
    table = next(v for v in model.trainable_variables if is_deep_table(v))
    return sum(int(np.prod(v.shape[1:])) * tf.as_dtype(v.dtype).size
               for v in [table, *per_row_state(model.optimizer, table)])


def step_times(source, batch_size, rate):
    """{setting: median seconds a step}, {setting: bytes a row}, other processes' CPU s."""
    from benchmarks.timing import OtherProcessesCPU

    batches = list(source.train_batches(batch_size).take(4))
    steps_per_epoch = source.train_steps_per_epoch(batch_size, 1)
    FLAGS.batch_size = batch_size
    built = {setting: _built(*setting, rate, source.schema, steps_per_epoch)
             for setting in SETTINGS}
    for model in built.values():
        for i in range(3):
            model.train_on_batch(*batches[i % len(batches)])
    seconds = {setting: [] for setting in SETTINGS}
    others = OtherProcessesCPU()
    for i in range(FLAGS.timed_steps):
        turn = i % len(SETTINGS)
        for setting in SETTINGS[turn:] + SETTINGS[:turn]:
            x, y = batches[i % len(batches)]
            started = time.perf_counter()
            built[setting].train_on_batch(x, y)
            seconds[setting].append(time.perf_counter() - started)
    return ({s: statistics.median(v) for s, v in seconds.items()},
            {s: row_bytes(m) for s, m in built.items()}, others.seconds())


def auc_run(optimizer, dtype, rate, batch_size, seed):
    """The launcher's test AUC after one epoch, and its seconds."""
    command = [sys.executable, "-m", "launch.train", *_flags(optimizer, dtype, rate),
               f"--train_rows={FLAGS.auc_rows}", f"--batch_size={batch_size}",
               f"--embedding_dim={FLAGS.embedding_dim}", f"--seed={seed}", "--logdir=none",
               "--checkpoint_dir=none"]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    if done.returncode:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    return float(EPOCH_LINE.search(done.stdout).group(1)), time.perf_counter() - started


def report(path):
    """The markdown tables of the results file `path`."""
    records = [json.loads(line) for line in open(path, encoding="utf-8")]
    names = {setting: f"{setting[0]}, {setting[1]}" for setting in SETTINGS}
    sweep = sorted((r for r in records if r["kind"] == "rate_sweep"), key=lambda r: r["rate"])
    lines = [f"Machine: {records[0]['machine']}; CPU flags: {records[0]['cpu_flags']}.", "",
             "Row-wise Adagrad's table learning rate, swept at batch "
             f"{sweep[0]['batch_size']:,} (seed {sweep[0]['seed']}), test AUC after one epoch:",
             "", "| rate | test AUC |", "|---:|---:|"]
    lines += [f"| {r['rate']:g}{' (used below)' if r['chosen'] else ''} | {r['test_auc']:.4f} |"
              for r in sweep]
    steps = [r for r in records if r["kind"] == "step"]
    lines += ["", f"Bytes a row of the deep table (width {steps[0]['width']}: the row and its "
              "per-row optimizer state) and the median step of "
              f"{steps[0]['timed_steps']} alternating steps:", "",
              "| optimizer, table dtype | bytes a row | / default | batch | step (ms) | "
              "/ default |", "|---|---:|---:|---:|---:|---:|"]
    default_bytes = {r["batch_size"]: r["row_bytes"] for r in steps
                     if (r["optimizer"], r["table_dtype"]) == SETTINGS[0]}
    lines += [f"| {r['optimizer']}, {r['table_dtype']} | {r['row_bytes']} | "
              f"{r['row_bytes'] / default_bytes[r['batch_size']]:.3f}x | {r['batch_size']:,} | "
              f"{r['median_step_ms']:.0f} | {r['step_ratio']:.2f}x |" for r in steps]
    aucs = [r for r in records if r["kind"] == "auc"]
    seeds = sorted({r["seed"] for r in aucs})
    lines += ["", f"Test AUC after one epoch of {aucs[0]['train_rows']:,} rows (the launcher, "
              "a process per run), by seed, and the difference of the seeds' mean to the "
              "default's:", "",
              "| optimizer, table dtype | batch | " + " | ".join(f"seed {s}" for s in seeds)
              + " | mean | - default |", "|---|---:|" + "---:|" * (len(seeds) + 2)]
    for batch_size in sorted({r["batch_size"] for r in aucs}):
        means = {}
        for setting in SETTINGS:
            got = {r["seed"]: r["test_auc"] for r in aucs if r["batch_size"] == batch_size
                   and (r["optimizer"], r["table_dtype"]) == setting}
            means[setting] = mean = statistics.mean(got.values())
            lines.append(f"| {names[setting]} | {batch_size:,} | "
                         + " | ".join(f"{got[s]:.4f}" for s in seeds)
                         + f" | {mean:.4f} | {mean - means[SETTINGS[0]]:+.4f} |")
    return "\n".join(lines)


def main(argv):
    del argv
    if FLAGS.report:
        print(report(FLAGS.out))
        return
    from benchmarks.timing import cpu_flags, machine_description
    from launch import common_flags

    machine = {"machine": machine_description(), "cpu_flags": cpu_flags(),
               "load": os.getloadavg()}
    kept = []  # the results file's records of the parts not run now
    if os.path.exists(FLAGS.out):
        with open(FLAGS.out, encoding="utf-8") as results:
            kept = [json.loads(line) for line in results]
    kept = [r for r in kept if r["kind"] not in FLAGS.parts or r["kind"] == "rate_sweep"]
    records = []

    def record(**fields):
        records.append({**fields, **machine})
        print(json.dumps(records[-1]), flush=True)

    batch_sizes = [int(b) for b in FLAGS.batch_sizes]
    seeds = [int(s) for s in FLAGS.seeds]
    if "rate_sweep" in FLAGS.parts:  # added to the rates swept before
        for rate in FLAGS.rowwise_rates:
            kept = [r for r in kept if not (r["kind"] == "rate_sweep" and r["rate"] == float(rate))]
            record(kind="rate_sweep", rate=float(rate), batch_size=batch_sizes[0], seed=seeds[0],
                   test_auc=auc_run("rowwise_adagrad", "float32", rate, batch_sizes[0],
                                    seeds[0])[0])
    swept = [r for r in kept + records if r["kind"] == "rate_sweep"]
    rate = FLAGS.rowwise_rate or max(swept, key=lambda r: r["test_auc"])["rate"]
    for r in swept:
        r["chosen"] = r["rate"] == rate
    FLAGS.train_rows = FLAGS.auc_rows
    source = common_flags.build_source(None)
    for batch_size in batch_sizes if "step" in FLAGS.parts else []:
        medians, bytes_a_row, others = step_times(source, batch_size, rate)
        for setting in SETTINGS:
            record(kind="step", optimizer=setting[0], table_dtype=setting[1],
                   batch_size=batch_size, median_step_ms=medians[setting] * 1e3,
                   step_ratio=medians[setting] / medians[SETTINGS[0]],
                   row_bytes=bytes_a_row[setting], width=FLAGS.embedding_dim,
                   timed_steps=FLAGS.timed_steps, other_processes_cpu_s=others)
    for batch_size in batch_sizes if "auc" in FLAGS.parts else []:
        for seed in seeds:
            for setting in SETTINGS:
                auc, seconds = auc_run(*setting, rate, batch_size, seed)
                record(kind="auc", optimizer=setting[0], table_dtype=setting[1],
                       embedding_learning_rate=rate if setting[0] != "adam" else None,
                       batch_size=batch_size, seed=seed, train_rows=FLAGS.auc_rows,
                       test_auc=auc, seconds=seconds)
    with open(FLAGS.out, "w", encoding="utf-8") as out:
        out.writelines(json.dumps(r) + "\n" for r in kept + records)


if __name__ == "__main__":
    app.run(main)
