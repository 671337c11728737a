"""CAME against Adam and Keras's Adafactor, side by side in one process:

- optimizer-state bytes on a small decoder-only transformer (models.transformer), against the
  factored minimum (tfscale.optimizers.memory);
- validation loss of that transformer trained as a byte-level language model on the Python
  standard library's own .py files (present offline wherever Python is), with the same steps,
  batches, initial weights and warmup+cosine schedule shape for every optimizer (each its own
  peak learning rate); a PNG of the validation curves;
- median step time, as a ratio to Adam's (the runs are interleaved chunk by chunk, so machine
  load hits all optimizers alike);
- DeepFM test AUC with CAME and with Adam (tfscale's FusedAdam) on the synthetic CTR data.

    python -m benchmarks.came [--steps=600] [--optimizers=adam:1e-3,adafactor:3e-2,came:1e-4]

Prints markdown tables and writes them, with the machine, to --results_dir/came.md, and the
curves to --results_dir/came_curves.png. Give several `name:rate` entries of one optimizer to
compare learning rates; the summary then takes each optimizer's best final validation loss.

Corpus: files under sysconfig's stdlib directory (site-packages excluded), sorted by relative
path; every 10th file (index % 10 == 9) is validation. Training windows of sequence_length + 1
bytes start at offsets drawn from --seed; validation windows are evenly spaced and fixed."""

import os
import pathlib
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

import models  # noqa: E402
from benchmarks.byte_corpus import stdlib_corpus, validation_windows, windows  # noqa: E402
from benchmarks.timing import StepDurations, machine_description  # noqa: E402
from models.transformer import TransformerLM  # noqa: E402
from tfscale.data.synthetic import SyntheticCTR  # noqa: E402
from tfscale.optimizers.came import CAME  # noqa: E402
from tfscale.optimizers.fused_adam import FusedAdam  # noqa: E402
from tfscale.optimizers.memory import factored_minimum_bytes, optimizer_state_bytes  # noqa: E402
from tfscale.training.run import TrainingConfig, train  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_list("optimizers", ["adam:1e-3", "adafactor:3e-2", "came:1e-4", "came:2e-4"],
                  "Language model runs as optimizer:peak_learning_rate (adam, adafactor, came); "
                  "empty: skip. Keras's Adafactor scales its rate by each weight's RMS.")
flags.DEFINE_integer("steps", 600, "Training steps per language-model run.")
flags.DEFINE_integer("batch_size", 16, "Sequences per language-model batch.")
flags.DEFINE_integer("warmup_steps", 60, "Linear warmup from 0, then cosine decay to 10%.")
flags.DEFINE_integer("eval_every", 50, "Steps between validation losses.")
flags.DEFINE_integer("validation_windows", 256, "Fixed validation sequences.")
flags.DEFINE_integer("sequence_length", 128, "Tokens (bytes) per sequence.")
flags.DEFINE_integer("width", 256, "Transformer width.")
flags.DEFINE_integer("num_layers", 4, "Transformer blocks.")
flags.DEFINE_integer("num_heads", 4, "Attention heads.")
flags.DEFINE_list("ctr_optimizers", ["adam:3e-3", "came:3e-4"],
                  "DeepFM runs as optimizer:peak_learning_rate (adam, came); empty: skip.")
flags.DEFINE_integer("ctr_train_rows", 300_000, "Synthetic CTR training rows (one epoch).")
flags.DEFINE_integer("ctr_test_rows", 100_000, "Synthetic CTR test rows.")
flags.DEFINE_integer("ctr_batch_size", 2048, "DeepFM batch size.")
flags.DEFINE_float("ctr_vocabulary_scale", 1 / 20, "Synthetic CTR vocabulary scale.")
flags.DEFINE_integer("ctr_warmup_steps", 15, "DeepFM warmup steps (then cosine decay to 10%).")
flags.DEFINE_integer("seed", 0, "Seed of the initial weights and of the training batches.")
flags.DEFINE_string("results_dir", "benchmarks/results", "Where came.md and the PNG go.")

OPTIMIZERS = {"adam": FusedAdam, "adafactor": keras.optimizers.Adafactor, "came": CAME}


def parse_runs(entries):
    """[(optimizer name, peak learning rate)] from "name:rate" flag entries."""
    runs = []
    for entry in entries:
        name, _, rate = entry.partition(":")
        if name not in OPTIMIZERS:
            raise app.UsageError(f"unknown optimizer {name!r} in {entry!r}")
        runs.append((name, float(rate)))
    return runs


def make_optimizer(name, peak, steps, warmup_steps):
    schedule = keras.optimizers.schedules.CosineDecay(
        0.0, max(steps - warmup_steps, 1), alpha=0.1, warmup_target=peak,
        warmup_steps=warmup_steps)
    return OPTIMIZERS[name](learning_rate=schedule)


