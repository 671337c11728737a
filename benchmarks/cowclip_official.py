"""The CowClip authors' own code (bytedance/LargeBatchCTR: train.py, clip.py, data_utils.py and
their DeepCTR fork) on the built-in synthetic data, beside tfscale's runs of
benchmarks/cowclip_tuned.py: does CowClip's AUC loss at large batch on this data belong to the
data or to tfscale's implementation?

    python -m benchmarks.cowclip_official --step=setup    # their environment (a venv outside)
    python -m benchmarks.cowclip_official --step=data     # the splits, as arrays for the adapter
    python -m benchmarks.cowclip_official --step=parity   # same rows? sane model and first loss?
    python -m benchmarks.cowclip_official --step=run      # the runs, most informative first
    python -m benchmarks.cowclip_official --step=ours     # our comparators that cowclip_tuned lacks
    python -m benchmarks.cowclip_official --step=report   # their runs beside ours

Their code runs unmodified in its own environment (--venv: TF 2.21 with tf_keras, since TF 2.4 and
tensorflow-addons do not install here) through benchmarks/largebatchctr_adapter.py, which lists
every shim. Same data and protocol as benchmarks/cowclip_tuned.py: the launcher's synthetic data
(seed 0), the last 200,000 of 4,000,000 training rows held out for validation, the 200,000 test
rows only reported; each run trains until an epoch does not raise its validation AUC (patience 1,
at most 10 epochs) and is reported at its best validation epoch. Hyper-parameters come from
tfscale.optimizers.scaling (the rule's settings at the batch, from the tuned synthetic base or
the Criteo preset), turned into train.py's flags. Every training run is niced and appended to
--results as one JSON line; a run already there is not rerun, so --step=run resumes."""

import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

from benchmarks import cowclip_tuned  # noqa: E402  (its flags: rows, epochs, patience)
from benchmarks.id_rarity import rare_row_mask  # noqa: E402
from tfscale.data.synthetic import SyntheticCTR  # noqa: E402
from tfscale.optimizers.scaling import PRESETS, Preset, large_batch_settings  # noqa: E402

FLAGS = flags.FLAGS
CACHE = os.path.expanduser("~/.cache/tfscale")
flags.DEFINE_enum("step", "report", ["setup", "data", "parity", "run", "ours", "report"],
                  "What to do (module docstring).")
flags.DEFINE_string("venv", os.path.join(CACHE, "largebatchctr-venv"), "Their environment.")
flags.DEFINE_string("reference", "/work/shared/reference/LargeBatchCTR",
                    "Their repository (read only: copied to --work/src before running).")
flags.DEFINE_string("work", os.path.join(CACHE, "largebatchctr-work"),
                    "Their code's copy, the splits, the runs' working directory.")
flags.DEFINE_list("runs", None, "Run stage: names of the runs (default: all, in RUNS order).")
flags.DEFINE_list("seeds", ["1235"], "Run stage: train.py --seed values (1235 is its default).")
flags.DEFINE_string("official_results", "benchmarks/results/cowclip_official_runs.jsonl",
                    "Their runs, one a line.")
flags.DEFINE_string("official_epochs", "benchmarks/results/cowclip_official_epochs.jsonl",
                    "Every epoch of their runs as it ends, finished runs or not.")
flags.DEFINE_string("parity_results", "benchmarks/results/cowclip_official_parity.json",
                    "The parity checks' facts.")

ADAPTER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "largebatchctr_adapter.py")
# Their environment: TensorFlow as tfscale pins it, tf_keras for Keras 2, and what their code
# needs: tensorboard (their train step's tf.summary calls; TF 2.4 pulled it in), pandas + pyarrow
# (their feather loader), scikit-learn (AUC), packaging (DeepCTR's version check). Versions as
# installed for the recorded runs.
REQUIREMENTS = ("tensorflow==2.21.0", "tf-keras==2.21.0", "tensorboard==2.21.0", "pandas==3.1.1",
                "pyarrow==26.0.1", "scikit-learn==1.9.1", "packaging==26.4")
DATA_SEED = cowclip_tuned.DATA_SEED
TUNED = Preset(dense_learning_rate=2.5e-3, embedding_learning_rate=1e-3, l2=1e-5,
               embedding_init_stddev=1e-2)  # = PRESETS["synthetic"]'s rates (its rule aside)
BASES = {"tuned": TUNED, "criteo": PRESETS["criteo"]}


