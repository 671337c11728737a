"""Runs the CowClip authors' own training script (bytedance/LargeBatchCTR's train.py, written for
TF 2.4 with tensorflow-addons) on the built-in synthetic data, in their separate environment (TF
2.21 with tf_keras for its Keras 2 API; benchmarks/cowclip_official.py builds it and calls this).

Not part of tfscale, and it imports nothing from it: it runs in the authors' environment. Their
code is run as it is, `train.py` as `__main__` with their command-line flags; nothing of it is
copied here. What differs from their TF 2.4 machine is done by the shims below, each installed
before train.py starts (docs/results/cowclip_official.md lists them with why):

 1. `tf.keras` is tf_keras (TF_USE_LEGACY_KERAS=1): Keras 2, the API their code is written in.
 2. `tensorflow.python.keras[.layers|.initializers|.regularizers|.backend]` -> tf_keras: their
    DeepCTR fork imports Keras from there, which in TF 2.4 was tf.keras itself; in TF 2.21 it is a
    stale internal copy whose layers cannot be mixed with tf_keras models.
 3. `tensorflow_addons.optimizers.MultiOptimizer`: tensorflow-addons is gone (no release for TF
    2.21); a restatement of tfa 0.12's class (each variable to the optimizer whose layers own it).
 4. `tf.keras.optimizers.Adam` -> `tf.keras.optimizers.legacy.Adam`: in TF 2.4 tf.keras's Adam
    was the OptimizerV2 class that tf_keras keeps as `legacy`; their train step also calls its
    `_decayed_lr`, which only the legacy class has.
 5. `requests` stub: DeepCTR's import starts a thread that asks PyPI for its latest version; it
    finds no network and prints a line instead.
 6. `deepctr.contrib.utils` stub if TF 2.21 lacks `tensorflow.python.ops.rnn_cell` (its GRU cells
    serve DIEN only, never DeepFM).
 7. Tables sized from the data's schema: train.py sizes each table as the train split's largest id
    + 1; on CPU a validation or test id above that raises (on their GPU it read zeros). SparseFeat
    gets the schema's size when it is larger, as tfscale's models have.
 8. `tf.keras.callbacks.TensorBoard` -> an epoch recorder (train.py's only callback, which only
    logs): after each epoch it scores the validation and test splits with the exact AUC, stops the
    run after --patience epochs without a better validation AUC (train.py's --epoch is the 10-epoch
    limit), and appends the run to --record as one JSON line, as benchmarks/cowclip_tuned.py does.
 9. pandas Series reach the model as 1-d tensors, as in TF 2.4's Keras: tf_keras adds a trailing
    axis to each Series, and their train step's `tf.unique_with_counts` takes 1-d ids only.

Data: the splits are written as the files their loader (data_utils.load_data) reads:
data/criteo_kaggle/criteo_kaggle_processed_rand_{train,test}.feather under --workdir, the
"test" file holding our validation split (their fit validates on it each epoch); our test split
is read by the recorder only. Columns C1..C26 (int32 ids, 0 = missing), I1..I13 (float32, the
same transformed values tfscale's models read) and label.

    python -B benchmarks/largebatchctr_adapter.py --src=SRC --data=DATA --workdir=DIR \
        --record=runs.jsonl --key=KEY [--parity=out.json] -- --bs 65536 --clip 1 ...
"""

import os
import sys

os.environ["TF_USE_LEGACY_KERAS"] = "1"  # shim 1, before TensorFlow is imported
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import argparse  # noqa: E402
import hashlib  # noqa: E402
import importlib  # noqa: E402
import json  # noqa: E402
import runpy  # noqa: E402
import time  # noqa: E402
import types  # noqa: E402

import numpy as np  # noqa: E402

SPLITS = {"train": "train", "validation": "test"}  # ours -> the name their loader reads
FEATHER = "criteo_kaggle_processed_rand_{}.feather"


def parse_args(argv):
    if "--" not in argv:
        raise SystemExit("give train.py's flags after --")
    split = argv.index("--")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", required=True, help="their repository (train.py, deepctr/)")
    parser.add_argument("--data", required=True, help="the splits as .npy (cowclip_official.py)")
    parser.add_argument("--workdir", required=True, help="cwd of the run: data/, logs/")
    parser.add_argument("--record", help="append the finished run here, one JSON line")
    parser.add_argument("--key", default="", help="the run's key in --record")
    parser.add_argument("--progress", help="append each finished epoch here, one JSON line "
                        "(default: --record's path with _runs.jsonl -> _epochs.jsonl)")
    parser.add_argument("--patience", type=int, default=1)
    parser.add_argument("--parity", help="write parity facts here and stop after one step")
    return parser.parse_args(argv[:split]), argv[split + 1:]


