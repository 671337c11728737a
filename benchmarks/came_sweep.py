"""CAME against Adam and Keras's Adafactor at a fair budget: each optimizer's learning rate swept
over a grid that brackets its best, at two batch sizes, on two models:

- transformer: the byte-level language model of benchmarks.came (models.transformer) on the
  Python standard library (benchmarks.byte_corpus), --steps steps at each of --batch_sizes,
  linear warm-up over --warmup_fraction of the steps then cosine decay to 10% of the peak,
  validation loss every --eval_every steps. Adam (FusedAdam) with betas (0.9, 0.999), eps 1e-8;
  CAME with the paper's betas (0.9, 0.999, 0.9999) and eps (1e-30, 1e-16); Keras's Adafactor
  with its defaults (no momentum, eps 1e-30 and 1e-3, relative step). Same initial weights and
  batches for every optimizer at one seed.
- deepfm: the launcher itself (`python -m launch.train --optimizer=adam|came --learning_rate=R`,
  tables by row, no scaling rule, no L2, the warm-up over --warmup_fraction of the epoch) on
  the built-in synthetic data, one epoch of --ctr_train_rows at each of --ctr_batch_sizes; test
  AUC.

    python -m benchmarks.came_sweep [--parts=transformer,deepfm] [--parallel=2]
    python -m benchmarks.came_sweep --report_only

Rates come from a ladder of 1 and 3 per decade. Each (model, batch, optimizer) starts from its
grid flag; while its best rate is at the edge of the rates run, the next rate outward is added
(at most --max_extensions times). Once every optimizer at a transformer batch is bracketed, the
--reseeded best (all three by default) run again at their best rate with each further seed of
--seeds.

Each run is a child process with --threads_per_run threads, --parallel at a time (so wall
seconds are not a speed result; step-time ratios are benchmarks.came's and came_deepfm's). Every
finished run is appended to --results (JSON lines) and never rerun: the sweep resumes where it
stopped. The report (markdown with the machine, --report; a PNG of validation curves per
transformer batch) is written at the end, or alone with --report_only."""

import json
import math
import os
import pathlib
import re
import statistics
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags  # noqa: E402

from benchmarks.rate_sweep import (  # noqa: E402
    Grid, best_rate, finished_rates, key, loss_of, wanted_runs)

FLAGS = flags.FLAGS
flags.DEFINE_list("parts", ["transformer", "deepfm"], "Which models to sweep.")
flags.DEFINE_integer("parallel", 2, "Runs at a time.")
flags.DEFINE_integer("threads_per_run", 1, "TensorFlow intra- and inter-op threads per run.")
flags.DEFINE_string("results", "benchmarks/results/came_sweep.jsonl", "Runs, one JSON a line.")
flags.DEFINE_string("report", "benchmarks/results/came_sweep.md", "Markdown report.")
flags.DEFINE_boolean("report_only", False, "Write the report from --results; run nothing.")
flags.DEFINE_integer("max_extensions", 2, "Rates added outward per grid when its best is at an "
                     "edge.")
flags.DEFINE_list("seeds", ["0", "1"], "The first seed for every run; the others for the "
                  "--reseeded best optimizers at each transformer batch, at their best rate.")
flags.DEFINE_integer("reseeded", 3, "How many of the best optimizers at a transformer batch "
                     "run with the further seeds.")
