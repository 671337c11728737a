"""CowClip against the plain scaling rules from a base tuned on the built-in data:

    python -m benchmarks.cowclip_tuned --stage=tune    # tune the batch-1024 Adam baseline
    python -m benchmarks.cowclip_tuned --stage=scale   # every rule from the tuned base, 8K-128K
    python -m benchmarks.cowclip_tuned --stage=report  # tables and plot of the runs so far

Data: the launcher's default synthetic data (seed 0, 4,000,000 training rows, 200,000 test
rows). The last --validation_rows training rows are held out as the validation split, so runs
train on the others. Every run trains until its validation AUC has not improved for --patience
epochs (at most --max_epochs) and is reported at its best validation epoch: test AUC and log
loss, test AUC over the rarer and the more frequent half of the test rows (benchmarks.id_rarity),
and training seconds up to that epoch, with the CPU seconds other processes took meanwhile (a
speed is only read from runs that had the machine to themselves). Tuning and stopping look at
validation AUC only.

Tuning is a coordinate search from the Criteo preset: for each of the embedding and dense learning
rates (steps of sqrt(10)), L2 and the embedding init's stddev (steps of 10) in turn, step up while
the best validation AUC improves, else down, so the chosen value's neighbours both score lower.
The scale stage takes the best base of --base_model (tuning it first if its search has not
finished) and applies each rule (tfscale.optimizers.scaling) at each batch size to --model.
Finished runs are appended to --results, one JSON line each, and never rerun, so an interrupted
stage resumes at its first unfinished run."""

import dataclasses
import json
import math
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

import models  # noqa: E402
from benchmarks.id_rarity import rare_row_mask, share_below  # noqa: E402
from benchmarks.timing import OtherProcessesCPU  # noqa: E402
from tfscale.data.synthetic import SyntheticCTR  # noqa: E402
from tfscale.errors import NonFiniteTraining  # noqa: E402
from tfscale.metrics import exact_auc, log_loss  # noqa: E402
from tfscale.optimizers import factory  # noqa: E402
from tfscale.optimizers.scaling import (BASE_BATCH_SIZE, PRESETS, Preset,  # noqa: E402
                                        large_batch_settings)
from tfscale.training.evaluation import predict_with_labels  # noqa: E402
from tfscale.training.run import TrainingConfig, train  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_enum("stage", "report", ["tune", "scale", "report"], "What to run (module docstring).")
flags.DEFINE_string("model", "deepfm", "Model of every run.")
flags.DEFINE_string("base_model", None, "Scale stage and report: the model whose tuned base is "
                    "scaled (default: --model).")
flags.DEFINE_integer("train_rows", 4_000_000, "Synthetic training rows, validation rows included.")
flags.DEFINE_integer("validation_rows", 200_000, "The last training rows, held out for selection.")
flags.DEFINE_integer("test_rows", 200_000, "Synthetic test rows.")
flags.DEFINE_enum("embedding_update", "dense", ["row", "dense"],
                  "Scale stage: how the scaled runs' tables are updated (tfscale.optimizers."
                  "factory). Tuning always uses dense, the papers' update, as the recorded runs "
                  "did before row updates became the launcher's default.")
flags.DEFINE_integer("max_epochs", 10, "Epochs at most per run.")
flags.DEFINE_integer("patience", 1, "Epochs without a better validation AUC before a run stops.")
flags.DEFINE_list("batch_sizes", ["8192", "32768", "65536", "131072"], "Scale stage: batch sizes.")
flags.DEFINE_list("rules", ["none", "sqrt", "linear", "cowclip"], "Scale stage: rules.")
flags.DEFINE_bool("scale_base", True, "Scale stage: also run the base itself at batch 1024.")
flags.DEFINE_list("two_seed_batch_sizes", ["1024", "65536"],
                  "Scale stage: batch sizes run with initialisation seeds 0 and 1 (others: 0).")
flags.DEFINE_string("results", "benchmarks/results/cowclip_tuned_runs.jsonl", "Runs, one a line.")
flags.DEFINE_float("rare_id_probability", None, "The data with SyntheticCTR's rare_id_probability: "
                   "rarer ids carry less signal (an experiment; give it its own --results).")
flags.DEFINE_float("rare_id_power", 1.0, "SyntheticCTR's rare_id_power, with --rare_id_probability.")
flags.DEFINE_bool("fixed_base", False, "Scale stage and report: scale the synthetic preset's base "
                  "(the tuned base) instead of searching one on this data.")
