"""Blocks of delimited-text lines parsed, checked and encoded in one pass of a C kernel
(`parse_lines`, tfscale/data/_kernels.c): the text readers' first try at a block, for formats
whose fields are a label, integer features and categorical values (Criteo's), before pyarrow's
parse (tfscale.data.text_blocks).

Ours because pyarrow's CSV reader builds an array of every column before anything is checked
or hashed, and that parse alone costs about what a whole `pyarrow.csv.read_csv` does
(docs/results/input_path.md); here each field is checked and its id computed where it lies in
the block, without the GIL. A block is read this way only when every kept line is clean (the
layout's number of fields, the label "0" or "1", integers matching the reader's pattern within
int64, no "\\r"); any other block goes on to pyarrow's parse and the LineParser, which refuse,
skip or read it as they always do, naming file and line. The ids are the encoders' own, bit for
bit (tests/test_text_blocks.py).
"""

import numpy as np

import tfscale.data._kernels as _kernels
from tfscale.data import aligned, handover
from tfscale.data.schema import MISSING_ID

_SKIPPED, _LABEL, _INTEGER, _CATEGORICAL = range(4)  # the kernel's roles of a column


def reads(text_format, layout):
    """Whether the kernel reads lines of `layout` (text_lines.LineLayout) of `text_format`: every
    field is a column of the line (none derived from another), the delimiter is one byte."""
    fields = set(text_format.dense_names) | set(text_format.categorical_names)
    return (not text_format.derived_from and not text_format.derived_fields
            and fields <= set(layout.column_names) and len(text_format.delimiter.encode()) == 1)


class LineKernel:
    """Lines of `layout` (text_lines.LineLayout) of `text_format`, which the kernel reads
    (`reads`), into handover elements, categorical values encoded by `encoder` (a
    preprocessing.HashingEncoder or a vocabulary.VocabularyEncoder)."""

    def __init__(self, text_format, layout, encoder):
        dense, categorical = list(text_format.dense_names), list(text_format.categorical_names)
        self._roles = np.full(layout.num_fields, _SKIPPED, np.uint8)  # what each column holds
        self._places = np.zeros(layout.num_fields, np.int32)  # its field among those of its kind
        for column, name in enumerate(layout.column_names):
            if name == text_format.label_name:
                self._roles[column] = _LABEL
            elif name in dense:
                self._roles[column], self._places[column] = _INTEGER, dense.index(name)
            elif name in categorical:
                self._roles[column], self._places[column] = _CATEGORICAL, categorical.index(name)
        self._delimiter = ord(text_format.delimiter)
        self._shape = len(dense), len(categorical)
        self._rule = encoder.kernel_rule()

    def element(self, block, keep):
        """The handover element of the lines of `block` (bytes of whole lines) where `keep`
        (bool, one per line) holds; None when a kept line is not clean or the block holds a
        "\\r" (the reader drops those)."""
        if b"\r" in block:
            return None
        rows = int(np.count_nonzero(keep))
        dense_fields, categorical_fields = self._shape
        labels = np.zeros(rows, np.float32)  # a file without labels keeps these
        dense = np.empty([rows, dense_fields], np.float32)
        present = np.empty([rows, dense_fields], bool)
        ids = aligned.empty([rows, categorical_fields], np.int64)  # as TensorFlow takes it
        written = _kernels.parse_lines(block, self._delimiter, self._roles, self._places,
                                       np.ascontiguousarray(keep, bool), *self._rule, MISSING_ID,
                                       labels, dense, present, ids)
        if written < 0:
            return None
        return handover.element(labels, dense, present, ids,
                                np.zeros([rows, 0], np.int64), 0)