# ----- data -----

def load_split(data_dir, split):
    return {name: np.load(os.path.join(data_dir, f"{split}_{name}.npy"))
            for name in ("categorical", "dense", "label")}


def split_frame(arrays):
    import pandas as pd

    columns = {f"C{f + 1}": arrays["categorical"][:, f].astype(np.int32)
               for f in range(arrays["categorical"].shape[1])}
    columns.update({f"I{j + 1}": arrays["dense"][:, j] for j in range(arrays["dense"].shape[1])})
    columns["label"] = arrays["label"].astype(np.float32)
    return pd.DataFrame(columns)


def write_feather(data_dir, workdir):
    """The splits as their loader's feather files (once: a stamp holds the data's fingerprint)."""
    with open(os.path.join(data_dir, "manifest.json")) as f:
        fingerprint = json.load(f)["fingerprint"]
    out = os.path.join(workdir, "data", "criteo_kaggle")
    stamp = os.path.join(out, "fingerprint")
    if os.path.exists(stamp) and open(stamp).read() == fingerprint:
        return
    os.makedirs(out, exist_ok=True)
    for ours, theirs in SPLITS.items():
        split_frame(load_split(data_dir, ours)).to_feather(os.path.join(out, FEATHER.format(theirs)))
    with open(stamp, "w") as f:
        f.write(fingerprint)


def row_digest(frame, rows):
    """sha256 of the given rows' values in column order C1..C26, I1..I13, label (as float64), as
    cowclip_official.py computes it from tfscale's pipeline."""
    names = [f"C{f + 1}" for f in range(26)] + [f"I{j + 1}" for j in range(13)] + ["label"]
    values = np.stack([frame[name].to_numpy()[rows].astype(np.float64) for name in names], axis=1)
    return hashlib.sha256(np.ascontiguousarray(values).tobytes()).hexdigest()


# ----- shims -----

def install_shims(schema_sizes, make_recorder):
    import tensorflow as tf
    import tf_keras

    # 1: tf.keras must be tf_keras for everything below.
    if tf.keras.__name__.split(".")[0] != "tf_keras":
        raise RuntimeError(f"tf.keras is {tf.keras.__name__}, not tf_keras")
    # 2
    sys.modules["tensorflow.python.keras"] = tf_keras
    for name in ("layers", "initializers", "regularizers", "backend"):
        sys.modules[f"tensorflow.python.keras.{name}"] = getattr(tf_keras, name)
    # 3
    addons = types.ModuleType("tensorflow_addons")
    addons.optimizers = types.ModuleType("tensorflow_addons.optimizers")
    addons.optimizers.MultiOptimizer = multi_optimizer_class(tf)
    sys.modules["tensorflow_addons"] = addons
    sys.modules["tensorflow_addons.optimizers"] = addons.optimizers
    # 4
    tf.keras.optimizers.Adam = tf.keras.optimizers.legacy.Adam
    # 5
    requests = types.ModuleType("requests")

    def no_network(*args, **kwargs):
        raise ConnectionError("no network version check (largebatchctr_adapter shim 5)")

    requests.get = no_network
    requests.codes = types.SimpleNamespace(ok=200)
    sys.modules["requests"] = requests
    # 6
    try:
        importlib.import_module("tensorflow.python.ops.rnn_cell")
    except ImportError:
        stub = types.ModuleType("deepctr.contrib.utils")
        stub.QAAttGRUCell = stub.VecAttGRUCell = None
        sys.modules["deepctr.contrib.utils"] = stub
    # 7
    from deepctr import feature_column

    original_new = feature_column.SparseFeat.__new__

    def sparse_feat(cls, name, vocabulary_size, *args, **kwargs):
        return original_new(cls, name, max(int(vocabulary_size), schema_sizes.get(name, 0)),
                            *args, **kwargs)

    feature_column.SparseFeat.__new__ = staticmethod(sparse_feat)
    # 8
    tf.keras.callbacks.TensorBoard = make_recorder
    # 9
    import pandas as pd
    from tf_keras.src.engine import data_adapter

    process_tensorlike = data_adapter._process_tensorlike

    def tf24_process_tensorlike(inputs):
        return process_tensorlike(tf.nest.map_structure(
            lambda x: x.to_numpy() if isinstance(x, pd.Series) else x, inputs))

    data_adapter._process_tensorlike = tf24_process_tensorlike