flags.DEFINE_string("plot", None, "Report's plot (default: "
                    "benchmarks/results/cowclip_tuned_auc_<model>.png).")

# (hyper-parameter, multiplicative step) in the coordinate search's order.
SEARCH_STEPS = (("embedding_learning_rate", math.sqrt(10)), ("dense_learning_rate", math.sqrt(10)),
                ("l2", 10.0), ("embedding_init_stddev", 10.0))
DATA_SEED = 0


@dataclasses.dataclass(frozen=True)
class Run:
    """One training run: a model, a base (the batch-1024 hyper-parameters), a rule, a batch, a
    seed."""

    model: str
    embedding_learning_rate: float
    dense_learning_rate: float
    l2: float
    embedding_init_stddev: float
    batch_size: int = BASE_BATCH_SIZE
    rule: str = "none"
    seed: int = 0
    embedding_update: str = "dense"

    def key(self):
        base = ",".join(f"{getattr(self, name):.3g}" for name, _ in SEARCH_STEPS)
        return (f"{self.model}|base {base}|{self.rule}|{self.batch_size}|seed {self.seed}|"
                f"{FLAGS.train_rows}-{FLAGS.validation_rows}-{FLAGS.test_rows}|"
                f"{FLAGS.max_epochs}-{FLAGS.patience}"
                + ("|row updates, caught up" if self.embedding_update == "row" else ""))

    @classmethod
    def of(cls, record):
        model = record.get("model", record["key"].split("|")[0])  # older records: in the key
        return cls(**{field.name: record.get(field.name, field.default)  # older: no update
                      for field in dataclasses.fields(cls) if field.name != "model"}, model=model)

    def base(self):
        return Preset(dense_learning_rate=self.dense_learning_rate,
                      embedding_learning_rate=self.embedding_learning_rate, l2=self.l2,
                      embedding_init_stddev=self.embedding_init_stddev)


class Experiment:
    """The data splits, the finished runs and a way to run the missing ones."""

    def __init__(self):
        training_rows = FLAGS.train_rows - FLAGS.validation_rows
        if training_rows < 1 or FLAGS.validation_rows < 1:
            raise app.UsageError(f"--validation_rows={FLAGS.validation_rows} must be in "
                                 f"[1, --train_rows={FLAGS.train_rows})")
        # Rows depend only on the seed and their index: this source's "test" split is the
        # held-out training rows, the full source's test split the test rows.
        data = {} if FLAGS.rare_id_probability is None else {
            "rare_id_probability": FLAGS.rare_id_probability, "rare_id_power": FLAGS.rare_id_power}
        self.data_key = "".join(f"|{name} {value:g}" for name, value in data.items())
        self.training = SyntheticCTR(seed=DATA_SEED, train_rows=training_rows,
                                     test_rows=FLAGS.validation_rows, **data)
        self.full = SyntheticCTR(seed=DATA_SEED, train_rows=FLAGS.train_rows,
                                 test_rows=FLAGS.test_rows, **data)
        self.rare_rows = None
        self.done = {}
        if os.path.exists(FLAGS.results):
            with open(FLAGS.results) as f:
                self.done = {record["key"]: record for record in map(json.loads, f)}

    def result(self, run):
        """The finished record of `run`, training it first if it is not in --results."""
        key = self.key(run)
        if key not in self.done:
            record = dict(self._train(run), key=key, **dataclasses.asdict(run))
            with open(FLAGS.results, "a") as f:
                f.write(json.dumps(record) + "\n")
            self.done[key] = record
        return self.done[key]

    def key(self, run):
        """`run`'s key in --results: Run.key, plus the data's options if any."""
        return run.key() + self.data_key

    def score(self, run):
        """Best validation AUC of `run` (-inf if it diverged)."""
        record = self.result(run)
        return record["best_validation_auc"] if record["best_validation_auc"] is not None \
            else -math.inf

    def _train(self, run):
        if self.rare_rows is None:
            self.rare_rows = rare_row_mask(self.full, FLAGS.train_rows, FLAGS.test_rows,
                                           self.training.train_rows)
        keras.utils.set_random_seed(run.seed)
        optimizer_name = "cowclip" if run.rule == "cowclip" else "adam"
        settings = large_batch_settings(run.batch_size, run.rule, run.base())
        model = models.build_model(
            run.model, self.training.schema,
            embeddings_initializer=keras.initializers.RandomNormal(
                stddev=settings.embedding_init_stddev),
            **factory.model_regularization(settings, optimizer_name, run.embedding_update))
        steps_per_epoch = self.training.train_steps_per_epoch(run.batch_size)
        model.compile(factory.build_optimizer(
            settings, optimizer_name, factory.warmup_steps_for(settings, steps_per_epoch),
            run.embedding_update), keras.losses.BinaryCrossentropy())
        epochs, diverged = [], None
        for epoch in range(FLAGS.max_epochs):
            others = OtherProcessesCPU()
            try:  # one epoch a call: train() evaluates the validation split after it
                trained = train(model, self.training,
                                TrainingConfig(batch_size=run.batch_size, epochs=1,
                                               log_every_steps=10 ** 9),
                                print_fn=lambda line: None).final
            except NonFiniteTraining as error:
                diverged = f"epoch {epoch + 1}: {error}"
                break
            epochs.append(dict(self._test(model), validation_auc=trained["auc"],
                               train_seconds=trained["train_seconds"],
                               other_cpu_seconds=others.seconds()))
            print(f"{self.key(run)}: epoch {epoch + 1}: validation AUC {trained['auc']:.4f}, "
                  f"test AUC {epochs[-1]['test_auc']:.4f} ({trained['train_seconds']:.0f} s)",
                  flush=True)
            best = int(np.argmax([e["validation_auc"] for e in epochs]))
            if len(epochs) - 1 - best >= FLAGS.patience:
                break
        best = int(np.argmax([e["validation_auc"] for e in epochs])) if epochs else None
        return {
            "epochs": epochs, "diverged": diverged,
            "best_epoch": None if best is None else best + 1,
            "best_validation_auc": None if best is None else epochs[best]["validation_auc"],
            "settings": dataclasses.asdict(settings), "steps_per_epoch": steps_per_epoch,
        }

    def _test(self, model):
        labels, predictions = predict_with_labels(model, self.full.test_batches(65536))
        rare = self.rare_rows
        return {"test_auc": exact_auc(labels, predictions),
                "test_logloss": log_loss(labels, predictions),
                "test_auc_rarer_half": exact_auc(labels[rare], predictions[rare]),
                "test_auc_frequent_half": exact_auc(labels[~rare], predictions[~rare])}