flags.DEFINE_float("warmup_fraction", 0.1, "Linear warm-up, as a fraction of the run's steps.")
# transformer
flags.DEFINE_list("batch_sizes", ["4", "32"], "Transformer batch sizes (sequences).")
flags.DEFINE_integer("steps", 3000, "Transformer training steps per run.")
flags.DEFINE_integer("eval_every", 100, "Steps between validation losses.")
flags.DEFINE_integer("validation_windows", 256, "Fixed validation sequences.")
flags.DEFINE_integer("sequence_length", 64, "Bytes per sequence.")
flags.DEFINE_integer("width", 128, "Transformer width.")
flags.DEFINE_integer("num_layers", 2, "Transformer blocks.")
flags.DEFINE_integer("num_heads", 4, "Attention heads.")
flags.DEFINE_list("adam_rates", ["1e-3", "3e-3", "1e-2"], "Adam's transformer grid.")
flags.DEFINE_list("adafactor_rates", ["1e-2", "3e-2", "1e-1"], "Adafactor's transformer grid.")
flags.DEFINE_list("came_rates", ["1e-4", "3e-4", "1e-3"], "CAME's transformer grid.")
flags.DEFINE_float("came_beta_3", None, "A diagnostic: also CAME with this beta_3 (the paper's "
                   "is 0.9999) on the transformer, over --came_rates, named came_beta3_VALUE.")
# deepfm
flags.DEFINE_list("ctr_batch_sizes", ["8192", "32768"], "DeepFM batch sizes.")
flags.DEFINE_integer("ctr_train_rows", 2_000_000, "Synthetic training rows (one epoch).")
flags.DEFINE_integer("ctr_test_rows", 200_000, "Synthetic test rows.")
flags.DEFINE_list("ctr_adam_rates", ["1e-3", "3e-3", "1e-2"], "Adam's DeepFM grid.")
flags.DEFINE_list("ctr_came_rates", ["1e-4", "3e-4", "1e-3"], "CAME's DeepFM grid.")
flags.DEFINE_string("run", None, "Internal: train the transformer run this JSON describes and "
                    "print its result.")

CAME_BETA_3 = "came_beta3_"  # the name of CAME with another beta_3 starts so
ADAM_EPSILON = 1e-8  # the paper's and torch's (Keras: 1e-7)
EPOCH_LINE = re.compile(r"epoch 1/1: test AUC ([\d.]+)")


# ---- what to run ----------------------------------------------------------------------------

def part_config(part):
    """What a run's result depends on besides batch, optimizer, rate and seed."""
    if part == "transformer":
        return dict(steps=FLAGS.steps, eval_every=FLAGS.eval_every,
                    validation_windows=FLAGS.validation_windows,
                    sequence_length=FLAGS.sequence_length, width=FLAGS.width,
                    num_layers=FLAGS.num_layers, num_heads=FLAGS.num_heads,
                    warmup_fraction=FLAGS.warmup_fraction)
    return dict(train_rows=FLAGS.ctr_train_rows, test_rows=FLAGS.ctr_test_rows,
                warmup_fraction=FLAGS.warmup_fraction)


def grid_of(part):
    """The flags' rate_sweep.Grid of `part`."""
    if part == "transformer":
        rates = {"adam": FLAGS.adam_rates, "adafactor": FLAGS.adafactor_rates,
                 "came": FLAGS.came_rates}
        if FLAGS.came_beta_3 is not None:
            rates[f"{CAME_BETA_3}{FLAGS.came_beta_3:g}"] = FLAGS.came_rates
        batches = FLAGS.batch_sizes
    else:
        rates = {"adam": FLAGS.ctr_adam_rates, "came": FLAGS.ctr_came_rates}
        batches = FLAGS.ctr_batch_sizes
    return Grid(part=part, batches=tuple(int(b) for b in batches),
                rates={name: tuple(float(r) for r in grid) for name, grid in rates.items()},
                config=part_config(part),
                reseeded=FLAGS.reseeded if part == "transformer" else 0)


def seeds():
    return [int(seed) for seed in FLAGS.seeds]


def load_results():
    path = pathlib.Path(FLAGS.results)
    if not path.exists():
        return {}
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {key(record): record for record in records}


# ---- running ---------------------------------------------------------------------------------

def expected_cost(run):
    if run["part"] == "transformer":
        return run["batch"] * run["config"]["steps"]
    return run["config"]["train_rows"] / 30  # a DeepFM row costs about 1/30 of a sequence