def multi_optimizer_class(tf):
    """tensorflow-addons 0.12's MultiOptimizer, restated: `optimizer_specs` as tfa has them (their
    train step reads them), each variable handed to the optimizer whose layers own it."""

    class MultiOptimizer(tf.keras.optimizers.legacy.Optimizer):
        def __init__(self, optimizers_and_layers, name="MultiOptimizer", **kwargs):
            super().__init__(name, **kwargs)
            self.optimizer_specs = [
                {"optimizer": optimizer,
                 "weights": [w.name for layer in layers for w in layer.weights]}
                for optimizer, layers in optimizers_and_layers]

        def apply_gradients(self, grads_and_vars, **kwargs):
            groups = [[] for _ in self.optimizer_specs]
            for grad, var in tuple(grads_and_vars):
                for group, spec in zip(groups, self.optimizer_specs):
                    if var.name in spec["weights"]:
                        group.append((grad, var))
            return tf.group([spec["optimizer"].apply_gradients(group, **kwargs)
                             for group, spec in zip(groups, self.optimizer_specs) if group])

        def get_config(self):
            return {"name": self._name}

    return MultiOptimizer


# ----- the epoch recorder (shim 8) -----

def exact_auc(labels, scores):
    from sklearn.metrics import roc_auc_score

    return float(roc_auc_score(labels, scores))


def log_loss(labels, scores):
    p = np.clip(scores.astype(np.float64), 1e-7, 1 - 1e-7)
    return float(-np.mean(labels * np.log(p) + (1 - labels) * np.log(1 - p)))


