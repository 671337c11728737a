"""The CowClip paper's batch-size experiment on the synthetic Criteo-like data:

    python -m benchmarks.cowclip_batch_sizes [--batch_sizes=1024,4096,16384,65536] [--epochs=1]

For every model, batch size and rule (no scaling, sqrt and linear scaling of Adam's learning
rates, and the CowClip rule; tfscale.optimizers.scaling) it trains from the same seed and
records test AUC and log loss (exact), the teacher's ceiling, time per epoch, examples/s, and
the AUC over the half of the test rows with the rarer ids (by the mean log expected training
count of a row's ids) against the other half. Each run is appended to
--results as one JSON line and skipped when already there, so an interrupted sweep resumes.
At batch 1024 the three plain rules are the same run. Prints a markdown table and writes a PNG
of AUC against batch size, one line per rule."""

import dataclasses
import json
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

import models  # noqa: E402
from benchmarks.id_rarity import rare_row_mask  # noqa: E402
from tfscale.data.synthetic import SyntheticCTR  # noqa: E402
from tfscale.metrics import exact_auc  # noqa: E402
from tfscale.optimizers import factory  # noqa: E402
from tfscale.optimizers.scaling import BASE_BATCH_SIZE, large_batch_settings  # noqa: E402
from tfscale.training.evaluation import predict_with_labels  # noqa: E402
from tfscale.training.run import TrainingConfig, train  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_list("models", ["deepfm"], "Models swept over every batch size and rule.")
flags.DEFINE_list("batch_sizes", ["1024", "4096", "16384", "65536"], "Batch sizes.")
flags.DEFINE_list("rules", ["none", "sqrt", "linear", "cowclip", "cowclip_scalable"],
                  "Rules; cowclip is CowClip's faithful mode, cowclip_scalable its scalable mode.")
flags.DEFINE_list("cowclip_only_models", ["wide_deep", "dcn", "dcn_v2"],
                  "Models run with the CowClip rule only, at --cowclip_only_batch_sizes.")
flags.DEFINE_list("cowclip_only_batch_sizes", ["1024", "65536"], "See --cowclip_only_models.")
flags.DEFINE_integer("train_rows", 1 << 22, "Synthetic training rows (64K batch: 64 steps).")
flags.DEFINE_integer("test_rows", 1 << 18, "Synthetic test rows.")
flags.DEFINE_integer("epochs", 1, "Epochs per run.")
flags.DEFINE_integer("seed", 0, "Seed of the data and the initialisation.")
flags.DEFINE_string("results", "benchmarks/results/cowclip_runs.jsonl", "Results, one run a line.")
flags.DEFINE_string("plot", "benchmarks/results/cowclip_auc.png", "The PNG plot.")
flags.DEFINE_float("l2", None, "Ablation: this L2 for every run instead of the rule's.")
flags.DEFINE_float("embedding_learning_rate", None,
                   "Ablation: this embedding learning rate for every run instead of the rule's.")
flags.DEFINE_bool("with_ablations", False, "With --report_only: also every ablation run of the "
                  "planned runs (other --l2 or --embedding_learning_rate).")
flags.DEFINE_bool("report_only", False, "Print the table and draw the plot of the runs already in "
                  "--results, training nothing.")


def planned_runs():
    """(model, batch size, rule) of every run, in order."""
    runs = [(m, int(b), r) for m in FLAGS.models for b in FLAGS.batch_sizes for r in FLAGS.rules]
    runs += [(m, int(b), "cowclip") for m in FLAGS.cowclip_only_models
             for b in FLAGS.cowclip_only_batch_sizes]
    return list(dict.fromkeys(runs))


def run_key(model, batch, rule):
    """Runs that are the same training share a key: at the base batch every plain rule is."""
    same_rule = "none" if rule in ("sqrt", "linear") and batch == BASE_BATCH_SIZE else rule
    key = f"{model}|{batch}|{same_rule}|{FLAGS.train_rows}|{FLAGS.epochs}|{FLAGS.seed}"
    for name in ("l2", "embedding_learning_rate"):  # ablations are runs of their own
        if getattr(FLAGS, name) is not None:
            key += f"|{name}={getattr(FLAGS, name):g}"
    return key


def ablation_label():
    """What the ablation flags change, for the table and plot (empty without them)."""
    changed = [f"{name} {getattr(FLAGS, name):g}" for name in ("l2", "embedding_learning_rate")
               if getattr(FLAGS, name) is not None]
    return f" ({', '.join(changed)})" if changed else ""