def criteo_base(model):
    preset = PRESETS["criteo"]
    return Run(model, preset.embedding_learning_rate, preset.dense_learning_rate, preset.l2,
               preset.embedding_init_stddev)


def preset_base(model):
    """The synthetic preset's base (the one the tune stage found on the default data) as a Run."""
    preset = PRESETS["synthetic"]
    return Run(model, preset.embedding_learning_rate, preset.dense_learning_rate, preset.l2,
               preset.embedding_init_stddev)


def coordinate_search(experiment, model):
    """The module docstring's search from the Criteo preset for `model`; returns the best base
    run."""
    centre = criteo_base(model)
    for name, step in SEARCH_STEPS:
        best = experiment.score(centre)
        for factor in (step, 1 / step):
            moved = False
            while True:
                candidate = dataclasses.replace(
                    centre, **{name: float(f"{getattr(centre, name) * factor:.2g}")})
                score = experiment.score(candidate)
                if score <= best:
                    break
                centre, best, moved = candidate, score, True
            if moved:  # went up past the start: the start is the lower neighbour
                break
    return centre


def tuning_records(experiment, model):
    """The finished runs of the tune stage of `model` with this data and stopping rule."""
    return [r for r in experiment.done.values()
            if (Run.of(r).model, Run.of(r).key()) == (model, r["key"])
            and (r["batch_size"], r["rule"], r["seed"]) == (BASE_BATCH_SIZE, "none", 0)]


def best_tuned_so_far(experiment, model):
    """The finished tuning run of `model` with the best validation AUC (the search's result once
    the tune stage has finished), as a Run."""
    best = max(tuning_records(experiment, model),
               key=lambda r: r["best_validation_auc"] or -math.inf)
    return Run.of(best)


def scaled_runs(tuned):
    """The scale stage's runs of --model from the `tuned` base, in order: the base itself at
    batch 1024 (unless --noscale_base; already run when --model is the tuned model), every rule at every batch, then
    the second seeds."""
    base = dataclasses.replace(tuned, model=FLAGS.model)
    two_seeds = {int(b) for b in FLAGS.two_seed_batch_sizes}
    runs = []
    for seed in (0, 1):
        if FLAGS.scale_base and (seed == 0 or BASE_BATCH_SIZE in two_seeds):
            runs.append(dataclasses.replace(base, seed=seed))
        runs += [dataclasses.replace(base, batch_size=batch, rule=rule, seed=seed,
                                     embedding_update=FLAGS.embedding_update)
                 for batch in map(int, FLAGS.batch_sizes) if seed == 0 or batch in two_seeds
                 for rule in FLAGS.rules]
    return runs