def recorder_class(options, train_args, data_dir):
    import tensorflow as tf

    test = load_split(data_dir, "test")
    rare = np.load(os.path.join(data_dir, "test_rare.npy"))
    validation = load_split(data_dir, "validation")

    def inputs(arrays):
        frame = split_frame(arrays)
        return {name: frame[name] for name in frame.columns if name != "label"}

    class EpochRecorder(tf.keras.callbacks.Callback):
        def __init__(self, log_dir=None, **kwargs):
            super().__init__()
            self.epochs, self.started = [], None
            self.test_inputs, self.validation_inputs = inputs(test), inputs(validation)

        def _scores(self, x):
            return self.model.predict(x, batch_size=65536, verbose=0)[:, 0].astype(np.float64)

        def on_train_begin(self, logs=None):
            if options.parity:
                self._parity()

        def _parity(self):
            model = self.model
            train_frame = TRAIN_FRAMES["train"]
            first = {name: train_frame[name].iloc[:65536] for name in self.test_inputs}
            labels = train_frame["label"].to_numpy()[:65536].astype(np.float64)
            predictions = model.predict(first, batch_size=65536, verbose=0)[:, 0]
            names = [v.name for v in model.trainable_variables]
            specs = model.optimizer.optimizer_specs
            facts = {
                "parameters": int(sum(np.prod(v.shape) for v in model.trainable_variables)),
                "embedding_parameters": int(sum(np.prod(v.shape) for v in
                                                model.trainable_variables
                                                if "embedding" in v.name)),
                "initial_logloss_first_65536_train_rows": log_loss(labels, predictions),
                "initial_mean_prediction": float(np.mean(predictions)),
                "regularization_loss": float(tf.add_n(model.losses)) if model.losses else 0.0,
                "variables": names,
                "embedding_optimizer_variables": len(specs[0]["weights"]),
                "dense_optimizer_variables": len(specs[1]["weights"]),
                "embedding_optimizer_learning_rate": float(
                    specs[0]["optimizer"]._decayed_lr("float32")),
                "clipped_tables": [n for n in names if "embeddings" in n and "linear" not in n],
                "table_rows": {v.name: int(v.shape[0]) for v in model.trainable_variables
                               if "embeddings" in v.name and "linear" not in v.name},
                "train_split_max_id_plus_1": {name: int(train_frame[name].max()) + 1
                                              for name in train_frame.columns
                                              if name.startswith("C")},
                "rows": {split: len(frame) for split, frame in TRAIN_FRAMES.items()},
                "digests": {
                    "train_first_65536": row_digest(train_frame, np.arange(65536)),
                    "validation_all": row_digest(TRAIN_FRAMES["validation"],
                                                 np.arange(len(TRAIN_FRAMES["validation"]))),
                    "test_all": row_digest(split_frame(test), np.arange(len(test["label"])))},
                "versions": {"tensorflow": tf.__version__,
                             "tf_keras": importlib.import_module("tf_keras").__version__},
            }
            with open(options.parity, "w") as f:
                json.dump(facts, f, indent=1)
            print(f"parity facts written to {options.parity}", flush=True)

        def on_train_batch_end(self, batch, logs=None):
            if options.parity:
                self.model.stop_training = True

        def on_epoch_begin(self, epoch, logs=None):
            self.started = time.time()

        def on_epoch_end(self, epoch, logs=None):
            if options.parity:
                return
            seconds = time.time() - self.started
            v_scores = self._scores(self.validation_inputs)
            t_scores = self._scores(self.test_inputs)
            labels = test["label"].astype(np.float64)
            record = {
                "validation_auc": exact_auc(validation["label"], v_scores),
                "test_auc": exact_auc(labels, t_scores),
                "test_logloss": log_loss(labels, t_scores),
                "test_auc_rarer_half": exact_auc(labels[rare], t_scores[rare]),
                "test_auc_frequent_half": exact_auc(labels[~rare], t_scores[~rare]),
                "keras_logs": {k: float(v) for k, v in (logs or {}).items()},
                "epoch_seconds": seconds,
            }
            self.epochs.append(record)
            if options.progress:  # every epoch as it ends: a run cut short still shows its curve
                with open(options.progress, "a") as f:
                    f.write(json.dumps(dict(record, key=options.key, epoch=epoch + 1)) + "\n")
            print(f"{options.key}: epoch {epoch + 1}: validation AUC {record['validation_auc']:.4f}"
                  f", test AUC {record['test_auc']:.4f}", flush=True)
            best = int(np.argmax([e["validation_auc"] for e in self.epochs]))
            if len(self.epochs) - 1 - best >= options.patience:
                self.model.stop_training = True

        def on_train_end(self, logs=None):
            if options.parity or not options.record:
                return
            best = int(np.argmax([e["validation_auc"] for e in self.epochs])) if self.epochs \
                else None
            record = {
                "key": options.key, "train_args": train_args, "epochs": self.epochs,
                "best_epoch": None if best is None else best + 1,
                "best_validation_auc": None if best is None else self.epochs[best]["validation_auc"],
                "patience": options.patience,
                "versions": {"tensorflow": tf.__version__,
                             "tf_keras": importlib.import_module("tf_keras").__version__},
            }
            with open(options.record, "a") as f:
                f.write(json.dumps(record) + "\n")

    return EpochRecorder


TRAIN_FRAMES = {}  # their loader's frames, kept for the parity facts


def main(argv):
    options, train_args = parse_args(argv)
    src = os.path.abspath(options.src)
    options.record = options.record and os.path.abspath(options.record)
    options.parity = options.parity and os.path.abspath(options.parity)
    if options.progress is None and options.record and options.record.endswith("_runs.jsonl"):
        options.progress = options.record[:-len("_runs.jsonl")] + "_epochs.jsonl"
    options.progress = options.progress and os.path.abspath(options.progress)
    data_dir = os.path.abspath(options.data)
    os.makedirs(options.workdir, exist_ok=True)
    write_feather(data_dir, options.workdir)
    os.chdir(options.workdir)  # their loader and log dir are relative paths
    with open(os.path.join(data_dir, "manifest.json")) as f:
        schema_sizes = json.load(f)["vocabulary_sizes"]
    sys.path.insert(0, src)
    sys.dont_write_bytecode = True
    install_shims(schema_sizes, recorder_class(options, train_args, data_dir))

    import data_utils  # keeps the frames their loader returns, for the parity facts

    load_data = data_utils.load_data

    def kept_load_data(*args, **kwargs):
        train, test = load_data(*args, **kwargs)
        TRAIN_FRAMES.update(train=train, validation=test)
        return train, test

    data_utils.load_data = kept_load_data
    sys.argv = [os.path.join(src, "train.py"), "--dataset", "criteo_kaggle", "--split", "rand",
                *train_args]
    runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
