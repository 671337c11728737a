"""The vocabulary pass over delimited text files: categorical values counted, integer ranges
found, every line checked, in one streaming pass, split over the Horovod ranks when there are
several.

Owns: each rank's share of the files (a byte range of every plain file, aligned to lines; whole
.gz files, file i to rank i mod P), reading it as blocks of whole lines, reading and checking a
block, counting it into a ValueCounts (tfscale.data.value_counts), and handing the counts to
tfscale.data.vocabulary_ranks to be added up over the ranks.

The engine: the readers' line kernel (tfscale.data.line_kernel) reads a block, checks every
line as the reader does and gives each categorical value its 64-bit fingerprint where it lies,
and ValueCounts' C kernel counts the fingerprints one after another, taking a value's bytes
only when it becomes an entry of the table: no table of a block's columns or of its distinct
values is built (docs/results/input_path.md, "The vocabulary pass"). Where the kernel does not
read a format (a delimiter of several bytes), pyarrow's C++ CSV parser parses the block and
Arrow's `value_counts` counts it. Blocks are read COUNTING_THREADS at a time (the kernels and
pyarrow let go of the GIL, whose switch interval is cut to SWITCH_INTERVAL meanwhile), and
counted one after another in file order, so that the counts, which after a spill depend on the
order values come in, are those of one block after the other.

The checks stay the reader's: a block is counted this way only when every kept line is one the
reader takes as it is (the field count; the label "0" or "1"; integers matching [+-]?[0-9]+
and within int64; the format's extra checks, e.g. Avazu's hour); any other block (a malformed or
a short line in it) is parsed by the reader's LineParser instead, which counts, skips or stops
at it exactly as reading does (`on_bad_line`, `on_short_line`; errors name file and line). As
the reader, every "\\r" is dropped.
"""

import collections
import concurrent.futures
import dataclasses
import gzip
import math
import os
import sys
import time
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import tensorflow as tf

from tfscale import distributed
from tfscale.data import line_kernel
from tfscale.data import vocabulary as vocabulary_lib
from tfscale.data import vocabulary_ranks
from tfscale.data.line_kernel import LineKernel
from tfscale.data.text_lines import (BAD_LINE_POLICIES, FileSet, LineParser, LineSelection,
                                     TextFormat, check_short_line_policy, compression_of,
                                     in_test_split)
from tfscale.data.value_counts import (SKETCH_DEPTH, ValueCounts, distinct_counts,
                                       fingerprint_rule, sketch_dtype)
from tfscale.errors import UserError, user_error_from_tf

BLOCK_BYTES = 8 << 20  # whole lines read, parsed and counted together
PARSE_BLOCK_BYTES = 1 << 20  # pyarrow parses a block in pieces of this size, in parallel
DEFAULT_MEMORY_MB = 64  # the counts' memory: half for the sketch, half for exact values
COUNTING_THREADS = 2  # blocks read at once (the kernels and pyarrow let go of the GIL)
BLOCKS_AHEAD = 1  # blocks in the counting threads while the one before is counted
SWITCH_INTERVAL = 2e-4  # seconds: how long a thread that wants the GIL waits while counting
BYTES_PER_EXACT_VALUE = 256  # an entry: table slots, count, field, value, with the spill's copies
_SIGNED_INTEGER = r"^[+-]?[0-9]+$"