@dataclasses.dataclass(frozen=True)
class OfficialRun:
    """One run of their train.py: a base, a rule, a batch, their --seed."""

    name: str
    base: str  # a BASES key
    rule: str
    batch_size: int

    def settings(self):
        return large_batch_settings(self.batch_size, self.rule, BASES[self.base])

    def train_args(self, seed):
        s = self.settings()
        return ["--model", "DeepFM", "--bs", str(s.batch_size),
                "--lr_embed", repr(s.embedding_learning_rate), "--lr", repr(s.dense_learning_rate),
                "--l2", repr(s.l2), "--init_stddev", repr(s.embedding_init_stddev),
                "--warmup", repr(s.warmup_epochs), "--clip", repr(s.r if s.clip else 0.0),
                "--bound", repr(s.zeta if s.clip else 0.0), "--epoch", str(FLAGS.max_epochs),
                "--seed", str(seed)]

    def key(self, seed):
        return (f"official|{self.name}|seed {seed}|{FLAGS.train_rows}-{FLAGS.validation_rows}-"
                f"{FLAGS.test_rows}|{FLAGS.max_epochs}-{FLAGS.patience}")

    def ours(self):
        """Our cowclip_tuned runs to put beside it: (label, [Run per seed])."""
        base = BASES[self.base]
        rule = self.rule if self.batch_size > 1024 else "none"
        runs = [cowclip_tuned.Run("deepfm", base.embedding_learning_rate, base.dense_learning_rate,
                                  base.l2, base.embedding_init_stddev, self.batch_size, rule, seed)
                for seed in (0, 1)]
        return rule, runs


# Most informative first: 64K runs cost an epoch of 57 steps, 1K runs one of 3,710.
RUNS = (
    OfficialRun("tuned-cowclip-64k", "tuned", "cowclip", 65536),
    OfficialRun("tuned-sqrt-64k", "tuned", "sqrt", 65536),
    OfficialRun("criteo-cowclip-64k", "criteo", "cowclip", 65536),
    OfficialRun("tuned-cowclip-1k", "tuned", "cowclip", 1024),
    OfficialRun("criteo-cowclip-1k", "criteo", "cowclip", 1024),
)


def venv_python():
    return os.path.join(FLAGS.venv, "bin", "python")


def setup():
    """Their environment and a copy of their code under --work/src (never written to in place)."""
    if not os.path.exists(venv_python()):
        subprocess.run([sys.executable, "-m", "venv", FLAGS.venv], check=True)
    subprocess.run([venv_python(), "-m", "pip", "install", "-q", *REQUIREMENTS], check=True)
    src = os.path.join(FLAGS.work, "src")
    if os.path.exists(src):
        shutil.rmtree(src)
    shutil.copytree(FLAGS.reference, src, ignore=shutil.ignore_patterns("__pycache__", ".git"))
    if tree_digest(src) != tree_digest(FLAGS.reference):
        raise RuntimeError(f"{src} differs from {FLAGS.reference}")
    freeze = subprocess.run([venv_python(), "-m", "pip", "freeze"], check=True,
                            capture_output=True, text=True).stdout
    with open(os.path.join(FLAGS.work, "pip-freeze.txt"), "w") as f:
        f.write(freeze)
    print(f"environment: {FLAGS.venv}; their code: {src} (sha256 of its .py files "
          f"{tree_digest(src)[:16]})\n{freeze}")


def tree_digest(root):
    digest = hashlib.sha256()
    for folder, dirs, files in sorted(os.walk(root)):
        dirs[:] = sorted(d for d in dirs if d not in ("__pycache__", ".git"))
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                digest.update(os.path.relpath(path, root).encode())
                with open(path, "rb") as f:
                    digest.update(f.read())
    return digest.hexdigest()


def data_dir():
    return os.path.join(FLAGS.work, "data")


def splits():
    """(first row, rows) of our three splits in the full source's row numbering."""
    training = FLAGS.train_rows - FLAGS.validation_rows
    return {"train": (0, training), "validation": (training, FLAGS.validation_rows),
            "test": (FLAGS.train_rows, FLAGS.test_rows)}


