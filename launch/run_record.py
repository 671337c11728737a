"""The run record: what `launch.train` leaves beside its checkpoints (`run.json`, and the
vocabulary the run encoded with) so that `launch.predict` and `launch.export` rebuild the same
model and read raw lines exactly as training did, from the checkpoint directory alone.

Owns the record's contents (model name and Keras config with its dtype policy, data format, the
training files' layout, the short-line policy, the preprocessing's config) and turning it back
into a model with its trained weights, a Preprocessing and the serving RawInputs; and the trained
model's own scores of the first lines of its test split (`trained_predictions.json`), written at
the end of training from the model in memory, against which any restored, predicting or served
copy of the model can be checked.
"""

import dataclasses
import json
import os

import models
from tfscale.data import FILE_FORMATS
from tfscale.data.preprocessing import Preprocessing
from tfscale.data.text_lines import LineLayout
from tfscale.errors import UserError

RECORD_FILE = "run.json"
VOCABULARY_FILE = "vocabulary.parquet"
TRAINED_PREDICTIONS_FILE = "trained_predictions.json"
TRAINED_PREDICTION_LINES = 32  # test lines the run scores at its end
_KIND, _VERSION = "tfscale run", 1


def exists(checkpoint_dir):
    return os.path.isfile(os.path.join(checkpoint_dir, RECORD_FILE))


def write(checkpoint_dir, model_name, model, source, data_name, precision):
    """Writes the record of a run training `model` (registered as `model_name`) on `source`."""
    os.makedirs(checkpoint_dir, exist_ok=True)
    record = {"kind": _KIND, "version": _VERSION, "model": model_name,
              "model_config": model.get_config(), "precision": precision, "data": data_name}
    preprocessing = getattr(source, "preprocessing", None)
    if preprocessing is not None:
        record["train_layout"] = list(source.train_layout.column_names)
        record["on_short_line"] = source.on_short_line
        record["preprocessing"] = preprocessing.to_config(
            os.path.join(checkpoint_dir, VOCABULARY_FILE))
    path = os.path.join(checkpoint_dir, RECORD_FILE)
    with open(path + ".tmp", "w") as stream:
        json.dump(record, stream, indent=1)
    os.replace(path + ".tmp", path)


def write_trained_predictions(checkpoint_dir, model, source, global_step,
                              count=TRAINED_PREDICTION_LINES):
    """Scores the first `count` lines of `source`'s test split with `model` as training left it
    (the weights of its last checkpoint, from memory, not read back) and writes the lines, their
    probabilities and the global step to TRAINED_PREDICTIONS_FILE; returns its path, or None
    when the source reads no files (synthetic data) or has no test lines. Under Horovod every
    rank calls it (row-sharded tables are looked up from every rank); rank 0 writes."""
    preprocessing = getattr(source, "preprocessing", None)
    if preprocessing is None:
        return None
    lines = source.test_lines(count)
    if not lines:
        return None
    import tensorflow as tf

    from tfscale import distributed
    from tfscale.serving.export import RawInputs, RawScorer

    scorer = RawScorer(model, preprocessing, RawInputs(
        preprocessing.text_format, source.train_layout, source.on_short_line))
    probabilities = tf.function(scorer.lines, autograph=False)(tf.constant(lines)).numpy()
    if not distributed.is_chief():
        return None
    path = os.path.join(checkpoint_dir, TRAINED_PREDICTIONS_FILE)
    with open(path + ".tmp", "w") as stream:
        json.dump({"global_step": int(global_step), "lines": lines,
                   "probabilities": [float(p) for p in probabilities]}, stream, indent=1)
    os.replace(path + ".tmp", path)
    return path


@dataclasses.dataclass
class RunRecord:
    """A run record read back (see `read`)."""

    checkpoint_dir: str
    record: dict

    @property
    def model_name(self):
        return self.record["model"]

    @property
    def precision(self):
        return self.record["precision"]

    @property
    def data(self):
        return self.record["data"]

    @property
    def text_format(self):
        return FILE_FORMATS[self.data].FORMAT

    def require_file_format(self, action):
        """UserError unless the run read files (synthetic data has no text to read)."""
        if "preprocessing" not in self.record:
            raise UserError(
                f"{self.checkpoint_dir} was trained on --data={self.data}, which has no file "
                f"format to {action}; train on Criteo or Avazu files (the synthetic generator "
                "writes Criteo TSV) to get a model that reads raw lines")

    def preprocessing(self):
        self.require_file_format("read")
        return Preprocessing.from_config(self.record["preprocessing"], self.text_format,
                                         self.checkpoint_dir)

    def raw_inputs(self):
        from tfscale.serving.export import RawInputs

        self.require_file_format("read")
        return RawInputs(self.text_format, LineLayout(tuple(self.record["train_layout"])),
                         self.record["on_short_line"])

    def restored_model(self):
        """The model built from its config, with the newest checkpoint's weights (the
        optimizer's state and any per-rank state in the checkpoint are not read)."""
        from tfscale.checkpoints.store import restore_trained_weights

        model = models.MODELS[self.model_name].from_config(self.record["model_config"])
        progress = restore_trained_weights(model, self.checkpoint_dir)
        if progress is None:
            raise UserError(f"`checkpoint_dir={self.checkpoint_dir}` holds no checkpoint yet")
        return model, progress


def read(checkpoint_dir):
    """The RunRecord of `checkpoint_dir` (UserError naming the directory if there is none)."""
    path = os.path.join(checkpoint_dir, RECORD_FILE)
    if not os.path.isfile(path):
        raise UserError(f"`checkpoint_dir={checkpoint_dir}` has no {RECORD_FILE}: give the "
                        "checkpoint directory of a launch.train run (runs/<model>-<time>/"
                        "checkpoints)")
    try:
        with open(path) as stream:
            record = json.load(stream)
    except (OSError, ValueError) as error:
        raise UserError(f"{path}: not a readable run record ({error})") from None
    if (record.get("kind"), record.get("version")) != (_KIND, _VERSION) or \
            record.get("model") not in models.MODELS:
        raise UserError(f"{path}: not a run record this version of tfscale reads")
    return RunRecord(checkpoint_dir, record)
