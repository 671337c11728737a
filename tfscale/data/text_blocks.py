"""The delimited-text readers' blocks of lines: parsed, checked and encoded in one pass by the C
kernel (tfscale.data.line_kernel), else parsed by pyarrow's C++ CSV reader and checked with
Arrow's kernels, or, for a block holding any line those cannot vouch for, by the reader's own
LineParser.

Owns: cutting the files into numbered blocks of whole lines, the train/test split and shard of a
block's lines (text_lines.LineSelection), pyarrow's parse of a block, and the choice per block.
The kernel takes a block only when every kept line is clean; pyarrow's parse takes it only when
pyarrow parses every line into the layout's fields and every value passes the checks the
Parquet reader applies (parquet_columns.check_rows: the label "0" or "1", integers of int64's
range, the format's extra checks). Anything else (a malformed
line, a short one, a value out of range, an odd integer such as " 5" or "0x5", invalid UTF-8 in
a number) sends the whole block through the LineParser, which refuses it with the error naming
file and line, skips and counts it, or reads its missing trailing fields, exactly as the
tf.data pipeline of lines does. Either way a block becomes one tfscale.data.handover element.
"""

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import tensorflow as tf

from tfscale.data import handover, line_kernel, read_ahead
from tfscale.data.line_kernel import LineKernel
from tfscale.data.parquet_columns import ColumnMap, check_rows, derived_ids
from tfscale.data.text_lines import LineParser
from tfscale.data.vocabulary_pass import Piece, blocks
from tfscale.errors import DATA_ERROR_MARKER, UserError, user_error_from_tf

BLOCK_BYTES = 8 << 20  # whole lines parsed together; blocks are parsed ahead in threads


class TextBlocks:
    """Blocks of the lines of one FileSet of `text_format`, as handover elements.

    Args:
      text_format: the TextFormat of the lines.
      files: the text_lines.FileSet read.
      skip_bad_lines, on_short_line: the LineParser's policies (text_lines.LineParser).
      block_bytes: bytes of whole lines per block.
    """

    def __init__(self, text_format, files, skip_bad_lines, on_short_line,
                 block_bytes=BLOCK_BYTES):
        self._format = text_format
        self._files = files
        self._block_bytes = int(block_bytes)
        self._column_map = ColumnMap(text_format)
        parser = LineParser(text_format, files, skip_bad_lines, on_short_line)
        self._parse_lines = tf.function(
            parser, input_signature=[tf.TensorSpec([], tf.int64), tf.TensorSpec([None], tf.int64),
                                     tf.TensorSpec([None], tf.string)])
        layout = files.layout
        fields = self._column_map.column
        wanted = [name for name in layout.column_names if name in fields]
        text = (text_format.label_name,) + tuple(text_format.derived_from)

        def column_type(name, as_text):
            if name in text:
                return pa.string()
            if name in text_format.dense_names:
                return pa.string() if as_text else pa.int64()
            return pa.binary()

        self._read_options = pacsv.ReadOptions(  # one chunk per column: one pass per column
            column_names=list(layout.column_names), use_threads=False,
            block_size=self._block_bytes + (1 << 20))
        self._parse_options = dict(
            delimiter=text_format.delimiter, quote_char=False, double_quote=False,
            escape_char=False, newlines_in_values=False, ignore_empty_lines=False)
        self._convert_options = {as_text: pacsv.ConvertOptions(
            column_types={name: column_type(name, as_text) for name in wanted},
            include_columns=wanted, strings_can_be_null=False, quoted_strings_can_be_null=False,
            null_values=[] if as_text else [""]) for as_text in (False, True)}

    def elements(self, selection, order, encoder):
        """The handover elements of the lines `selection` keeps, of the files in `order`, block
        by block in order, blocks parsed, checked and encoded by `encoder` (a
        preprocessing.HashingEncoder or a vocabulary.VocabularyEncoder) ahead in threads."""
        header = self._files.header_lines
        items = ((int(file_index), lines_before, lines, block) for file_index in order
                 for lines_before, lines, block in blocks(
                     Piece(int(file_index), self._files.paths[file_index], 0, None), header,
                     self._block_bytes))
        layout = self._files.layout
        kernel = (LineKernel(self._format, layout, encoder.kernel_rule())
                  if line_kernel.reads(self._format, layout) else None)
        yield from read_ahead.ordered_ahead(
            lambda item: self._element(selection, encoder, kernel, *item), items)

    def _element(self, selection, encoder, kernel, file_index, lines_before, lines, block):
        numbers = lines_before + 1 + np.arange(lines, dtype=np.int64)
        keep = selection(tf.constant(file_index, tf.int64), tf.constant(numbers)).numpy()
        element = kernel.element(block, keep) if kernel is not None else None
        if element is not None:
            return element
        table = self._parsed(block)
        if table is not None:
            if not keep.all():
                table = table.filter(pa.array(keep))
            element = self._checked(table, encoder)
            if element is not None:
                return element
        return self._through_the_parser(file_index, block, numbers, keep, encoder)

    def _parsed(self, block):
        """pyarrow's table of `block`, None when a line does not have the layout's fields or a
        value is not one pyarrow's types take. Integers are read as int64 unless the block holds
        a space, an "x" or a "+" (pyarrow's integers take surrounding spaces and 0x hex, which
        the reader refuses, and refuse a leading "+", which it takes): then as text, checked
        by the reader's pattern. A block with an empty
        line is left to the LineParser (pyarrow reads one as a row of empty fields)."""
        if block.startswith(b"\n") or b"\n\n" in block:
            return None
        invalid = []
        options = pacsv.ParseOptions(**self._parse_options,
                                     invalid_row_handler=lambda row: invalid.append(row) or "skip")
        as_text = any(mark in block for mark in (b" ", b"x", b"X", b"+"))
        try:
            table = pacsv.read_csv(pa.py_buffer(block), self._read_options, options,
                                   self._convert_options[as_text])
        except pa.ArrowInvalid:
            return None
        return None if invalid else table

    def _checked(self, table, encoder):
        """The element of a parsed block's rows, None when a row has a problem."""
        label = self._format.label_name
        if self._files.has_labels and not pc.all(
                pc.is_in(table[label], value_set=pa.array(["0", "1"])), min_count=0).as_py():
            return None
        block = check_rows(table, self._column_map, self._files.has_labels)
        derived = derived_ids(block, self._format)
        if block.bad().any():
            return None
        return handover.element(block.labels, block.integers, block.present,
                                block.categorical.ids(encoder), derived, 0)

    def _through_the_parser(self, file_index, block, numbers, keep, encoder):
        """The element of a block parsed by the reader's LineParser; its data error, naming
        file and line, raised as the Parquet reader raises its own (a UserError carrying
        DATA_ERROR_MARKER, which tf.data passes on as an InvalidArgumentError)."""
        lines = block.split(b"\n")[:len(numbers)]
        try:
            raw = self._parse_lines(tf.constant(file_index, tf.int64), tf.constant(numbers[keep]),
                                    tf.constant(np.array(lines, object)[keep]))
        except tf.errors.InvalidArgumentError as error:
            user_error = user_error_from_tf(error)
            if user_error is None:
                raise
            raise UserError(f"{DATA_ERROR_MARKER}{user_error}") from None
        return handover.element(raw["labels"], raw["dense"], raw["dense_present"],
                                encoder.encode(raw["categorical"]), raw["derived"],
                                int(raw["bad_lines"]))