class LanguageModelRun:
    """One optimizer training one transformer; `train` advances it by a chunk of batches."""

    def __init__(self, name, peak):
        self.name, self.peak = name, peak
        keras.utils.set_random_seed(FLAGS.seed)  # the same initial weights for every run
        self.model = TransformerLM(sequence_length=FLAGS.sequence_length, width=FLAGS.width,
                                   num_layers=FLAGS.num_layers, num_heads=FLAGS.num_heads)
        self.model.compile(make_optimizer(name, peak, FLAGS.steps, FLAGS.warmup_steps),
                           keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        self.curve = []
        self.timer = StepDurations()
        self.timed_steps = []

    @property
    def label(self):
        return f"{self.name} (lr {self.peak:g})"

    def train(self, batches, first_chunk):
        self.timer.seconds = []
        self.model.fit(batches[:, :-1], batches[:, 1:], batch_size=FLAGS.batch_size,
                       shuffle=False, verbose=0, callbacks=[self.timer])
        if not first_chunk:  # the first chunk includes tracing
            self.timed_steps.extend(self.timer.seconds)

    def validate(self, validation):
        step = int(self.model.optimizer.iterations)
        loss = self.model.evaluate(validation[:, :-1], validation[:, 1:], batch_size=64,
                                   verbose=0)
        self.curve.append((step, float(loss)))

    @property
    def final_loss(self):
        return self.curve[-1][1]

    @property
    def step_seconds(self):
        return statistics.median(self.timed_steps)


def language_model_benchmark(report):
    train, validation_bytes, description = stdlib_corpus()
    report(f"Corpus: {description}.\n")
    length = FLAGS.sequence_length
    rng = np.random.default_rng(FLAGS.seed)
    batches = windows(train, rng.integers(0, train.size - length - 1,
                                          FLAGS.steps * FLAGS.batch_size), length)
    validation = validation_windows(validation_bytes, FLAGS.validation_windows, length)
    runs = [LanguageModelRun(name, peak) for name, peak in parse_runs(FLAGS.optimizers)]
    for run in runs:
        run.validate(validation)
    chunk = FLAGS.eval_every * FLAGS.batch_size
    for first in range(0, len(batches), chunk):
        for run in runs:  # interleaved: load on the shared machine hits every run alike
            run.train(batches[first:first + chunk], first_chunk=first == 0)
            run.validate(validation)
        print(f"step {runs[0].curve[-1][0]}: " + ", ".join(
            f"{run.label} {run.final_loss:.4f}" for run in runs), flush=True)
    return runs


def memory_table(runs, report):
    if not runs:
        return {}, None
    model = runs[0].model
    parameters = sum(int(np.prod(v.shape)) for v in model.trainable_variables)
    minimum = factored_minimum_bytes(model)
    adam_bytes = next((optimizer_state_bytes(r.model).total for r in runs if r.name == "adam"),
                      None)
    report(f"Transformer: {FLAGS.num_layers} layers, width {FLAGS.width}, {FLAGS.num_heads} "
           f"heads, sequence {FLAGS.sequence_length}, vocabulary 256 (bytes), tied embeddings: "
           f"{parameters:,} parameters ({4 * parameters:,} bytes in float32).\n")
    report("| optimizer | state bytes | / Adam | / factored minimum |")
    report("|---|---:|---:|---:|")
    state = {}
    for run in _first_of_each_optimizer(runs):
        state[run.name] = optimizer_state_bytes(run.model).total
        report(f"| {run.name} | {state[run.name]:,} | {_ratio(state[run.name], adam_bytes)} | "
               f"{state[run.name] / minimum:.4f} |")
    report(f"| factored minimum | {minimum:,} | {_ratio(minimum, adam_bytes)} | 1 |\n")
    return state, minimum


def quality_table(runs, report):
    if not runs:
        return
    adam = _best(runs, "adam")
    report(f"Validation loss (nats per byte) after {FLAGS.steps} steps of {FLAGS.batch_size} x "
           f"{FLAGS.sequence_length} bytes, warmup {FLAGS.warmup_steps} then cosine to 10%; "
           "step time = median seconds per training step.\n")
    report("| optimizer | peak lr | final val loss | best val loss | vs Adam's final | "
           "step time (ms) | / Adam |")
    report("|---|---:|---:|---:|---:|---:|---:|")
    for run in runs:
        versus = f"{100 * (run.final_loss / adam.final_loss - 1):+.2f}%" if adam else "-"
        report(f"| {run.name} | {run.peak:g} | {run.final_loss:.4f} | "
               f"{min(loss for _, loss in run.curve):.4f} | {versus} | "
               f"{1000 * run.step_seconds:.0f} | "
               f"{_ratio(run.step_seconds, adam.step_seconds if adam else None)} |")
    report("")


def plot_curves(runs, path):
    figure, axes = plt.subplots(figsize=(7, 4.5))
    for run in runs:
        steps, losses = zip(*run.curve)
        axes.plot(steps, losses, marker=".", label=run.label)
    axes.set_xlabel("training step")
    axes.set_ylabel("validation loss (nats per byte)")
    axes.set_title("Byte-level transformer LM on the Python standard library")
    axes.set_ylim(top=min(4.0, max(loss for run in runs for _, loss in run.curve[1:])))
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def ctr_benchmark(report):
    runs = parse_runs(FLAGS.ctr_optimizers)
    if not runs:
        return {}
    source = SyntheticCTR(seed=FLAGS.seed, train_rows=FLAGS.ctr_train_rows,
                          test_rows=FLAGS.ctr_test_rows,
                          vocabulary_scale=FLAGS.ctr_vocabulary_scale)
    steps = source.train_steps_per_epoch(FLAGS.ctr_batch_size)
    report(f"DeepFM (embedding 10, DNN 400-400-400) on {source.describe()}: one epoch of {steps} "
           f"steps of {FLAGS.ctr_batch_size}, warmup {FLAGS.ctr_warmup_steps} then cosine to "
           "10%; exact test AUC.\n")
    report("| optimizer | peak lr | test AUC | test log loss | state bytes | / Adam | "
           "train seconds |")
    report("|---|---:|---:|---:|---:|---:|---:|")
    results, adam_bytes = {}, None
    for name, peak in runs:
        keras.utils.set_random_seed(FLAGS.seed)
        model = models.build_model("deepfm", source.schema)
        model.compile(make_optimizer(name, peak, steps, FLAGS.ctr_warmup_steps),
                      keras.losses.BinaryCrossentropy())
        state = optimizer_state_bytes(model).total
        adam_bytes = state if name == "adam" and adam_bytes is None else adam_bytes
        final = train(model, source, TrainingConfig(FLAGS.ctr_batch_size, epochs=1,
                                                    log_every_steps=steps)).final
        results[name] = max(results.get(name, 0.0), final["auc"])
        report(f"| {name} | {peak:g} | {final['auc']:.4f} | {final['logloss']:.4f} | "
               f"{state:,} | {_ratio(state, adam_bytes)} | {final['train_seconds']:.0f} |")
    report("")
    return results


def checks_table(runs, state, minimum, ctr_auc, report):
    """CAME against Adam and the factored minimum in this run: memory, quality, step time."""
    adam, came, adafactor = (_best(runs, name) for name in ("adam", "came", "adafactor"))
    if not (adam and came):
        return
    rows = [
        ("CAME state <= 0.55x Adam's", f"{state['came'] / state['adam']:.3f}x",
         state["came"] <= 0.55 * state["adam"]),
        ("CAME state <= 1.1x factored minimum", f"{state['came'] / minimum:.4f}x",
         state["came"] <= 1.1 * minimum),
        ("CAME final val loss <= Adam's + 1%", f"{came.final_loss:.4f} vs {adam.final_loss:.4f}",
         came.final_loss <= 1.01 * adam.final_loss),
        ("CAME step time <= 1.3x Adam's", f"{came.step_seconds / adam.step_seconds:.2f}x",
         came.step_seconds <= 1.3 * adam.step_seconds),
    ]
    if adafactor:
        rows.append(("CAME final val loss < Adafactor's",
                     f"{came.final_loss:.4f} vs {adafactor.final_loss:.4f}",
                     came.final_loss < adafactor.final_loss))
    if "adam" in ctr_auc and "came" in ctr_auc:
        rows.append(("DeepFM AUC, CAME vs Adam (reported only)",
                     f"{ctr_auc['came']:.4f} vs {ctr_auc['adam']:.4f}",
                     ctr_auc["came"] >= ctr_auc["adam"]))
    report("Checks (each optimizer at its best learning rate of this run):\n")
    report("| check | measured | holds |")
    report("|---|---|---|")
    for check, measured, holds in rows:
        report(f"| {check} | {measured} | {'yes' if holds else 'no'} |")
    report("")


def main(argv):
    del argv
    lines = []

    def report(line):
        print(line, flush=True)
        lines.append(line)

    report(f"Machine: {machine_description()}.\n")
    started = time.perf_counter()
    runs = language_model_benchmark(report) if FLAGS.optimizers else []
    state, minimum = memory_table(runs, report)
    quality_table(runs, report)
    ctr_auc = ctr_benchmark(report)
    checks_table(runs, state, minimum, ctr_auc, report)
    report(f"Total time: {(time.perf_counter() - started) / 60:.1f} minutes.")
    results = pathlib.Path(FLAGS.results_dir)
    results.mkdir(parents=True, exist_ok=True)
    if runs:
        plot_curves(runs, results / "came_curves.png")
    (results / "came.md").write_text(
        "# CAME benchmark (`python -m benchmarks.came`)\n\n" + "\n".join(lines) + "\n"
        "\nValidation curves: came_curves.png.\n")


def _first_of_each_optimizer(runs):
    return [run for i, run in enumerate(runs) if run.name not in {r.name for r in runs[:i]}]


def _best(runs, name):
    """The run of optimizer `name` with the lowest final validation loss (None if absent)."""
    return min((run for run in runs if run.name == name), key=lambda run: run.final_loss,
               default=None)


def _ratio(value, reference):
    return f"{value / reference:.3f}" if reference else "-"


if __name__ == "__main__":
    app.run(main)
