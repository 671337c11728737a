"""How checked blocks of rows reach TensorFlow, for the readers that check them with Arrow (Parquet
files, and text files on their fast path).

Owns the element a block becomes (`element`: labels, integers as float32 with their presence, the
categorical values as one buffer of bytes with int32 offsets, derived ids, the bad rows skipped)
and the tf.data.Dataset of the raw columns text_lines.LineParser gives for lines (`raw_columns`):
a generator of elements, then a parallel map that cuts the categorical strings out of each
block's bytes with one `tf.strings.substr` (parquet_columns.strings_tensor). Each kind of column
crosses into TensorFlow as one array, not one per field, and no value becomes a Python object."""

import numpy as np
import tensorflow as tf

from tfscale.data.parquet_columns import strings_tensor


def signature(text_format):
    """The tf.TensorSpecs of an element for rows of `text_format`."""
    dense = len(text_format.dense_names)
    return {
        "labels": tf.TensorSpec([None], tf.float32),
        "dense": tf.TensorSpec([None, dense], tf.float32),
        "dense_present": tf.TensorSpec([None, dense], tf.bool),
        "categorical_bytes": tf.TensorSpec([], tf.string),
        "categorical_offsets": tf.TensorSpec([None], tf.int32),
        "derived": tf.TensorSpec([None, len(text_format.derived_fields)], tf.int64),
        "bad_lines": tf.TensorSpec([], tf.int64),
    }


def element(labels, dense, present, categorical, derived, bad_rows):
    """The element of one block: labels [n], dense [n, D] (any numbers, as float32), present
    bool [n, D], categorical a parquet_columns.Texts of the C categorical columns, derived int64
    [n, E], bad_rows the rows skipped."""
    data, offsets = categorical.flat()
    return {"labels": np.asarray(labels, np.float32), "dense": np.asarray(dense, np.float32),
            "dense_present": np.asarray(present, bool), "categorical_bytes": data,
            "categorical_offsets": offsets, "derived": np.asarray(derived, np.int64),
            "bad_lines": np.int64(bad_rows)}


def raw_columns(elements, text_format):
    """The raw columns (labels, dense, dense_present, categorical strings [n, C], derived,
    bad_lines) of the elements `elements()` yields, as a tf.data.Dataset, in order."""
    columns = len(text_format.categorical_names)

    def cut(arrays):
        raw = dict(arrays)
        raw["categorical"] = strings_tensor(
            raw.pop("categorical_bytes"), raw.pop("categorical_offsets"),
            tf.shape(raw["labels"])[0], columns)
        return raw

    return tf.data.Dataset.from_generator(elements, output_signature=signature(text_format)).map(
        cut, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