def command_of(run):
    if run["part"] == "transformer":
        return [sys.executable, "-m", "benchmarks.came_sweep", f"--run={json.dumps(run)}",
                f"--threads_per_run={FLAGS.threads_per_run}"]
    steps = math.ceil(run["config"]["train_rows"] / run["batch"])
    return [sys.executable, "-m", "launch.train", f"--optimizer={run['optimizer']}",
            f"--learning_rate={run['rate']:g}", f"--batch_size={run['batch']}",
            f"--train_rows={run['config']['train_rows']}",
            f"--test_rows={run['config']['test_rows']}", "--epochs=1",
            f"--warmup_steps={round(run['config']['warmup_fraction'] * steps)}",
            f"--seed={run['seed']}", "--logdir=none", "--checkpoint_dir=none"]


def start(run):
    threads = str(FLAGS.threads_per_run)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TF_NUM_INTRAOP_THREADS=threads,
               TF_NUM_INTEROP_THREADS=threads)
    process = subprocess.Popen(command_of(run), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=env)
    return process, time.perf_counter(), os.getloadavg()[0]


def finish(run, process, started, load_at_start):
    stdout, stderr = process.communicate()
    if process.returncode:
        raise RuntimeError(f"{' '.join(command_of(run))} failed:\n{stderr[-3000:]}")
    record = dict(run, seconds=round(time.perf_counter() - started, 1),
                  load_average=[load_at_start, os.getloadavg()[0]])
    if run["part"] == "transformer":
        record.update(json.loads(stdout.strip().splitlines()[-1]))
    else:
        found = EPOCH_LINE.search(stdout)
        record["auc"] = float(found.group(1)) if found else math.nan
    with open(FLAGS.results, "a", encoding="utf-8") as results:
        results.write(json.dumps(record) + "\n")
    return record


def sweep():
    running = {}
    while True:
        done = load_results()
        wanted = wanted_runs(done, [grid_of(part) for part in FLAGS.parts], seeds(),
                             FLAGS.max_extensions)
        pending = sorted((r for r in wanted if key(r) not in running),
                         key=expected_cost, reverse=True)
        while pending and len(running) < FLAGS.parallel:
            run = pending.pop(0)
            running[key(run)] = (run, *start(run))
            print(f"started {run['part']} batch {run['batch']} {run['optimizer']} "
                  f"{run['rate']:g} seed {run['seed']}", flush=True)
        if not running:
            return
        finished = []
        while not finished:  # the results change only when a run finishes
            time.sleep(2)
            finished = [k for k, (_, process, *_) in running.items()
                        if process.poll() is not None]
        for k in finished:
            record = finish(*running.pop(k))
            score = record.get("final_loss", record.get("auc"))
            print(f"finished {record['part']} batch {record['batch']} {record['optimizer']} "
                  f"{record['rate']:g} seed {record['seed']}: {score:.4f} in "
                  f"{record['seconds']:.0f} s", flush=True)


# ---- one transformer run (a child process) ---------------------------------------------------