def write_data():
    full = SyntheticCTR(seed=DATA_SEED, train_rows=FLAGS.train_rows, test_rows=FLAGS.test_rows)
    os.makedirs(data_dir(), exist_ok=True)
    fingerprint = hashlib.sha256()
    for split, (first, rows) in splits().items():
        parts = {"categorical": [], "dense": [], "label": []}
        for batch in full.rows(first, rows, 65536, keys=("categorical", "dense", "label")):
            for name in parts:
                parts[name].append(batch[name].numpy())
        arrays = {"categorical": np.concatenate(parts["categorical"]).astype(np.int32),
                  "dense": np.concatenate(parts["dense"]).astype(np.float32),
                  "label": np.concatenate(parts["label"]).astype(np.float32)}
        for name, array in arrays.items():
            np.save(os.path.join(data_dir(), f"{split}_{name}.npy"), array)
            fingerprint.update(array.tobytes())
        print(f"{split}: {rows} rows from row {first}", flush=True)
    rare = rare_row_mask(full, FLAGS.train_rows, FLAGS.test_rows, splits()["train"][1])
    np.save(os.path.join(data_dir(), "test_rare.npy"), rare)
    manifest = {"fingerprint": fingerprint.hexdigest(), "splits": splits(),
                "vocabulary_sizes": dict(zip(full.schema.categorical_names,
                                             map(int, full.schema.vocabulary_sizes))),
                "source": full.describe()}
    with open(os.path.join(data_dir(), "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)


def digest(categorical, dense, label, rows=None):
    """sha256 of rows' C1..C26, I1..I13, label as float64 (largebatchctr_adapter.row_digest)."""
    values = np.concatenate([np.asarray(categorical, np.float64), np.asarray(dense, np.float64),
                             np.asarray(label, np.float64).reshape(-1, 1)], axis=1)
    if rows is not None:
        values = values[rows]
    return hashlib.sha256(np.ascontiguousarray(values).tobytes()).hexdigest()


def batches_digest(dataset):
    parts = [(f["categorical"].numpy(), f["dense"].numpy(), y.numpy()) for f, y in dataset]
    arrays = [np.concatenate(p) for p in zip(*parts)]
    return len(arrays[0]), digest(*arrays)


def parity():
    """Their side (the adapter's --parity: one step of the tuned CowClip 64K run) and ours (the
    batches cowclip_tuned.py trains and scores on, our model from the same settings)."""
    os.makedirs(os.path.dirname(FLAGS.parity_results), exist_ok=True)
    theirs_path = os.path.join(FLAGS.work, "parity-theirs.json")
    run = RUNS[0]
    subprocess.run(["nice", "-n", "19", venv_python(), "-B", ADAPTER,
                    "--src", os.path.join(FLAGS.work, "src"), "--data", data_dir(),
                    "--workdir", os.path.join(FLAGS.work, "run"), "--parity", theirs_path,
                    "--", *run.train_args(int(FLAGS.seeds[0]))], check=True)
    with open(theirs_path) as f:
        theirs = json.load(f)

    import keras
    import models
    from tfscale.optimizers import factory

    experiment = cowclip_tuned.Experiment()
    training, full = experiment.training, experiment.full
    first_batch = next(iter(training.train_batches(65536)))
    first = (first_batch[0]["categorical"].numpy(), first_batch[0]["dense"].numpy(),
             first_batch[1].numpy())
    ours = {"train_first_65536": digest(*first),
            "train_steps_per_epoch_65536": training.train_steps_per_epoch(65536),
            "validation_all": batches_digest(training.test_batches(65536)),
            "test_all": batches_digest(full.test_batches(65536))}
    settings = run.settings()
    keras.utils.set_random_seed(0)
    model = models.build_model(
        "deepfm", training.schema,
        embeddings_initializer=keras.initializers.RandomNormal(
            stddev=settings.embedding_init_stddev),
        **factory.model_regularization(settings, "cowclip", "dense"))
    predictions = np.asarray(model.predict(first_batch[0], batch_size=65536, verbose=0))[:, 0]
    p = np.clip(predictions.astype(np.float64), 1e-7, 1 - 1e-7)
    labels = first[2][:, 0].astype(np.float64)
    ours.update(
        parameters=int(sum(np.prod(v.shape) for v in model.trainable_variables)),
        initial_logloss_first_65536_train_rows=float(
            -np.mean(labels * np.log(p) + (1 - labels) * np.log(1 - p))),
        initial_mean_prediction=float(np.mean(predictions)),
        variables=[v.path for v in model.trainable_variables])
    facts = {"theirs": theirs, "ours": ours, "run": run.key(FLAGS.seeds[0])}
    with open(FLAGS.parity_results, "w") as f:
        json.dump(facts, f, indent=1)
    print_parity(facts)


def print_parity(facts):
    theirs, ours = facts["theirs"], facts["ours"]
    print(f"rows (their loader): {theirs['rows']}; ours: train "
          f"{splits()['train'][1]}, validation {ours['validation_all'][0]}, test "
          f"{ours['test_all'][0]}")
    for name in ("train_first_65536", "validation_all", "test_all"):
        mine = ours[name] if isinstance(ours[name], str) else ours[name][1]
        print(f"{name}: {'same' if theirs['digests'][name] == mine else 'DIFFERENT'} "
              f"({mine[:16]})")
    print(f"parameters: theirs {theirs['parameters']:,} (embedding "
          f"{theirs['embedding_parameters']:,}), ours {ours['parameters']:,}")
    print(f"initial log loss on the first 65,536 training rows: theirs "
          f"{theirs['initial_logloss_first_65536_train_rows']:.4f} (mean prediction "
          f"{theirs['initial_mean_prediction']:.4f}), ours "
          f"{ours['initial_logloss_first_65536_train_rows']:.4f} (mean prediction "
          f"{ours['initial_mean_prediction']:.4f})")


def run_official():
    names = FLAGS.runs or [r.name for r in RUNS]
    by_name = {r.name: r for r in RUNS}
    done = load_records(FLAGS.official_results)
    for name in names:
        for seed in map(int, FLAGS.seeds):
            run = by_name[name]
            if run.key(seed) in done:
                continue
            print(f"running {run.key(seed)}: train.py {' '.join(run.train_args(seed))}",
                  flush=True)
            subprocess.run(["nice", "-n", "19", venv_python(), "-B", ADAPTER,
                            "--src", os.path.join(FLAGS.work, "src"), "--data", data_dir(),
                            "--workdir", os.path.join(FLAGS.work, "run"),
                            "--record", os.path.abspath(FLAGS.official_results),
                            "--key", run.key(seed), "--patience", str(FLAGS.patience),
                            "--progress", os.path.abspath(FLAGS.official_epochs),
                            "--", *run.train_args(seed)], check=True)


def run_ours():
    """Our comparators missing from cowclip_tuned's runs file (the Criteo preset's CowClip rule
    at 64K), trained there by its own code."""
    experiment = cowclip_tuned.Experiment()
    for run in RUNS:
        rule, runs = run.ours()
        if run.batch_size > 1024 and runs[0].key() not in experiment.done:
            experiment.result(runs[0])


def load_records(path):
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return {record["key"]: record for record in map(json.loads, f)}


def load_epochs(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f]


def at_best(record):
    return record["epochs"][record["best_epoch"] - 1]


def report():
    official = load_records(FLAGS.official_results)
    ours = load_records(FLAGS.results)
    print("| run | batch | official code: test AUC at best epoch (seed) | best epoch | validation "
          "AUC after each epoch | ours: rule, test AUC (seed) | official - ours |\n"
          "|---|---|---|---|---|---|---|")
    for run in RUNS:
        records = [official[run.key(s)] for s in map(int, FLAGS.seeds) if run.key(s) in official]
        rule, our_runs = run.ours()
        mine = [(r.seed, at_best(ours[r.key()])["test_auc"]) for r in our_runs
                if r.key() in ours and ours[r.key()]["best_epoch"]]
        mine_text = (f"{rule}: " + ", ".join(f"{auc:.4f} ({seed})" for seed, auc in mine)
                     if mine else "not run")
        if not records:
            partial = [e for e in load_epochs(FLAGS.official_epochs)
                       if e["key"] == run.key(int(FLAGS.seeds[0]))]
            if partial:
                curve = ", ".join(f"{e['validation_auc']:.4f}" for e in partial)
                best = max(partial, key=lambda e: e["validation_auc"])
                print(f"| {run.name} | {run.batch_size:,} | cut short after {len(partial)} "
                      f"epoch(s): {best['test_auc']:.4f} at its best so far ({FLAGS.seeds[0]}) | "
                      f"{best['epoch']} | {curve} | {mine_text} | |")
            else:
                print(f"| {run.name} | {run.batch_size:,} | not run | | | {mine_text} | |")
            continue
        for record in records:
            seed = record["key"].split("|")[2]
            best = at_best(record) if record["best_epoch"] else None
            curve = ", ".join(f"{e['validation_auc']:.4f}" for e in record["epochs"])
            difference = (f"{best['test_auc'] - np.mean([a for _, a in mine]):+.4f}"
                          if best and mine else "")
            print(f"| {run.name} | {run.batch_size:,} | "
                  f"{best['test_auc']:.4f} ({seed}) | {record['best_epoch']} | {curve} | "
                  f"{mine_text} | {difference} |")
    print("official - ours: against the mean of our seeds.")


def main(argv):
    del argv
    stages = {"setup": setup, "data": write_data, "parity": parity, "run": run_official,
              "ours": run_ours, "report": report}
    stages[FLAGS.step]()


if __name__ == "__main__":
    app.run(main)
