"""CAME on DeepFM's embedding tables: Adam by row (the launcher's default), CAME by row
(RowSparseCAME) and CAME on every row (`--embedding_update=dense`), in one process on the
built-in synthetic data:

    python -m benchmarks.came_deepfm [--batch_size=8192] [--timed_steps=40]
        [--widths=10,16,32,64] [--auc_rows=1000000 --auc_epochs=2] [--out=FILE.md]

Each setting's model and optimizer are built as `python -m launch.train --optimizer=NAME
--embedding_update=UPDATE` builds them (launch.common_flags.build_model,
launch.optimization_flags.build_optimizer: no scaling rule, each optimizer's default rate, no
L2), same seed. Measured:

- step time: --warmup_steps untimed steps each, then --timed_steps steps of every setting in
  turn (the order rotates every step, so machine load hits all alike) on the same --batch_size
  batches; the median per setting and its ratio to Adam's, with the CPU time other processes
  took meanwhile;
- optimizer-state bytes (every optimizer variable, and the tables' share), as a ratio to
  Adam's, at each embedding width of --widths (built, not trained);
- with --auc_rows > 0: the launcher itself (`launch.train`, a child process per optimizer, its
  defaults otherwise) for --auc_epochs epochs on that many rows, test AUC after each epoch.

Prints markdown and writes it, with the machine (`lscpu` model and vector flags, cores), to
--out."""

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
SETTINGS = (("adam", "row"), ("came", "row"), ("came", "dense"))
flags.DEFINE_integer("timed_steps", 40, "Timed steps of each setting.")
flags.DEFINE_integer("warmup_steps_untimed", 3, "Untimed steps of each setting first.")
flags.DEFINE_list("widths", ["10", "16", "32", "64"], "Embedding widths whose state is counted.")
flags.DEFINE_integer("auc_rows", 0, "Training rows of the launcher's AUC runs (0: none).")
flags.DEFINE_integer("auc_epochs", 2, "Epochs of the launcher's AUC runs.")
flags.DEFINE_string("out", "benchmarks/results/came_deepfm.md", "Markdown output.")
FLAGS.set_default("batch_size", 8192)
EPOCH_LINE = re.compile(r"epoch (\d+)/\d+: test AUC ([\d.]+)")


def _name(optimizer, update):
    return f"{optimizer} ({update})"


def _built(optimizer_name, update, schema, steps_per_epoch):
    """The model and optimizer launch.train builds for `optimizer_name` and `update`."""
    import keras

    from launch import common_flags, optimization_flags

    FLAGS.optimizer, FLAGS.embedding_update = optimizer_name, update
    settings = optimization_flags.resolve_settings()
    keras.utils.set_random_seed(FLAGS.seed)
    model = common_flags.build_model(schema, settings, optimizer_name)
    model.compile(optimizer=optimization_flags.build_optimizer(settings, steps_per_epoch),
                  loss=keras.losses.BinaryCrossentropy(), auto_scale_loss=False)
    return model


def _state_bytes(model):
    """(every optimizer variable's bytes, the embedding tables' state's bytes)."""
    import numpy as np
    import tensorflow as tf

    from tfscale.embedding.strategies import is_table
    from tfscale.optimizers.memory import optimizer_state_bytes
    from tfscale.optimizers.table_state import table_state

    total = optimizer_state_bytes(model).total
    tables = [v for v in model.trainable_variables if is_table(v)]
    held = [slot for table in tables for slot in (lambda s: s.per_row + s.whole)(
        table_state(model.optimizer, table))]
    return total, sum(int(np.prod(v.shape)) * tf.as_dtype(v.dtype).size for v in held)


def step_times(source):
    """{setting: [seconds per step]}, {setting: _state_bytes} and the other processes' CPU
    seconds while timing."""
    from benchmarks.timing import OtherProcessesCPU

    batches = list(source.train_batches(FLAGS.batch_size).take(4))
    steps_per_epoch = source.train_steps_per_epoch(FLAGS.batch_size, 1)
    built = {}
    for optimizer, update in SETTINGS:
        model = _built(optimizer, update, source.schema, steps_per_epoch)
        for i in range(FLAGS.warmup_steps_untimed):
            model.train_on_batch(*batches[i % len(batches)])
        built[(optimizer, update)] = model
    seconds = {setting: [] for setting in SETTINGS}
    others = OtherProcessesCPU()
    for i in range(FLAGS.timed_steps):
        order = SETTINGS[i % 3:] + SETTINGS[:i % 3]
        for setting in order:
            x, y = batches[i % len(batches)]
            started = time.perf_counter()
            built[setting].train_on_batch(x, y)
            seconds[setting].append(time.perf_counter() - started)
    states = {setting: _state_bytes(model) for setting, model in built.items()}
    return seconds, states, others.seconds()


