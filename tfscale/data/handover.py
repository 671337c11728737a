"""How checked blocks of rows reach TensorFlow, for the readers that check them with Arrow (Parquet
files, and text files on their fast path).

Owns the element a block becomes (`element`: labels, integers as float32 with their presence, the
categorical columns as their distinct values (one buffer of bytes with int32 offsets, each
value's column) and each row's int32 index into them, derived ids, the bad rows skipped) and the
tf.data.Dataset of raw columns it gives (`raw_columns`): a generator of elements, then a parallel
map that cuts the distinct values out of each block's bytes with one `tf.strings.substr`. Each
kind of column crosses into TensorFlow as one array, not one per field, no value becomes a
Python object, and a value repeated in a block crosses once: the encoders encode the distinct
values and gather each row's ids by index (data.preprocessing.Preprocessing.features)."""

import numpy as np
import tensorflow as tf


def signature(text_format):
    """The tf.TensorSpecs of an element for rows of `text_format`."""
    dense = len(text_format.dense_names)
    return {
        "labels": tf.TensorSpec([None], tf.float32),
        "dense": tf.TensorSpec([None, dense], tf.float32),
        "dense_present": tf.TensorSpec([None, dense], tf.bool),
        "categorical_bytes": tf.TensorSpec([], tf.string),
        "categorical_offsets": tf.TensorSpec([None], tf.int32),
        "categorical_fields": tf.TensorSpec([None], tf.int32),
        "categorical_indices": tf.TensorSpec([None, len(text_format.categorical_names)],
                                             tf.int32),
        "derived": tf.TensorSpec([None, len(text_format.derived_fields)], tf.int64),
        "bad_lines": tf.TensorSpec([], tf.int64),
    }


def element(labels, dense, present, categorical, derived, bad_rows):
    """The element of one block: labels [n], dense [n, D] (any numbers, as float32), present
    bool [n, D], categorical a parquet_columns.Dictionaries of the C categorical columns, derived
    int64 [n, E], bad_rows the rows skipped."""
    data, offsets, fields, indices = categorical.flat()
    return {"labels": np.asarray(labels, np.float32), "dense": np.asarray(dense, np.float32),
            "dense_present": np.asarray(present, bool), "categorical_bytes": data,
            "categorical_offsets": offsets, "categorical_fields": fields,
            "categorical_indices": indices, "derived": np.asarray(derived, np.int64),
            "bad_lines": np.int64(bad_rows)}


def raw_columns(elements, text_format):
    """The raw columns of the elements `elements()` yields, as a tf.data.Dataset, in order:
    labels, dense, dense_present, derived and bad_lines as text_lines.LineParser gives them for
    lines, and the categorical values in their dictionary form: categorical_values tf.string [V]
    (value 0 the empty, missing value), categorical_fields int32 [V] (each value's column) and
    categorical_indices int32 [n, C] (row r's value of column k: categorical_values[indices[r,
    k]]), where lines give categorical strings [n, C]."""

    def cut(arrays):
        raw = dict(arrays)
        offsets = raw.pop("categorical_offsets")
        raw["categorical_values"] = tf.strings.substr(
            raw.pop("categorical_bytes"), offsets[:-1], offsets[1:] - offsets[:-1])
        return raw

    return tf.data.Dataset.from_generator(elements, output_signature=signature(text_format)).map(
        cut, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