def train_language_model(run):
    """{"curve": [[step, validation loss]], "final_loss"} of one transformer run."""
    import keras
    import numpy as np

    from benchmarks.byte_corpus import stdlib_corpus, validation_windows, windows
    from models.transformer import TransformerLM
    from tfscale.optimizers.came import CAME
    from tfscale.optimizers.fused_adam import FusedAdam

    config, batch, seed = run["config"], run["batch"], run["seed"]
    steps, length = config["steps"], config["sequence_length"]
    warmup = round(config["warmup_fraction"] * steps)
    schedule = keras.optimizers.schedules.CosineDecay(
        0.0, steps - warmup, alpha=0.1, warmup_target=run["rate"], warmup_steps=warmup)
    name = run["optimizer"]
    if name.startswith(CAME_BETA_3):
        optimizer = CAME(schedule, beta_3=float(name.removeprefix(CAME_BETA_3)))
    else:
        optimizer = {"adam": lambda: FusedAdam(schedule, epsilon=ADAM_EPSILON),
                     "adafactor": lambda: keras.optimizers.Adafactor(schedule),
                     "came": lambda: CAME(schedule)}[name]()
    train, validation_bytes, _ = stdlib_corpus()
    validation = validation_windows(validation_bytes, config["validation_windows"], length)
    keras.utils.set_random_seed(seed)
    model = TransformerLM(sequence_length=length, width=config["width"],
                          num_layers=config["num_layers"], num_heads=config["num_heads"])
    model.compile(optimizer, keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(seed)

    def validation_loss():
        return float(model.evaluate(validation[:, :-1], validation[:, 1:], batch_size=64,
                                    verbose=0))

    curve = [[0, validation_loss()]]
    for first in range(0, steps, config["eval_every"]):
        count = min(config["eval_every"], steps - first)
        batches = windows(train, rng.integers(0, train.size - length - 1, count * batch), length)
        model.fit(batches[:, :-1], batches[:, 1:], batch_size=batch, shuffle=False, verbose=0)
        curve.append([first + count, validation_loss()])
        if not math.isfinite(curve[-1][1]):
            break  # diverged: the run's loss is not finite
    return {"curve": curve, "final_loss": curve[-1][1]}


# ---- report ----------------------------------------------------------------------------------

def finished_groups(done, grid, batch, seed):
    """{optimizer: {rate: record}} of one batch and seed; None while an optimizer has none."""
    groups = {o: finished_rates(done, grid, batch, o, seed) for o in grid.rates}
    return groups if all(groups.values()) else None


def best_of(finished):
    rate = best_rate(finished)
    return rate, finished[rate]


def reached_step(curve, target):
    """The first evaluated step whose validation loss is at or below `target` (None: never)."""
    return next((step for step, loss in curve if loss <= target), None)


def transformer_report(done, lines, figures):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from benchmarks.byte_corpus import stdlib_corpus

    grid = grid_of("transformer")
    config = grid.config
    first, *other_seeds = seeds()
    lines += ["## Transformer", "", f"Corpus: {stdlib_corpus()[2]}.", "",
              f"Model: models.transformer, {config['num_layers']} layers, width "
              f"{config['width']}, {config['num_heads']} heads, sequence "
              f"{config['sequence_length']} bytes, tied embeddings. {config['steps']:,} steps, "
              f"warm-up {config['warmup_fraction']:.0%} then cosine to 10%; validation loss "
              f"(nats per byte) on {config['validation_windows']} fixed windows.", ""]
    for batch in grid.batches:
        groups = finished_groups(done, grid, batch, first)
        if groups is None:
            continue
        lines += [f"### Batch {batch} x {config['sequence_length']} bytes", "",
                  "| optimizer | peak lr | final val loss (seed " + str(first) + ") | other "
                  "seeds | mean | vs best Adam |", "|---|---:|---:|---:|---:|---:|"]
        best = {o: best_of(g) for o, g in groups.items()}
        means = {}
        for optimizer, (rate, _) in best.items():
            runs = [finished_rates(done, grid, batch, optimizer, s).get(rate)
                    for s in [first, *other_seeds]]
            means[optimizer] = statistics.mean(loss_of(r) for r in runs if r)
        adam_best = means["adam"]
        for optimizer, group in groups.items():
            for rate in sorted(group):
                record = group[rate]
                is_best = rate == best[optimizer][0]
                others = [finished_rates(done, grid, batch, optimizer, s).get(rate)
                          for s in other_seeds] if is_best else []
                other_text = ", ".join(f"{r['final_loss']:.4f}" for r in others if r) or "-"
                mean = means[optimizer] if is_best else loss_of(record)
                edge = " (edge)" if is_best and rate in (min(group), max(group)) else ""
                bold = "**" if is_best else ""
                lines.append(f"| {optimizer} | {rate:g}{edge} | {bold}{record['final_loss']:.4f}"
                             f"{bold} | {other_text} | {mean:.4f} | "
                             f"{100 * (mean / adam_best - 1):+.2f}% |")
        adafactor_final = means["adafactor"]
        lines += ["", "Each optimizer at its best rate (mean over the seeds run): first step at "
                  "or below Adafactor's final loss " f"({adafactor_final:.4f}):", ""]
        lines += ["| optimizer | best lr | mean final loss | vs Adam | reaches Adafactor's "
                  "final at step |", "|---|---:|---:|---:|---:|"]
        for optimizer, (rate, record) in best.items():
            step = reached_step(record["curve"], adafactor_final)
            lines.append(f"| {optimizer} | {rate:g} | {means[optimizer]:.4f} | "
                         f"{100 * (means[optimizer] / adam_best - 1):+.2f}% | "
                         f"{step if step is not None else 'not reached'} |")
        lines.append("")
        figure, axes = plt.subplots(figsize=(7, 4.5))
        for optimizer, (rate, record) in best.items():
            steps, losses = zip(*record["curve"])
            axes.plot(steps, losses, label=f"{optimizer} (lr {rate:g})")
        axes.set_xlabel("training step")
        axes.set_ylabel("validation loss (nats per byte)")
        axes.set_title(f"Transformer LM, batch {batch} x {config['sequence_length']} bytes, "
                       f"best rate of each (seed {first})")
        finals = [record["final_loss"] for _, record in best.values()]
        axes.set_ylim(min(finals) - 0.1, max(finals) + 0.8)
        axes.grid(alpha=0.3)
        axes.legend()
        figure.tight_layout()
        report = pathlib.Path(FLAGS.report)
        path = report.with_name(f"{report.stem}_batch_{batch}.png")
        figure.savefig(path, dpi=120)
        plt.close(figure)
        figures.append(path.name)


def deepfm_report(done, lines):
    grid = grid_of("deepfm")
    config = grid.config
    first = seeds()[0]
    lines += ["## DeepFM", "", f"The launcher on the built-in synthetic data: one epoch of "
              f"{config['train_rows']:,} rows, test AUC on {config['test_rows']:,}; tables by "
              f"row; warm-up {config['warmup_fraction']:.0%} of the epoch; seed {first}.", ""]
    for batch in grid.batches:
        groups = finished_groups(done, grid, batch, first)
        if groups is None:
            continue
        best = {o: best_of(g) for o, g in groups.items()}
        lines += [f"### Batch {batch:,}", "", "| optimizer | lr | test AUC | vs best Adam |",
                  "|---|---:|---:|---:|"]
        for optimizer, group in groups.items():
            for rate in sorted(group):
                auc = group[rate]["auc"]
                bold = "**" if rate == best[optimizer][0] else ""
                lines.append(f"| {optimizer} | {rate:g} | {bold}{auc:.4f}{bold} | "
                             f"{auc - best['adam'][1]['auc']:+.4f} |")
        lines.append("")


def write_report():
    from benchmarks.timing import cpu_flags, machine_description

    done = load_results()
    grids = [grid_of(part) for part in FLAGS.parts]
    reported = sum(1 for r in done.values() if any(
        (r["part"], r["config"]) == (g.part, g.config) and r["optimizer"] in g.rates
        and r["batch"] in g.batches for g in grids))
    lines = ["# CAME, Adam and Adafactor, each at its best rate: "
             "`python -m benchmarks.came_sweep`", "",
             f"Machine: {machine_description()}; CPU flags: {cpu_flags()}. Runs: {reported}, "
             f"{FLAGS.parallel} at a time, {FLAGS.threads_per_run} thread(s) each; load "
             "averages per run in the raw file.", ""]
    figures = []
    if "transformer" in FLAGS.parts:
        transformer_report(done, lines, figures)
    if "deepfm" in FLAGS.parts:
        deepfm_report(done, lines)
    lines += [f"Curves: {', '.join(figures)}." if figures else ""]
    pathlib.Path(FLAGS.report).write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))


def main(argv):
    del argv
    if FLAGS.run:
        import tensorflow as tf

        threads = FLAGS.threads_per_run
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)
        print(json.dumps(train_language_model(json.loads(FLAGS.run))), flush=True)
        return
    if not FLAGS.report_only:
        sweep()
    write_report()


if __name__ == "__main__":
    app.run(main)