def width_states(schema, steps_per_epoch):
    """{width: {setting: (total bytes, tables' bytes)}}, optimizers built, nothing trained."""
    import keras

    default_width = FLAGS.embedding_dim
    result = {}
    for width in map(int, FLAGS.widths):
        FLAGS.embedding_dim = width
        result[width] = {}
        for setting in SETTINGS:
            model = _built(*setting, schema, steps_per_epoch)
            model.optimizer.build(model.trainable_variables)
            result[width][setting] = _state_bytes(model)
            del model
            keras.backend.clear_session()
    FLAGS.embedding_dim = default_width
    return result


def auc_run(optimizer):
    """Test AUC after each epoch of the launcher with `--optimizer=optimizer`, and its seconds."""
    command = [sys.executable, "-m", "launch.train", f"--optimizer={optimizer}",
               f"--train_rows={FLAGS.auc_rows}", f"--epochs={FLAGS.auc_epochs}",
               f"--batch_size={FLAGS.batch_size}", "--logdir=none", "--checkpoint_dir=none"]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    if done.returncode:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    aucs = [float(m.group(2)) for m in EPOCH_LINE.finditer(done.stdout)]
    return aucs, time.perf_counter() - started, " ".join(command[1:])


def main(argv):
    del argv
    from benchmarks.timing import cpu_flags, machine_description
    from launch import common_flags

    source = common_flags.build_source(None)
    lines = [f"Machine: {machine_description()}; CPU flags: {cpu_flags()}.", ""]
    seconds, states, others = step_times(source)
    median = {s: statistics.median(v) * 1e3 for s, v in seconds.items()}
    adam = SETTINGS[0]
    lines += [f"DeepFM (embedding {FLAGS.embedding_dim}, DNN {','.join(FLAGS.dnn_units)}), "
              f"batch {FLAGS.batch_size:,}, {source.schema.num_categorical} fields; "
              f"{FLAGS.timed_steps} timed steps per setting after {FLAGS.warmup_steps_untimed} "
              f"untimed, rotating; other processes took {others:.0f} CPU s while timing "
              "(the machine was shared with other work).", "",
              "| setting | median step (ms) | / Adam | optimizer state (bytes) | / Adam | "
              "tables' state (bytes) | / Adam |", "|---|---:|---:|---:|---:|---:|---:|"]
    for setting in SETTINGS:
        total, tables = states[setting]
        lines.append(f"| {_name(*setting)} | {median[setting]:.0f} | "
                     f"{median[setting] / median[adam]:.2f}x | {total:,} | "
                     f"{total / states[adam][0]:.3f}x | {tables:,} | "
                     f"{tables / states[adam][1]:.3f}x |")
    print("\n".join(lines), flush=True)
    widths = width_states(source.schema, source.train_steps_per_epoch(FLAGS.batch_size, 1))
    lines += ["", "Optimizer state by embedding width (built, not trained), as a ratio to "
              "Adam by row's: every optimizer variable / the tables' state only.", "",
              "| width | Adam (row) bytes | CAME (row) | CAME (dense) |", "|---:|---:|---:|---:|"]
    for width, by_setting in widths.items():
        adam_total, adam_tables = by_setting[adam]
        cells = [f"{t / adam_total:.3f}x / {b / adam_tables:.3f}x"
                 for t, b in (by_setting[s] for s in SETTINGS[1:])]
        lines.append(f"| {width} | {adam_total:,} | {' | '.join(cells)} |")
    print("\n".join(lines[-len(widths) - 4:]), flush=True)
    if FLAGS.auc_rows:
        lines += ["", f"The launcher, {FLAGS.auc_rows:,} rows, {FLAGS.auc_epochs} epochs, batch "
                  f"{FLAGS.batch_size:,}, each optimizer's default rate, one seed, one after "
                  "the other:", "", "| command | test AUC by epoch | seconds |", "|---|---|---:|"]
        for optimizer in ("adam", "came"):
            aucs, run_seconds, command = auc_run(optimizer)
            lines.append(f"| `{command}` | {', '.join(f'{a:.4f}' for a in aucs)} | "
                         f"{run_seconds:.0f} |")
            print(lines[-1], flush=True)
    with open(FLAGS.out, "w", encoding="utf-8") as out:
        out.write("# CAME on DeepFM's tables: `python -m benchmarks.came_deepfm`\n\n"
                  + "\n".join(lines) + "\n")


if __name__ == "__main__":
    app.run(main)
