"""Scoring whole files with a trained model: every line of any file the readers accept (Criteo
or Avazu, labelled or not, plain or .gz) gets one click probability, in input order, with the
same parsing and encoding as training (text_lines.LineParser, data.preprocessing).

Owns the streaming pass (parsed chunks, regrouped into batches, one model call each) and what
comes with each batch: the labels when the file has them, and columns handed through unparsed
(Avazu's `id`). A malformed line stops the pass with a data error naming file and line: a
prediction file has a row for every input line, so no line can be skipped.
"""

import numpy as np
import tensorflow as tf

from tfscale.data.pipeline import without_autotuning
from tfscale.data.text_lines import CHUNK_LINES, FileSet, LineParser, LineSelection, parsed_chunks

PASSTHROUGH_COLUMNS = ("id",)  # handed through to the output when a file has them


class FilePredictions:
    """Iterating gives (probabilities float32 [n], labels float32 [n] or None, passthrough
    bytes [n, len(passthrough_names)]) per batch of `batch_size` lines, in input order.

    Args:
      model: a Keras model taking the features of `preprocessing`.
      preprocessing: the tfscale.data.preprocessing.Preprocessing the model was trained with.
      paths: a path, glob or list of them.
      on_short_line: as the training run read short lines.
      batch_size: the lines of a batch (one model call).
      chunk_lines: lines parsed together by one vectorised step.

    Raises:
      ValueError: `batch_size` is below 1.
      UserError: a path or pattern matches no file, a file has no data lines or not the
        format's columns, or the files' columns differ; `on_short_line` is neither "missing"
        nor "error".
    """

    def __init__(self, model, preprocessing, paths, *, on_short_line="missing", batch_size=4096,
                 chunk_lines=CHUNK_LINES):
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        fmt = preprocessing.text_format
        self._files = FileSet(fmt, paths)
        self.has_labels = self._files.has_labels
        self.passthrough_names = tuple(
            name for name in PASSTHROUGH_COLUMNS if name in self._files.layout.column_names)
        self._parser = LineParser(fmt, self._files, on_short_line=on_short_line,
                                  passthrough=self.passthrough_names)
        self._preprocessing = preprocessing
        self._batch_size = int(batch_size)
        self._chunk_lines = int(chunk_lines)
        self._predict = tf.function(lambda features: tf.reshape(
            tf.cast(model(features, training=False), tf.float32), [-1]))

    def describe(self):
        return self._files.describe()

    def __iter__(self):
        preprocessing = self._preprocessing

        def finish(raw):
            return preprocessing.features(raw), raw["labels"], raw["passthrough"]

        batches = parsed_chunks(self._files, self._parser, LineSelection(),
                                np.arange(len(self._files.paths)), self._chunk_lines, finish)
        batches = without_autotuning(batches.rebatch(self._batch_size).prefetch(tf.data.AUTOTUNE))
        for features, labels, passthrough in batches:
            yield (self._predict(features).numpy(),
                   labels.numpy() if self.has_labels else None, passthrough.numpy())
