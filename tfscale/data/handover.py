"""How checked blocks of rows reach TensorFlow, for the readers that check them with Arrow (Parquet
files, and text files on their fast path).

Owns the element a block becomes (`element`: labels, integers as float32 with their presence, the
categorical columns' ids, encoded in the reader's threads where Arrow holds the values
(parquet_columns.Categorical), derived ids, the bad rows skipped) and the tf.data.Dataset of raw
columns it gives (`raw_columns`). Each kind of column crosses into TensorFlow as one array, not
one per field, and no value becomes a string tensor."""

import numpy as np
import tensorflow as tf


def signature(text_format):
    """The tf.TensorSpecs of an element for rows of `text_format`."""
    dense = len(text_format.dense_names)
    return {
        "labels": tf.TensorSpec([None], tf.float32),
        "dense": tf.TensorSpec([None, dense], tf.float32),
        "dense_present": tf.TensorSpec([None, dense], tf.bool),
        "categorical_ids": tf.TensorSpec([None, len(text_format.categorical_names)], tf.int64),
        "derived": tf.TensorSpec([None, len(text_format.derived_fields)], tf.int64),
        "bad_lines": tf.TensorSpec([], tf.int64),
    }


def element(labels, dense, present, categorical_ids, derived, bad_rows):
    """The element of one block: labels [n], dense [n, D] (any numbers, as float32), present
    bool [n, D], categorical_ids int64 [n, C] (the encoder's ids of the C categorical columns),
    derived int64 [n, E], bad_rows the rows skipped."""
    return {"labels": np.asarray(labels, np.float32), "dense": np.asarray(dense, np.float32),
            "dense_present": np.asarray(present, bool),
            "categorical_ids": np.asarray(categorical_ids, np.int64),
            "derived": np.asarray(derived, np.int64), "bad_lines": np.int64(bad_rows)}


def raw_columns(elements, text_format):
    """The raw columns of the elements `elements()` yields, as a tf.data.Dataset, in order:
    labels, dense, dense_present, derived and bad_lines as text_lines.LineParser gives them for
    lines, and categorical_ids int64 [n, C] where lines give categorical strings [n, C]
    (preprocessing.Preprocessing.features takes either)."""
    return tf.data.Dataset.from_generator(elements, output_signature=signature(text_format))
