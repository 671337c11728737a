"""Scoring raw text with a trained CTR model: the functions that turn lines, or fields by name,
into click probabilities with the same parsing and encoding as training (text_lines.LineParser,
data.preprocessing.Preprocessing), and the TensorFlow SavedModel that carries them for serving.

Owns: what a served model takes (`RawInputs`: the training file's layout, the columns a request
names) and the two serving functions, written by tfscale.serving.saved_model. The SavedModel
holds the whole preprocessing in its graph (hashing or the vocabulary's sorted keys, the integer
transform, missing values) and the model's variables (of a dynamic table, the rows in use); it
loads with `tf.saved_model.load` alone, without tfscale or Keras.

Signatures:
  serving_default(<one string tensor [n] per input column>) -> {"probability": float32 [n]}:
    the columns by name (Criteo I1..I13, C1..C26; Avazu hour, C1, banner_pos, ..., C21), an
    empty string being a missing value.
  score_lines(lines: string [n]) -> {"probability": float32 [n]}: lines as in the training
    file (no header), with or without the label column. One request is all one or the other,
    told by its widest line: with labels when it has the training file's field count.
"""

import dataclasses

import tensorflow as tf

from tfscale.data.text_lines import LineLayout, LineParser, LinesOf
from tfscale.serving.saved_model import write_saved_model

SERVING_DEFAULT = "serving_default"
SCORE_LINES = "score_lines"
OUTPUT = "probability"
REQUEST = "request"  # what a bad line's error calls the lines of a request


@dataclasses.dataclass(frozen=True)
class RawInputs:
    """What raw text a model's preprocessing reads: its TextFormat, the training file's layout
    (the lines of score_lines) and whether lines missing trailing fields read them as missing."""

    text_format: object
    train_layout: LineLayout
    on_short_line: str = "missing"

    @property
    def field_names(self):
        """The input columns of serving_default, in order."""
        return self.text_format.input_names()


class RawScorer:
    """Click probabilities of raw text: `lines(lines)` and `fields(columns)`, as tf.functions'
    bodies (graph-compatible, no Python state)."""

    def __init__(self, model, preprocessing, raw_inputs):
        self._model = model
        self._preprocessing = preprocessing
        fmt, layout = raw_inputs.text_format, raw_inputs.train_layout
        self._labelled_fields = layout.num_fields

        def parser(lines_layout, has_labels):
            lines_of = LinesOf(lines_layout, has_labels, (REQUEST,))
            return LineParser(fmt, lines_of, on_short_line=raw_inputs.on_short_line)

        self._labelled = parser(layout, fmt.label_name in layout.column_names)
        self._unlabelled = parser(fmt.unlabelled(layout), False)
        self._field_names = raw_inputs.field_names
        self._fields = parser(LineLayout(self._field_names), False)
        self._delimiter = fmt.delimiter

    def _features(self, parser, lines):
        numbers = tf.range(1, tf.size(lines, out_type=tf.int64) + 1)
        return self._preprocessing.features(parser(tf.constant(0, tf.int64), numbers, lines))

    def _probabilities(self, features):
        return tf.reshape(tf.cast(self._model(features, training=False), tf.float32), [-1])

    def line_features(self, lines):
        """The model's features of lines in the training file's format, with or without
        labels."""
        found = tf.strings.split(lines, self._delimiter).row_lengths()
        labelled = tf.equal(tf.reduce_max(tf.concat([found, [0]], 0)), self._labelled_fields)
        return tf.cond(labelled, lambda: self._features(self._labelled, lines),
                       lambda: self._features(self._unlabelled, lines))

    def lines(self, lines):
        """float32 [n] of lines in the training file's format, with or without labels."""
        return self._probabilities(self.line_features(lines))

    def fields(self, columns):
        """float32 [n] of the input columns (a list of string [n] in `field_names` order),
        joined into lines and parsed as lines are, so both signatures agree by construction."""
        lines = tf.strings.join(list(columns), separator=self._delimiter)
        return self._probabilities(self._features(self._fields, lines))


def export_saved_model(model, preprocessing, raw_inputs, path):
    """Writes the SavedModel of `model` with the two signatures of the module doc to `path`.

    Args:
        model: a built Keras model taking the batches of `preprocessing`.
        preprocessing: the tfscale.data.preprocessing.Preprocessing the model was trained with.
        raw_inputs: a RawInputs: the text format, the training file's layout and how short
            lines are read.
        path: the SavedModel's directory.

    Raises:
        UserError: `raw_inputs.on_short_line` is not a short-line policy ("missing", "error");
            in a Horovod job of several ranks, `model` has tables spread over the ranks."""
    scorer = RawScorer(model, preprocessing, raw_inputs)
    names = raw_inputs.field_names

    def serve_fields(*columns):
        return {OUTPUT: scorer.fields(columns)}

    def serve_lines(lines):
        return {OUTPUT: scorer.lines(lines)}

    write_saved_model(model, path, [
        (SERVING_DEFAULT, serve_fields, [tf.TensorSpec([None], tf.string, name=n) for n in names]),
        (SCORE_LINES, serve_lines, [tf.TensorSpec([None], tf.string, name="lines")])])