def train_once(source, model_name, batch, rule, rare_rows):
    keras.utils.set_random_seed(FLAGS.seed)
    cowclip = rule.startswith("cowclip")
    settings = large_batch_settings(batch, "cowclip" if cowclip else rule, "criteo")
    settings = dataclasses.replace(settings, **{
        name: getattr(FLAGS, name) for name in ("l2", "embedding_learning_rate")
        if getattr(FLAGS, name) is not None})
    optimizer_name = "cowclip" if cowclip else "adam"
    # The recorded runs used the papers' dense update, CowClip's scalable mode excepted.
    embedding_update = "row" if rule == "cowclip_scalable" else "dense"
    model = models.build_model(
        model_name, source.schema,
        embeddings_initializer=keras.initializers.RandomNormal(stddev=settings.embedding_init_stddev),
        **factory.model_regularization(settings, optimizer_name, embedding_update))
    steps_per_epoch = source.train_steps_per_epoch(batch)
    model.compile(factory.build_optimizer(settings, optimizer_name,
                                          factory.warmup_steps_for(settings, steps_per_epoch),
                                          embedding_update),
                  keras.losses.BinaryCrossentropy())
    # Only the per-epoch test lines are printed: an unfinished long run still shows its epochs.
    result = train(model, source, TrainingConfig(batch_size=batch, epochs=FLAGS.epochs,
                                                 log_every_steps=10 ** 9),
                   print_fn=lambda line: print(f"{model_name} batch {batch} {rule}: {line}",
                                               flush=True) if "test AUC" in line else None)
    labels, predictions = predict_with_labels(model, source.test_batches(65536))
    final = result.final
    return {
        "auc": final["auc"], "logloss": final["logloss"],
        "auc_by_epoch": [e["auc"] for e in result.epochs],
        "logloss_by_epoch": [e["logloss"] for e in result.epochs],
        "auc_rare_rows": exact_auc(labels[rare_rows], predictions[rare_rows]),
        "auc_frequent_rows": exact_auc(labels[~rare_rows], predictions[~rare_rows]),
        "seconds_per_epoch": float(np.mean([e["train_seconds"] for e in result.epochs])),
        "examples_per_second": float(np.mean([e["examples_per_second"] for e in result.epochs])),
        "steps_per_epoch": steps_per_epoch,
        "dense_learning_rate": settings.dense_learning_rate,
        "embedding_learning_rate": settings.embedding_learning_rate, "l2": settings.l2,
    }


def load_results():
    if not os.path.exists(FLAGS.results):
        return {}
    with open(FLAGS.results) as f:
        return {record["key"]: record for record in map(json.loads, f)}


def print_table(records, teacher_auc):
    by_epoch = FLAGS.epochs > 1
    print(f"\nteacher ceiling (test AUC): {teacher_auc:.4f}")
    print("| model | batch | rule | test AUC | logloss | AUC rarer half | AUC frequent half "
          "| s/epoch | examples/s |" + (" test AUC after each epoch |" if by_epoch else ""))
    print("|---|---|---|---|---|---|---|---|---|" + ("---|" if by_epoch else ""))
    for model, batch, rule, r in records:
        line = (f"| {model} | {batch:,} | {rule} | {r['auc']:.4f} | {r['logloss']:.4f} | "
                f"{r['auc_rare_rows']:.4f} | {r['auc_frequent_rows']:.4f} | "
                f"{r['seconds_per_epoch']:.0f} | {r['examples_per_second']:,.0f} |")
        if by_epoch:
            line += " " + ", ".join(f"{auc:.4f}" for auc in r["auc_by_epoch"]) + " |"
        print(line)


def plot(records, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6, 4))
    if FLAGS.epochs > 1:  # one line per run (rules that coincide at the base batch: one line)
        drawn = set()
        for model, batch, rule, r in records:
            if r["key"] in drawn:
                continue
            drawn.add(r["key"])
            epochs = range(1, len(r["auc_by_epoch"]) + 1)
            axis.plot(epochs, r["auc_by_epoch"], marker="o", label=f"{model} {batch:,} {rule}")
        axis.set_xlabel("epoch")
        axis.set_title(f"Synthetic Criteo-like data, {FLAGS.epochs} epochs")
    else:
        for rule in FLAGS.rules:
            points = sorted((b, r["auc"]) for m, b, ru, r in records
                            if ru == rule and m == FLAGS.models[0])
            if points:
                axis.plot(*zip(*points), marker="o", label=rule)
        axis.set_xscale("log", base=2)
        axis.set_xlabel("batch size")
        axis.set_title(f"{FLAGS.models[0]} on synthetic Criteo-like data, 1 epoch")
    axis.set_ylabel("test AUC")
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def main(argv):
    del argv
    os.makedirs(os.path.dirname(FLAGS.results), exist_ok=True)
    source = SyntheticCTR(seed=FLAGS.seed, train_rows=FLAGS.train_rows, test_rows=FLAGS.test_rows)
    rare_rows = None if FLAGS.report_only else rare_row_mask(
        source, source.train_rows, source.test_rows, source.train_rows)
    done = load_results()
    records = []
    for model_name, batch, rule in planned_runs():
        key = run_key(model_name, batch, rule)
        if key not in done and FLAGS.report_only:
            continue
        if key not in done:
            started = time.perf_counter()
            done[key] = dict(train_once(source, model_name, batch, rule, rare_rows), key=key)
            with open(FLAGS.results, "a") as f:
                f.write(json.dumps(done[key]) + "\n")
            print(f"{model_name} batch {batch} {rule}: AUC {done[key]['auc']:.4f} "
                  f"({time.perf_counter() - started:.0f} s)", flush=True)
        records.append((model_name, batch, rule + ablation_label(), done[key]))
        if FLAGS.report_only and FLAGS.with_ablations:
            records += [(model_name, batch, f"{rule} ({other[len(key) + 1:]})", record)
                        for other, record in done.items() if other.startswith(key + "|")]
    print_table(records, source.teacher_auc())
    plot(records, FLAGS.plot)
    print(f"plot: {FLAGS.plot}")


if __name__ == "__main__":
    app.run(main)
