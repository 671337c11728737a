"""Blocks of delimited-text lines parsed, checked and encoded in one pass of a C kernel
(`parse_lines`, tfscale/data/_kernels.c): the text readers' and the vocabulary pass's first try
at a block, before pyarrow's parse (tfscale.data.text_blocks, tfscale.data.vocabulary_pass). The
kernel reads the label, the integer features and the categorical values (their ids, or their
fingerprints for counting, whose bytes `values_at` cuts out when asked); the columns a format
derives fields from (Avazu's hour) it hands over as they are, for the format's own checks and
derived ids (TensorFlow's ops, as for lines).

Ours because pyarrow's CSV reader builds an array of every column before anything is checked
or hashed, and that parse alone costs about what a whole `pyarrow.csv.read_csv` does
(docs/results/input_path.md); here each field is checked and its id computed where it lies in
the block, without the GIL. A block is read this way only when every kept line is clean (the
layout's number of fields, the label "0" or "1", integers matching the reader's pattern within
int64, no "\\r", the format's extra checks); any other block goes on to pyarrow's parse and the
LineParser, which refuse, skip or read it as they always do, naming file and line. The ids are
the encoders' own, bit for bit (tests/test_text_blocks.py).
"""

from typing import NamedTuple

import numpy as np
import pyarrow as pa
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


RULE_KINDS = ("buckets", "table", "fingerprints")  # an encoder's kernel_rule()'s kind: 0, 1, 2


class KernelRows(NamedTuple):
    """A block's kept lines as parse_lines writes them: labels float32 [m], dense float32 [m, D]
    with present bool [m, D], ids int64 [m, C] (the rule's), the derived-from values' spans int64
    [m, K, 2] (start, length) and the lines' starts int64 [m] in the block."""

    labels: np.ndarray
    dense: np.ndarray
    present: np.ndarray
    ids: np.ndarray
    spans: np.ndarray
    starts: np.ndarray


class LineKernel:
    """Lines of `layout` (text_lines.LineLayout) of `text_format`, which the kernel reads
    (`reads`), into handover elements, categorical values given the ids of `rule`: an encoder's
    `kernel_rule()` (a preprocessing.HashingEncoder's or a vocabulary.VocabularyEncoder's), or
    value_counts.fingerprint_rule() for counting."""

    def __init__(self, text_format, layout, rule):
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
        self.categorical_columns = np.array(  # the line's column of each categorical field
            [list(layout.column_names).index(name) for name in categorical], np.int32)
        self._format = text_format
        self._delimiter = ord(text_format.delimiter)
        self._shape = len(dense), len(categorical), len(derived_from)
        kind, per_field, *table = rule
        self._rule = (RULE_KINDS.index(kind), per_field, *table)

    def element(self, block, keep):
        """The handover element of the lines of `block` (bytes of whole lines) where `keep`
        (bool, one per line) holds; None when a kept line is not clean (the format's extra
        checks too) or the block holds a "\\r" (the reader drops those)."""
        rows = self.rows(block, keep)
        if rows is None:
            return None
        derived = self.derived_ids(block, rows.spans)
        if derived is None:
            return None
        return handover.element(rows.labels, rows.dense, rows.present, rows.ids, derived, 0)

    def rows(self, block, keep):
        """The KernelRows of the lines of `block` where `keep` holds; None when a kept line is
        not clean or the block holds a "\\r" (the format's extra checks are derived_ids')."""
        if b"\r" in block:
            return None
        count = int(np.count_nonzero(keep))
        dense_fields, categorical_fields, derived_from = self._shape
        rows = KernelRows(
            labels=np.zeros(count, np.float32),  # a file without labels keeps these
            dense=np.empty([count, dense_fields], np.float32),
            present=np.empty([count, dense_fields], bool),
            ids=aligned.empty([count, categorical_fields], np.int64),  # as TensorFlow takes it
            spans=np.empty([count, derived_from, 2], np.int64),
            starts=np.empty(count, np.int64))
        written = _kernels.parse_lines(block, self._delimiter, self._roles, self._places,
                                       np.ascontiguousarray(keep, bool), *self._rule, MISSING_ID,
                                       *rows)
        return None if written < 0 else rows

    def values_at(self, block, rows, origins):
        """The categorical values (a pyarrow binary array) at flat positions `origins` (int64)
        of `rows.ids` (KernelRows of `block`): position i is field i mod C of row i // C."""
        origins = np.ascontiguousarray(origins, np.int64)
        spans = np.empty([len(origins), 2], np.int64)
        _kernels.value_spans(block, rows.starts, self._delimiter, self.categorical_columns,
                             origins, self._shape[1], spans)
        offsets = np.zeros(len(origins) + 1, np.int64)
        np.cumsum(spans[:, 1], out=offsets[1:])
        at = np.repeat(spans[:, 0] - offsets[:-1], spans[:, 1]) + np.arange(offsets[-1])
        data = np.frombuffer(block, np.uint8)[at]
        return pa.LargeBinaryArray.from_buffers(  # int64 offsets, binary as the counts keep them
            pa.large_binary(), len(origins), [None, pa.py_buffer(offsets), pa.py_buffer(data)]
        ).cast(pa.binary())

    def derived_ids(self, block, spans):
        """int64 [n, E] derived ids of the rows whose derived-from values lie at `spans` [n, K,
        2] (start, length) in `block`; None when the format's extra checks fail a row."""
        text_format = self._format
        if not text_format.derived_from:
            return np.zeros([len(spans), len(text_format.derived_fields)], np.int64)
        values = tf.strings.substr(tf.constant(block), spans[:, :, 0], spans[:, :, 1])
        ids, checks = derived_from_values(values, text_format)
        return None if any(bool(tf.reduce_any(check.bad)) for check in checks) else ids