def at_best_epoch(record):
    """The record's epoch chosen by validation AUC, with the training seconds up to it."""
    epochs = record["epochs"][:record["best_epoch"]]
    return dict(epochs[-1], seconds=sum(e["train_seconds"] for e in epochs))


def timing_mark(record, epochs):
    """"" if the machine ran nothing else over the record's first `epochs` epochs, "*" if other
    processes took over a tenth of the training seconds in CPU time, "?" if not recorded."""
    epochs = record["epochs"][:epochs]
    if any("other_cpu_seconds" not in e for e in epochs):
        return "?"
    return "*" if any(e["other_cpu_seconds"] > 0.1 * e["train_seconds"] for e in epochs) else ""


def time_to_reach(record, auc):
    """Training seconds until the first epoch with a test AUC of at least `auc`, and that epoch's
    timing mark; None if no epoch gets there."""
    hits = [i for i, e in enumerate(record["epochs"]) if e["test_auc"] >= auc]
    if not hits:
        return None
    epochs = hits[0] + 1
    return (sum(e["train_seconds"] for e in record["epochs"][:epochs]),
            timing_mark(record, epochs))


def print_tuning(experiment, model, best):
    print("\n| embedding lr | dense lr | L2 | init stddev | best epoch | validation AUC "
          "| test AUC | validation AUC after each epoch |\n|---|---|---|---|---|---|---|---|")
    for record in tuning_records(experiment, model):
        chosen = "**" if Run.of(record) == best else ""
        curve = ", ".join(f"{e['validation_auc']:.4f}" for e in record["epochs"])
        if record["diverged"]:
            curve += f" (diverged at {record['diverged'].split(':')[0]})"
        test = f"{at_best_epoch(record)['test_auc']:.4f}" if record["best_epoch"] else "-"
        validation = f"{record['best_validation_auc']:.4f}" if record["best_epoch"] else "-"
        print(f"| {chosen}{record['embedding_learning_rate']:.2g}{chosen} | "
              f"{record['dense_learning_rate']:.2g} | {record['l2']:.2g} | "
              f"{record['embedding_init_stddev']:.2g} | {record['best_epoch'] or '-'} | "
              f"{validation} | {test} | {curve} |")


def print_scaling(experiment, tuned):
    """Per batch and rule: test AUC at the best validation epoch (seeds' mean and each seed), its
    difference to the 1K baseline's mean, AUC by id frequency, epochs and seconds to the best
    epoch, and the speed-up to equal AUC: the baseline's training seconds to a test AUC within
    0.001 of its own, over the run's (both comparisons blank before the baseline has run).
    Returns the baseline AUC and each rule's points, or None without a baseline."""
    groups = {}
    for run in scaled_runs(tuned):
        if experiment.key(run) in experiment.done:
            groups.setdefault((run.batch_size, run.rule), []).append(
                experiment.done[experiment.key(run)])
    baseline = baseline_of(groups.get((BASE_BATCH_SIZE, "none")))
    if FLAGS.rare_id_probability is not None:
        share = share_below(experiment.full, FLAGS.train_rows, FLAGS.test_rows,
                            FLAGS.rare_id_probability)
        print(f"\nids of probability below {FLAGS.rare_id_probability:g} in their field: "
              f"{share:.1%} of the test rows' present ids")
    print(f"teacher ceiling: test AUC {experiment.full.teacher_auc():.4f}")
    print("| batch | rule | test AUC (each seed) | vs 1K | AUC rarer half | AUC frequent half "
          "| best epoch | s to best epoch | speed-up to equal AUC |\n"
          "|---|---|---|---|---|---|---|---|---|")
    points = {}
    for (batch, rule), records in sorted(groups.items(), key=lambda group: group[0][0]):
        converged = [r for r in records if r["best_epoch"]]
        if not converged:
            print(f"| {batch:,} | {rule} | diverged: {records[0]['diverged']} | | | | | | |")
            continue
        best = [at_best_epoch(r) for r in converged]
        seconds_to_best = [f"{e['seconds']:.0f}{timing_mark(r, r['best_epoch'])}"
                           for e, r in zip(best, converged)]
        auc = float(np.mean([e["test_auc"] for e in best]))
        points.setdefault(rule, []).append((batch, auc))
        versus, reach = "", []
        if baseline:
            baseline_auc, baseline_seconds = baseline
            versus = f"{auc - baseline_auc:+.4f}"
            reach = [time_to_reach(r, baseline_auc - 0.001) for r in converged]
            reach = [f"{baseline_seconds / time[0]:.1f}x{time[1]}" if time else "not reached"
                     for time in reach]
        print(f"| {batch:,} | {rule} | {auc:.4f} ("
              + ", ".join(f"{e['test_auc']:.4f}" for e in best)
              + f") | {versus} | "
              + " | ".join(f"{np.mean([e[k] for e in best]):.4f}"
                           for k in ("test_auc_rarer_half", "test_auc_frequent_half"))
              + f" | {', '.join(str(r['best_epoch']) for r in converged)} | "
              + f"{', '.join(seconds_to_best)} | "
              + f"{', '.join(reach)} |")
    print("Seconds marked * ran beside other work (over a tenth of their training time in other "
          "processes' CPU), ? where that was not recorded: not speeds.")
    return None if baseline is None else (baseline[0], points)


