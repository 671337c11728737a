"""Blocks of delimited-text lines parsed, checked and encoded in one pass of a C kernel
(`parse_lines`, tfscale/data/_kernels.c): the text readers' first try at a block, before
pyarrow's parse (tfscale.data.text_blocks). The kernel reads the label, the integer features
and the categorical values; the columns a format derives fields from (Avazu's hour) it hands
over as they are, for the format's own checks and derived ids (TensorFlow's ops, as for lines).

Ours because pyarrow's CSV reader builds an array of every column before anything is checked
or hashed, and that parse alone costs about what a whole `pyarrow.csv.read_csv` does
(docs/results/input_path.md); here each field is checked and its id computed where it lies in
the block, without the GIL. A block is read this way only when every kept line is clean (the
layout's number of fields, the label "0" or "1", integers matching the reader's pattern within
int64, no "\\r", the format's extra checks); any other block goes on to pyarrow's parse and the
LineParser, which refuse, skip or read it as they always do, naming file and line. The ids are
the encoders' own, bit for bit (tests/test_text_blocks.py).
"""

import numpy as np
import tensorflow as tf

import tfscale.data._kernels as _kernels
from tfscale.data import aligned, handover
from tfscale.data.parquet_columns import derived_from_values
from tfscale.data.schema import MISSING_ID

_SKIPPED, _LABEL, _INTEGER, _CATEGORICAL, _DERIVED_FROM = range(5)  # the roles of a column


def reads(text_format, layout):
    """Whether the kernel reads lines of `layout` (text_lines.LineLayout) of `text_format`: every
    field, and every column fields are derived from, is a column of the line, each of one kind;
    the delimiter is one byte."""
    kinds = [text_format.dense_names, text_format.categorical_names, text_format.derived_from]
    columns = [name for kind in kinds for name in kind]
    return (len(set(columns)) == len(columns) and set(columns) <= set(layout.column_names)
            and len(text_format.delimiter.encode()) == 1)


class LineKernel:
    """Lines of `layout` (text_lines.LineLayout) of `text_format`, which the kernel reads
    (`reads`), into handover elements, categorical values encoded by `encoder` (a
    preprocessing.HashingEncoder or a vocabulary.VocabularyEncoder)."""

    def __init__(self, text_format, layout, encoder):
        dense, categorical = list(text_format.dense_names), list(text_format.categorical_names)
        derived_from = list(text_format.derived_from)
        self._roles = np.full(layout.num_fields, _SKIPPED, np.uint8)  # what each column holds
        self._places = np.zeros(layout.num_fields, np.int32)  # its field among those of its kind
        for column, name in enumerate(layout.column_names):
            if name == text_format.label_name:
                self._roles[column] = _LABEL
            elif name in dense:
                self._roles[column], self._places[column] = _INTEGER, dense.index(name)
            elif name in categorical:
                self._roles[column], self._places[column] = _CATEGORICAL, categorical.index(name)
            elif name in derived_from:
                self._roles[column], self._places[column] = _DERIVED_FROM, derived_from.index(name)
        self._format = text_format
        self._delimiter = ord(text_format.delimiter)
        self._shape = len(dense), len(categorical), len(derived_from)
        self._rule = encoder.kernel_rule()

    def element(self, block, keep):
        """The handover element of the lines of `block` (bytes of whole lines) where `keep`
        (bool, one per line) holds; None when a kept line is not clean (the format's extra
        checks too) or the block holds a "\\r" (the reader drops those)."""
        if b"\r" in block:
            return None
        rows = int(np.count_nonzero(keep))
        dense_fields, categorical_fields, derived_from = self._shape
        labels = np.zeros(rows, np.float32)  # a file without labels keeps these
        dense = np.empty([rows, dense_fields], np.float32)
        present = np.empty([rows, dense_fields], bool)
        ids = aligned.empty([rows, categorical_fields], np.int64)  # as TensorFlow takes it
        spans = np.empty([rows, derived_from, 2], np.int64)
        written = _kernels.parse_lines(block, self._delimiter, self._roles, self._places,
                                       np.ascontiguousarray(keep, bool), *self._rule, MISSING_ID,
                                       labels, dense, present, ids, spans)
        if written < 0:
            return None
        derived = self._derived_ids(block, spans)
        if derived is None:
            return None
        return handover.element(labels, dense, present, ids, derived, 0)

    def _derived_ids(self, block, spans):
        """int64 [n, E] derived ids of the rows whose derived-from values lie at `spans` [n, K,
        2] (start, length) in `block`; None when the format's extra checks fail a row."""
        text_format = self._format
        if not text_format.derived_from:
            return np.zeros([len(spans), len(text_format.derived_fields)], np.int64)
        values = tf.strings.substr(tf.constant(block), spans[:, :, 0], spans[:, :, 1])
        ids, checks = derived_from_values(values, text_format)
        return None if any(bool(tf.reduce_any(check.bad)) for check in checks) else ids