def counting_limits(memory_mb, gate):
    """(max exact values, sketch width) that keep the counts within about `memory_mb` MB: half
    for the sketch, the rest for exact values."""
    budget = int(memory_mb) << 20
    itemsize = np.dtype(sketch_dtype(gate)).itemsize
    width = 1 << max(10, int(math.log2(max(budget // 2 // (itemsize * SKETCH_DEPTH), 1))))
    return max(1024, (budget - itemsize * SKETCH_DEPTH * width) // BYTES_PER_EXACT_VALUE), width


def count_files(text_format, paths, *, min_count=1, on_bad_line="error", on_short_line="missing",
                test_fraction=None, memory_mb=DEFAULT_MEMORY_MB, progress=None,
                progress_every_seconds=5.0):
    """The Vocabulary of the lines of `paths` (only the train side of the `test_fraction` split
    when given): values seen at least `min_count` times, integer ranges, distinct values and
    malformed lines skipped. Under horovodrun (after tfscale.distributed.init()) every rank must
    call it: each counts its share and all get the same Vocabulary. `memory_mb` bounds the
    counts' memory (tfscale.data.value_counts says what is exact); `progress(lines counted)` is
    called every `progress_every_seconds` (this rank's lines)."""
    local, width = _rank_counts(text_format, min_count, memory_mb)
    if on_bad_line not in BAD_LINE_POLICIES:
        raise UserError(f"`on_bad_line={on_bad_line!r}`: give one of "
                        f"{', '.join(BAD_LINE_POLICIES)}")
    check_short_line_policy(on_short_line)
    try:
        files = FileSet(text_format, paths)
        _FileCounter(text_format, files, local, on_bad_line == "skip", on_short_line,
                     test_fraction, progress, progress_every_seconds).count(
            rank_pieces(files.paths, distributed.rank(), distributed.size()))
    except UserError as error:
        local.error = error
    return _vocabulary(text_format, local, min_count, memory_mb, width)


def count_blocks(text_format, blocks, *, min_count=1, memory_mb=DEFAULT_MEMORY_MB,
                 progress=None, progress_every_seconds=5.0):
    """The Vocabulary of rows a reader has checked: `blocks` yields this rank's share as
    (parquet_columns.CheckedRows of the good rows, bad rows skipped), as ParquetSource reads its
    rank's row ranges, counted with Arrow's hash kernels within `memory_mb` and added up over the
    ranks as count_files does; under horovodrun every rank must call it and all get the same
    Vocabulary."""
    local, width = _rank_counts(text_format, min_count, memory_mb)
    last_report = time.monotonic()
    try:
        for block, bad_rows in blocks:
            fields, values, counts = block.categorical.value_counts()
            if len(counts):
                local.counts.add(fields, values, counts)
            integers = block.integers.astype(np.float32)  # as the reader hands them over
            local.add_ranges(np.where(block.present, integers, np.inf).min(axis=0, initial=np.inf),
                             np.where(block.present, integers, -np.inf).max(axis=0,
                                                                            initial=-np.inf))
            local.rows += len(block.labels)
            local.bad_lines += bad_rows
            if progress and time.monotonic() - last_report >= progress_every_seconds:
                progress(local.rows)
                last_report = time.monotonic()
    except UserError as error:
        local.error = error
    return _vocabulary(text_format, local, min_count, memory_mb, width)


def _rank_counts(text_format, min_count, memory_mb):
    """(this rank's empty RankCounts, the sketch's width) for counting at `min_count` in
    `memory_mb` MB: a value enters a rank's exact table at ceil(min count / ranks)."""
    if int(min_count) < 1:
        raise UserError(f"`min_count={min_count}`: give 1 or more")
    if int(memory_mb) < 16:
        raise UserError(f"`memory_mb={memory_mb}`: give 16 or more")
    gate = math.ceil(min_count / distributed.size())
    max_values, width = counting_limits(memory_mb, gate)
    counts = ValueCounts(len(text_format.categorical_names), gate=gate, max_values=max_values,
                         sketch_width=width)
    return vocabulary_ranks.RankCounts(counts, len(text_format.dense_names)), width


def _vocabulary(text_format, local, min_count, memory_mb, width):
    """The Vocabulary of every rank's counts (`local` is this rank's); raises the UserError that
    stopped a rank."""
    totals = vocabulary_ranks.added_up(local)
    counting = {"ranks": distributed.size(), "exact": not totals.spilled,
                "memory_mb": int(memory_mb), "sketch_width": width,
                "sketch_depth": SKETCH_DEPTH, "sketched": totals.sketched,
                "error_bound": min(math.ceil(min_count / distributed.size()),
                                   math.ceil(math.e / width * totals.sketched))}
    return vocabulary_lib.from_totals(
        format_name=text_format.name, categorical_names=text_format.categorical_names,
        dense_names=text_format.dense_names, min_count=min_count, totals=totals.table,
        distinct=totals.distinct, lows=totals.lows, highs=totals.highs, rows=totals.rows,
        bad_lines=totals.bad_lines, counting=counting)


# ----------------------------------------------------------------------------- the ranks' shares

@dataclasses.dataclass(frozen=True)
class Piece:
    """Bytes [start, end) of file `file_index` (end None: to its end), beginning at a line."""

    file_index: int
    path: str
    start: int
    end: int


def rank_pieces(paths, rank, size):
    """The Pieces rank `rank` of `size` counts: its byte range of each plain file (the lines
    starting in the rank-th of `size` equal ranges) and the .gz files i with i mod size = rank
    (a gzip stream cannot be entered in the middle)."""
    pieces = []
    for index, path in enumerate(paths):
        if compression_of(path):
            if index % size == rank:
                pieces.append(Piece(index, path, 0, None))
            continue
        length = os.path.getsize(path)
        start, end = (_line_start(path, length * k // size, length) for k in (rank, rank + 1))
        if start < end:
            pieces.append(Piece(index, path, start, end))
    return pieces


def _line_start(path, offset, length):
    """The offset of the first line starting at or after `offset`."""
    if offset <= 0 or offset >= length:
        return min(max(offset, 0), length)
    with open(path, "rb") as stream:
        stream.seek(offset - 1)
        while True:
            data = stream.read(1 << 16)
            newline = data.find(b"\n")
            if newline >= 0:
                return stream.tell() - len(data) + newline + 1
            if not data:
                return length


def _lines_before(path, offset):
    """Lines ending before byte `offset` of a plain file."""
    lines, done = 0, 0
    with open(path, "rb") as stream:
        while done < offset:
            data = stream.read(min(BLOCK_BYTES, offset - done))
            if not data:
                break
            lines += data.count(b"\n")
            done += len(data)
    return lines


def blocks(piece, header_lines, block_bytes=None):
    """(lines of `piece` before it, its lines, bytes) of the blocks of about `block_bytes`
    (default BLOCK_BYTES) whole lines of `piece`, header lines left out (the last line of the
    last block may lack its "\\n"); every "\\r" is dropped, as the reader does."""
    block_bytes = block_bytes or BLOCK_BYTES
    opener = gzip.open if compression_of(piece.path) else open
    with opener(piece.path, "rb") as stream:
        stream.seek(piece.start)
        remaining = None if piece.end is None else piece.end - piece.start
        carry, lines_before = b"", 0
        skip = header_lines if piece.start == 0 else 0
        while True:
            wanted = block_bytes if remaining is None else min(block_bytes, remaining)
            chunk = stream.read(wanted) if wanted else b""
            if remaining is not None:
                remaining -= len(chunk)
            cut = chunk.rfind(b"\n") + 1
            if not chunk:
                block, carry = carry, b""
            elif not cut:
                block, carry = b"", carry + chunk
            else:  # one copy at most: a line carried over joined to the chunk's whole lines
                block = (b"".join((carry, memoryview(chunk)[:cut]))
                         if carry or cut < len(chunk) else chunk)
                carry = chunk[cut:]
            while skip and block:
                newline = block.find(b"\n")
                block = b"" if newline < 0 else block[newline + 1:]
                skip, lines_before = skip - 1, lines_before + 1
            if b"\r" in block:
                block = block.replace(b"\r", b"")
            if block:
                lines = _newlines(block) + (not block.endswith(b"\n"))
                yield lines_before, lines, block
                lines_before += lines
            if not chunk:
                return


def _newlines(block):
    """The "\\n" in `block` (numpy's count, without Python's lock held)."""
    return int(np.count_nonzero(np.frombuffer(block, np.uint8) == ord("\n")))


# ----------------------------------------------------------------------------- counting a share

class _FileCounter:
    """Counts the Pieces of one rank into a RankCounts."""

    def __init__(self, text_format, files, local, skip_bad_lines, on_short_line, test_fraction,
                 progress, progress_every_seconds):
        self._format, self._files, self._local = text_format, files, local
        self._test_fraction = test_fraction
        self._progress, self._every = progress, progress_every_seconds
        self._piece_lines = {}  # Piece -> lines of its file before it
        parser = LineParser(text_format, files, skip_bad_lines, on_short_line)
        self._summarise = tf.function(  # a graph: its errors end with context cut by user_error
            lambda file_index, numbers, lines: vocabulary_lib.summarise_chunk(
                parser(file_index, numbers, lines)),
            input_signature=[tf.TensorSpec([], tf.int64), tf.TensorSpec([None], tf.int64),
                             tf.TensorSpec([None], tf.string)])
        layout = files.layout
        self._kernel = (LineKernel(text_format, layout,
                                   fingerprint_rule(len(text_format.categorical_names)))
                        if line_kernel.reads(text_format, layout) else None)
        names = list(text_format.dense_names) + list(text_format.categorical_names)
        self._label = text_format.label_name if files.has_labels else None
        self._extra_checks = type(text_format).extra_checks is not TextFormat.extra_checks
        wanted = ([self._label] if self._label else []) + names + (
            list(text_format.derived_from) if self._extra_checks else [])
        self._read_options = pacsv.ReadOptions(column_names=list(layout.column_names),
                                               block_size=PARSE_BLOCK_BYTES)
        self._typed_options, self._text_options = (pacsv.ConvertOptions(
            column_types={name: pa.binary() if name in text_format.categorical_names
                          else typed if name in text_format.dense_names else pa.string()
                          for name in layout.column_names},
            include_columns=list(dict.fromkeys(wanted)), strings_can_be_null=False,
            quoted_strings_can_be_null=False, null_values=nulls)
            for typed, nulls in ((pa.int64(), [""]), (pa.string(), [])))

    def count(self, pieces):
        """Counts the blocks of `pieces`: each parsed, checked and counted by itself in one of
        COUNTING_THREADS threads, up to BLOCKS_AHEAD blocks ahead, and added to the counts in
        file order (the reader's parser sees a block pyarrow cannot vouch for then, in its
        place)."""
        last_report = time.monotonic()
        pending = collections.deque()
        switch_interval = sys.getswitchinterval()
        with concurrent.futures.ThreadPoolExecutor(COUNTING_THREADS) as threads:
            try:
                sys.setswitchinterval(min(switch_interval, SWITCH_INTERVAL))
                for piece in pieces:
                    for lines_before, lines, block in blocks(piece, self._files.header_lines):
                        first_line = (None if self._test_fraction is None
                                      else self._first_line(piece, lines_before))
                        pending.append((piece, lines_before, block, threads.submit(
                            self._block_counts, block, lines, piece.file_index, first_line)))
                        while len(pending) > BLOCKS_AHEAD:
                            self._add(*pending.popleft())
                            last_report = self._report(last_report)
                while pending:
                    self._add(*pending.popleft())
                    last_report = self._report(last_report)
            except BaseException:
                for *_, future in pending:
                    future.cancel()
                raise
            finally:
                sys.setswitchinterval(switch_interval)

    def _report(self, last_report):
        if self._progress and time.monotonic() - last_report >= self._every:
            self._progress(self._local.rows)
            return time.monotonic()
        return last_report

    def _add(self, piece, lines_before, block, future):
        """Adds a block's counts (a future of _block_counts), or counts it with the reader."""
        counted = future.result()
        if counted is None:
            self._count_with_the_reader(piece, lines_before, block)
            return
        counted.count_into(self._local.counts)
        self._local.add_ranges(counted.lows, counted.highs)
        self._local.rows += counted.rows

    def _parse(self, block):
        """The pyarrow table of `block`, None when a line has another number of fields. Integer
        fields are read as int64, unless the block holds a space or an "x": pyarrow's integers
        also take surrounding spaces and 0x hex, which the reader refuses, so such blocks keep
        them as text for _integer_range to check."""
        invalid = []
        options = pacsv.ParseOptions(
            delimiter=self._format.delimiter, quote_char=False, double_quote=False,
            escape_char=False, newlines_in_values=False, ignore_empty_lines=False,
            invalid_row_handler=lambda row: invalid.append(row) or "skip")
        as_text = b" " in block or b"x" in block or b"X" in block
        try:
            table = pacsv.read_csv(pa.py_buffer(block), self._read_options, options,
                                   self._text_options if as_text else self._typed_options)
        except pa.ArrowInvalid:  # not an integer pyarrow takes, invalid UTF-8 in a label...
            return None
        return None if invalid else table

    def _block_counts(self, block, lines, file_index, first_line):
        """The _BlockCounts of a block of `lines` lines of file `file_index` (its first line's
        number `first_line`, None without a test split), read by the line kernel or else parsed
        by pyarrow; None when a line in it is one the reader's parser must see. Runs in a
        counting thread: changes nothing shared."""
        keep = np.ones(lines, bool)
        if self._test_fraction is not None:
            numbers = first_line + np.arange(lines)
            keep = np.logical_not(in_test_split(tf.constant(file_index, tf.int64),
                                                tf.constant(numbers, tf.int64),
                                                self._test_fraction).numpy())
        if self._kernel is not None:
            counted = self._kernel_counts(block, keep)
            if counted is not None:
                return counted
        return self._arrow_counts(block, keep)

    def _kernel_counts(self, block, keep):
        """The _BlockCounts of the kept lines of `block` as the line kernel reads them (each
        categorical value's fingerprint), None when it does not take the block."""
        rows = self._kernel.rows(block, keep)
        if rows is None or self._kernel.derived_ids(block, rows.spans) is None:
            return None
        kernel = self._kernel
        return _BlockCounts(
            lambda counts: counts.add_keys(rows.ids.view(np.uint64), lambda origins:
                                           kernel.values_at(block, rows, origins)),
            np.where(rows.present, rows.dense, np.inf).min(axis=0, initial=np.inf),
            np.where(rows.present, rows.dense, -np.inf).max(axis=0, initial=-np.inf),
            len(rows.labels))

    def _arrow_counts(self, block, keep):
        """The _BlockCounts of the kept lines of `block` parsed by pyarrow and checked with
        Arrow's kernels, None when a line in it is one the reader's parser must see."""
        table = self._parse(block)
        if table is None:
            return None
        fmt = self._format
        if self._label and not pc.all(pc.is_in(table[self._label], value_set=pa.array(
                ["0", "1"]))).as_py():
            return None
        if self._extra_checks and self._extra_check_fails(table):
            return None
        if not keep.all():
            table = table.filter(pa.array(keep))
        ranges = [_integer_range(table[name]) for name in fmt.dense_names]
        if any(r is False for r in ranges):
            return None
        fields, values, counts = distinct_counts([table[name] for name in fmt.categorical_names])
        return _BlockCounts(
            lambda value_counts: value_counts.add(fields, values, counts),
            [np.inf if r is None else r[0] for r in ranges],
            [-np.inf if r is None else r[1] for r in ranges], table.num_rows)

    def _extra_check_fails(self, table):
        fields = _ArrowFields(table)
        bad = [check.bad for check in self._format.extra_checks(fields)]
        return bool(tf.reduce_any(tf.stack(bad)).numpy()) if bad else False

    def _count_with_the_reader(self, piece, lines_before, block):
        """Counts a block through the reader's LineParser: its checks, skips and errors."""
        lines = block.split(b"\n")
        if block.endswith(b"\n"):
            lines.pop()
        numbers = tf.constant(self._first_line(piece, lines_before) + np.arange(len(lines)),
                              tf.int64)
        file_index = tf.constant(piece.file_index, tf.int64)
        keep = LineSelection(self._test_fraction)(file_index, numbers)
        try:
            summary = tf.nest.map_structure(np.asarray, self._summarise(
                file_index, tf.boolean_mask(numbers, keep),
                tf.boolean_mask(tf.constant(lines, tf.string), keep)))
        except tf.errors.InvalidArgumentError as error:
            user_error = user_error_from_tf(error)
            if user_error is None:
                raise
            raise user_error from None
        vocabulary_lib.add_summary(self._local.counts, summary)
        self._local.add_ranges(summary["lows"], summary["highs"])
        self._local.rows += int(summary["rows"])
        self._local.bad_lines += int(summary["bad_lines"])

    def _first_line(self, piece, lines_before):
        """The line number (1-based in its file) of the line after the first `lines_before`
        lines of `piece`; the lines before a piece are counted when first needed."""
        if piece not in self._piece_lines:
            self._piece_lines[piece] = _lines_before(piece.path, piece.start)
        return self._piece_lines[piece] + lines_before + 1


@dataclasses.dataclass
class _BlockCounts:
    """A block counted in a counting thread: `count_into(value_counts)` adds its values to the
    counts (in file order, in the pass's thread), the integer fields' lows and highs (inf and
    -inf where all are empty) and its rows."""

    count_into: Callable
    lows: list
    highs: list
    rows: int


def _integer_range(column):
    """(min, max) as float32 values (as the reader reads them) of the non-empty integers of a
    column (int64, or text checked here), None when all are empty, False when one is not an
    integer the fast path takes (not [+-]?[0-9]+, or outside int64: the reader's parser then
    sees the block)."""
    if column.type == pa.int64():
        values = column
    else:
        text = column.filter(pc.greater(pc.binary_length(column), 0))
        odd = text.filter(pc.invert(pc.ascii_is_decimal(text)))
        if len(odd) and not pc.all(pc.match_substring_regex(odd, _SIGNED_INTEGER)).as_py():
            return False
        try:
            values = pc.cast(text, pa.int64())
        except pa.ArrowInvalid:  # "+5", or beyond int64
            return False
    low_high = pc.min_max(values)
    if not low_high["min"].is_valid:
        return None
    return tuple(float(np.float32(low_high[key].as_py())) for key in ("min", "max"))


class _ArrowFields:
    """The columns of a parsed block as string tensors, looked up by name as a text_lines.Fields
    is (what a TextFormat's extra_checks reads)."""

    def __init__(self, table):
        self._table = table

    def __getitem__(self, name):
        return tf.constant(self._table[name].to_numpy(zero_copy_only=False).astype(object))