def baseline_of(records):
    """The 1K baseline's test AUC (mean over its seeds) and its training seconds to a test AUC
    within 0.001 of that (a seed below it never gets there: the mean is over the seeds that do,
    and over those that had the machine to themselves if any did), printed; None without
    records."""
    if not records:
        print(f"\nno {FLAGS.model} run at batch {BASE_BATCH_SIZE} from this base yet")
        return None
    baseline_auc = float(np.mean([at_best_epoch(r)["test_auc"] for r in records]))
    reached = [time for time in (time_to_reach(r, baseline_auc - 0.001) for r in records) if time]
    alone = [seconds for seconds, mark in reached if not mark]
    baseline_seconds = float(np.mean(alone or [seconds for seconds, _ in reached]))
    print(f"\n1K baseline: test AUC {baseline_auc:.4f} (mean of {len(records)} "
          f"seed{'s' if len(records) > 1 else ''}), reached within 0.001 after "
          f"{baseline_seconds:.0f} s of training (mean of {len(alone) or len(reached)} of "
          f"{len(records)} seeds, timed {'alone' if alone else 'not known to be alone'})")
    return baseline_auc, baseline_seconds


def plot_scaling(base_model, baseline_auc, points):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6, 4))
    axis.axhspan(baseline_auc - 0.001, baseline_auc + 0.001, color="0.85",
                 label="1K baseline +- 0.001")
    for rule, rule_points in points.items():
        if rule != "none" or len(rule_points) > 1:
            axis.plot(*zip(*sorted(rule_points)), marker="o", label=rule)
    axis.set_xscale("log", base=2)
    axis.set_xlabel("batch size")
    axis.set_ylabel("test AUC at the best validation epoch")
    axis.set_title(f"{FLAGS.model}, synthetic data, {base_model}'s base tuned at batch 1,024")
    axis.legend()
    figure.tight_layout()
    figure.savefig(plot_path(), dpi=120)


def plot_path():
    return FLAGS.plot or f"benchmarks/results/cowclip_tuned_auc_{FLAGS.model}.png"


def main(argv):
    del argv
    os.makedirs(os.path.dirname(FLAGS.results), exist_ok=True)
    experiment = Experiment()
    base_model = FLAGS.base_model or FLAGS.model
    if FLAGS.stage == "tune":
        best = coordinate_search(experiment, FLAGS.model)
        print(f"tuned base: {best}")
    elif FLAGS.stage == "scale":
        base = preset_base(base_model) if FLAGS.fixed_base else coordinate_search(experiment,
                                                                                   base_model)
        for run in scaled_runs(base):
            experiment.result(run)
    elif not FLAGS.fixed_base and not tuning_records(experiment, base_model):
        print(f"no finished {base_model} tuning run in {FLAGS.results} yet")
    else:
        if FLAGS.fixed_base:
            base = preset_base(base_model)
            print(f"base: the synthetic preset's, {base}")
        else:
            base = best_tuned_so_far(experiment, base_model)
            print_tuning(experiment, base_model, base)
            print(f"tuned base (best so far): {base}")
        scaling = print_scaling(experiment, base)
        if scaling:
            plot_scaling(base_model, *scaling)
            print(f"plot: {plot_path()}")


if __name__ == "__main__":
    app.run(main)
