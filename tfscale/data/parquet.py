"""Parquet files (what Spark, BigQuery and NVTabular/Merlin write) as a CTRSource.

Owns: opening the files and checking their columns (parquet_columns.ColumnMap), the rows of
every file in one order (files as given, row groups in order) and their split over ranks, the
train/test split by row, streaming checked blocks of rows from pyarrow's batches of a row group
into tf.data, the bad-row policy and its count, the test split's first rows as lines, and the
vocabulary pass. Encoding is data.preprocessing's, as for text, so a model trained on Parquet
rows reads and serves its data set's lines alike.

Ranks: rank r of P reads the rows [r N / P, (r + 1) N / P) of the N rows of all files in that
order, i.e. only the row groups overlapping that range, sliced at its ends; shards are even to a
row whatever the row groups' sizes. The test split holds out rows by a fixed hash of (file,
row number), as the text readers hold out lines, so rows converted in order from a text file
without a header split exactly as its lines did. A file's rows are numbered from 1 (as lines
are) and its row groups from 0 (as pyarrow numbers them).
"""

import collections
import dataclasses

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import tensorflow as tf

from tfscale import distributed
from tfscale.data import handover, read_ahead
from tfscale.data.parquet_columns import TEXT, ColumnMap, check_rows, derived_ids
from tfscale.data.pipeline import without_autotuning
from tfscale.data.preprocessing import source_preprocessing
from tfscale.data.source import CTRSource
from tfscale.data.text_lines import (
    PARQUET_MAGIC, LineLayout, check_bad_line_policy, held_out_fraction, in_test_split,
    resolve_paths, shuffle_seed, shuffle_windows)
from tfscale.errors import DATA_ERROR_MARKER, UserError

CHUNK_ROWS = 65536  # rows checked and converted together, and parsed by one map call


def is_parquet(path):
    """Whether the file `path` starts as a Parquet file does."""
    with open(path, "rb") as stream:
        return stream.read(len(PARQUET_MAGIC)) == PARQUET_MAGIC.encode()


@dataclasses.dataclass(frozen=True)
class RowRange:
    """Rows [start, stop) of row group `group` of file `file_index`, whose first row is row
    `first_row` + 1 of the file."""

    file_index: int
    group: int
    first_row: int
    start: int
    stop: int

    def row_numbers(self):
        """The 1-based row numbers of the range in its file, int64 [stop - start]."""
        return self.first_row + 1 + np.arange(self.start, self.stop, dtype=np.int64)


SMALL_DICTIONARY_PAGE = 512 << 10  # bytes: a dictionary page this small holds every value


class ParquetFiles:
    """One set of Parquet files (the train or the test files) read as `column_map` says.

    A categorical column is read as a dictionary array (its values and each row's index, no
    value repeated: each value hashed once a block) when its dictionary pages hold all its values:
    when every row group's dictionary page is under SMALL_DICTIONARY_PAGE bytes (writers give up
    dictionary pages for plain ones at about 1 MB). Other columns are read as plain values, each
    hashed where it lies (parquet_columns.Categorical): pyarrow would otherwise build one
    dictionary of the whole row group's values, at several times the cost."""

    def __init__(self, paths, column_map):
        self.paths = resolve_paths(paths)
        self.column_map = column_map
        self._groups = []  # (file_index, group, first row in the file, rows)
        self._dictionary_columns = []  # per file: the columns read as dictionary arrays
        derived_from = column_map.text_format.derived_from
        categorical = {column_map.column[name] for name in column_map.names(TEXT)
                       if name not in derived_from}
        labelled = []
        for file_index, path in enumerate(self.paths):
            metadata = self._open(path).metadata
            labelled.append(column_map.check_schema(path, metadata.schema.to_arrow_schema()))
            self._dictionary_columns.append(_small_dictionaries(metadata, categorical))
            if labelled[-1] != labelled[0]:
                raise UserError(f"{path}: {'has' if labelled[-1] else 'lacks'} the label column, "
                                f"which {self.paths[0]} {'lacks' if labelled[-1] else 'has'}; "
                                "files read together must all have it or all lack it")
            first = 0
            for group in range(metadata.num_row_groups):
                rows = metadata.row_group(group).num_rows
                self._groups.append((file_index, group, first, rows))
                first += rows
        self.has_labels = labelled[0]
        if self.num_rows == 0:
            raise UserError(f"{self.describe()}: the files hold no rows")
        label = column_map.column[column_map.text_format.label_name]
        self.read_columns = [column for column in column_map.column.values()
                             if self.has_labels or column != label]

    @staticmethod
    def _open(path, dictionary_columns=()):
        try:
            return pq.ParquetFile(path, read_dictionary=list(dictionary_columns) or None)
        except (pa.ArrowException, OSError) as error:
            raise UserError(f"{path}: not a readable Parquet file ({error})") from None

    @property
    def num_rows(self):
        return sum(rows for *_, rows in self._groups)

    def describe(self):
        more = f" (+{len(self.paths) - 1} files)" if len(self.paths) > 1 else ""
        return f"{self.paths[0]}{more}"

    def ranges(self, shard_index=0, num_shards=1):
        """The RowRanges of shard `shard_index` of `num_shards`: its slice of every row in
        order."""
        total = self.num_rows
        low, high = total * shard_index // num_shards, total * (shard_index + 1) // num_shards
        ranges, start = [], 0
        for file_index, group, first, rows in self._groups:
            begin, end = max(low, start), min(high, start + rows)
            if begin < end:
                ranges.append(RowRange(file_index, group, first, begin - start, end - start))
            start += rows
        return ranges

    def read(self, row_range, block_rows):
        """(first row, Arrow table) of each block of `row_range`'s rows (the columns read), in
        order: at most `block_rows` rows each, the first row counted from the range's start.
        The row group is decoded block by block as the blocks are wanted (pyarrow's batches),
        so blocks before are checked while later ones decode and a large row group is never
        held whole."""
        parquet_file = self._open(self.paths[row_range.file_index],
                                  self._dictionary_columns[row_range.file_index])
        batches = parquet_file.iter_batches(block_rows, row_groups=[row_range.group],
                                            columns=self.read_columns)
        begin = 0  # the batch's first row in the row group
        for batch in batches:
            low, high = max(row_range.start, begin), min(row_range.stop, begin + batch.num_rows)
            if low < high:
                yield low - row_range.start, pa.Table.from_batches(
                    [batch.slice(low - begin, high - low)])
            begin += batch.num_rows
            if begin >= row_range.stop:
                return


def _small_dictionaries(metadata, columns):
    """The columns among `columns` of a file of Parquet `metadata` whose every row group has a
    dictionary page under SMALL_DICTIONARY_PAGE bytes."""
    small = set(columns)
    for group in range(metadata.num_row_groups):
        row_group = metadata.row_group(group)
        for index in range(row_group.num_columns):
            chunk = row_group.column(index)
            if chunk.path_in_schema in small and not (
                    chunk.has_dictionary_page and chunk.physical_type == "BYTE_ARRAY"
                    and chunk.data_page_offset - chunk.dictionary_page_offset
                    < SMALL_DICTIONARY_PAGE):
                small.discard(chunk.path_in_schema)
    return sorted(small)


@dataclasses.dataclass(frozen=True)
class Side:
    """Which rows of a range a pass reads: every row (`test_fraction` None), or one side of the
    hashed train/test split."""

    test_fraction: float = None
    want_test: bool = False

    def keep(self, row_range):
        """bool [rows of the range]."""
        numbers = row_range.row_numbers()
        if self.test_fraction is None:
            return np.ones(len(numbers), bool)
        in_test = in_test_split(tf.constant(row_range.file_index, tf.int64),
                                tf.constant(numbers), self.test_fraction).numpy()
        return in_test if self.want_test else ~in_test


class RowReader:
    """Checked blocks of the rows of one set of files, for a data set of `text_format`.

    `bad_rows` records the bad rows each (side, range) read held, when they are skipped."""

    def __init__(self, files, text_format, skip_bad, chunk_rows):
        self.files = files
        self._format = text_format
        self._skip_bad = skip_bad
        self._chunk_rows = chunk_rows
        self.bad_rows = {}

    def blocks(self, side, row_range):
        """(CheckedRows of the good rows, their derived ids int64 [n, E], bad rows skipped) of
        `row_range` on `side`, block by block. A bad row raises the data error naming it unless
        bad rows are skipped."""
        for _, (block, derived), bad_rows in self.checked_blocks(side, [row_range]):
            yield block, derived, bad_rows

    def checked_blocks(self, side, ranges, finish=lambda block, derived: (block, derived)):
        """(RowRange, finish(CheckedRows of the good rows, their derived ids), bad rows skipped)
        of each block of `ranges` on `side`, in order; blocks are checked and finished ahead in
        threads (read_ahead.ordered_ahead) while the caller uses the ones before."""

        def work(piece):
            row_range, block, derived, bad_rows = self._checked(piece)
            return row_range, finish(block, derived), bad_rows

        skipped = collections.Counter()
        last = None
        for row_range, result, bad_rows in read_ahead.ordered_ahead(
                work, self._pieces(side, ranges)):
            if self._skip_bad and last is not None and row_range != last:
                self.bad_rows[side, last] = skipped[last]
            last = row_range
            skipped[row_range] += bad_rows
            yield row_range, result, bad_rows
        if self._skip_bad and last is not None:
            self.bad_rows[side, last] = skipped[last]

    def _pieces(self, side, ranges):
        """(RowRange, Arrow table of a block's rows on `side`, their row numbers) of each block
        of `ranges`, in order, decoded as it is wanted."""
        for row_range in ranges:
            keep = side.keep(row_range)
            numbers = row_range.row_numbers()
            for begin, rows in self.files.read(row_range, self._chunk_rows):
                end = begin + rows.num_rows
                selected = keep[begin:end]
                if not selected.all():
                    rows = rows.filter(pa.array(selected))
                yield row_range, rows, numbers[begin:end][selected]

    def _checked(self, piece):
        """(RowRange, CheckedRows of the good rows, derived ids, bad rows) of one piece; the
        data error of its first bad row unless bad rows are skipped."""
        row_range, rows, numbers = piece
        files = self.files
        block = check_rows(rows, files.column_map, files.has_labels)
        derived = derived_ids(block, self._format)
        bad = block.bad()
        if not bad.any():
            return row_range, block, derived, 0
        if not self._skip_bad:
            row, problem = block.first_problem()
            raise UserError(
                f"{files.paths[row_range.file_index]} row {numbers[row]} "
                f"(row group {row_range.group}): {problem}; fix the file, or skip such rows "
                "with `on_bad_line='skip'`")
        return row_range, block.rows(~bad), derived[~bad], int(bad.sum())

    def raw_blocks(self, side, ranges, encoder):
        """The raw columns of the blocks of rows (tfscale.data.handover.raw_columns: labels,
        dense, dense_present, derived, bad_lines, and the categorical columns' ids by `encoder`,
        a preprocessing.HashingEncoder or a vocabulary.VocabularyEncoder), one element per
        block, as a tf.data.Dataset: blocks checked and encoded ahead in threads."""

        def encoded(block, derived):
            return block, derived, block.categorical.ids(encoder)

        def elements():
            try:
                for _, (block, derived, ids), bad_rows in self.checked_blocks(side, ranges,
                                                                              encoded):
                    yield handover.element(block.labels, block.integers, block.present, ids,
                                           derived, bad_rows)
            except UserError as error:  # marked to be known again on its way through tf.data
                raise UserError(f"{DATA_ERROR_MARKER}{error}") from None

        return handover.raw_columns(elements, self._format)

    def rows_in(self, side, row_range):
        """The rows of `row_range` a pass reads: those on `side`, less the bad ones when they
        are skipped (found by reading the range)."""
        if not self._skip_bad:
            return int(side.keep(row_range).sum())
        return sum(len(block.labels) for block, _, _ in self.blocks(side, row_range))

    def lines(self, side, count):
        """The first `count` good rows on `side` (fewer when there are fewer) as lines: label
        (when the files have it), then integers, `derived_from` and categorical fields. Rows
        holding the delimiter or a line end in a text field, which no line can carry, are passed
        over; a bad row among them stops as reading does, unless bad rows are skipped."""
        delimiter = self._format.delimiter
        lines = []
        for row_range in self.files.ranges():
            for block, _, _ in self.blocks(side, row_range):
                texts = np.concatenate([block.derived_from.strings(),
                                        block.categorical.strings()], axis=1)
                for row in range(len(block.labels)):
                    if any(delimiter.encode() in text or b"\n" in text for text in texts[row]):
                        continue
                    fields = [str(int(block.labels[row]))] if self.files.has_labels else []
                    fields += [str(value) if present else "" for value, present
                               in zip(block.integers[row], block.present[row])]
                    fields += [text.decode("utf-8", "replace") for text in texts[row]]
                    lines.append(delimiter.join(fields))
                    if len(lines) == count:
                        return lines
        return lines


class ParquetSource(CTRSource):
    """A CTRSource reading Parquet files holding the rows of the data set described by
    `FORMAT` (a TextFormat: its label, integer features and categorical fields), one column per
    field.

    Column types: the label 0 or 1 as integers, booleans or floats; an integer feature as
    integers, floats that are integers (NaN = missing), or integers as text; a categorical field
    as text, bytes or integers (integers are read as their decimal text, so 42 and "42" get one
    id), or a dictionary of them. A null is a missing value (row 0 of a categorical field, 0 for
    an integer), as an empty field is in a line. Other columns are not read.

    Args:
      train_paths: path, glob, or list of them. Must hold the label column.
      test_paths: the same for the test split (all with the label column, or all without); None
        splits the train rows by a fixed hash of (file, row number), as DelimitedTextSource
        splits lines.
      columns: {field: column} for fields whose column has another name, e.g.
        `{"label": "clicked", "I1": "int_1"}`; other fields are read from the column of their own
        name.
      on_bad_line: "error" stops at the first bad row (a null or other label than 0 or 1, an
        integer feature that is not an integer of int64's range, a bad value of a derived field)
        with a data error naming file, row, row group and column; "skip" drops bad rows and
        counts them (see bad_line_count).
      chunk_rows: rows checked and converted together.

    `test_fraction`, `vocabulary`, `hash_buckets`, `dense_transform`, `preprocessing`,
    `shuffle_buffer` and `seed` are DelimitedTextSource's (`shuffle_buffer` shuffles the order of
    the row groups each epoch, then rows within windows of that many rows).

    Example:
        ```python
        source = tfscale.data.CriteoParquet("part-*.parquet", columns={"label": "click"},
                                            hash_buckets=1_000_000)
        train = tfscale.data.rank_batches(source, 65536)  # each rank its slice of the rows
        ```
    """

    FORMAT = None  # a TextFormat
    COLUMNS = None  # the column mapping when `columns` is not given (see with_columns)
    on_short_line = "missing"  # how a model trained on these rows reads short lines it serves

    def __init__(self, train_paths, test_paths=None, *, columns=None, test_fraction=0.1,
                 vocabulary=None, hash_buckets=None, dense_transform=None, preprocessing=None,
                 shuffle_buffer=0, seed=0, on_bad_line="error", chunk_rows=CHUNK_ROWS):
        fmt = self.FORMAT
        check_bad_line_policy(on_bad_line)
        self.column_map = ColumnMap(fmt, self.COLUMNS if columns is None else columns)
        skip_bad = on_bad_line == "skip"
        self._train = RowReader(ParquetFiles(train_paths, self.column_map), fmt, skip_bad,
                                int(chunk_rows))
        if not self._train.files.has_labels:
            raise UserError(f"{self._train.files.paths[0]}: training files need the label "
                            f"column {self.column_map.column[fmt.label_name]!r} and this one has "
                            "none (a test file?); if yours has another name, give it with "
                            "`columns={'label': 'your_label_column'}`")
        self._test = None if test_paths is None else RowReader(
            ParquetFiles(test_paths, self.column_map), fmt, skip_bad, int(chunk_rows))
        self._test_fraction = held_out_fraction(test_paths, test_fraction)
        self._skip_bad_rows = skip_bad
        self._shuffle_buffer = int(shuffle_buffer)
        self._seed = int(seed)
        self._train_rows_per_shard = {}  # num_shards -> train rows per shard
        self.preprocessing = source_preprocessing(
            fmt, preprocessing, vocabulary=vocabulary, hash_buckets=hash_buckets,
            dense_transform=dense_transform)
        self.schema = self.preprocessing.schema

    @property
    def train_layout(self):
        """The lines a model trained on these rows scores (score_lines): the label, then the
        fields its preprocessing reads, in `FORMAT.input_names()` order."""
        return LineLayout((self.FORMAT.label_name,) + self.FORMAT.input_names())

    @property
    def test_has_labels(self):
        """False when the test files have no label column (their labels are then all 0)."""
        return self._test_reader()[0].files.has_labels

    # -- CTRSource

    def train_batches(self, batch_size, *, epoch=0, skip_batches=0, shard_index=0, num_shards=1):
        ranges = self._train.files.ranges(shard_index, num_shards)
        if self._shuffle_buffer:
            order = np.random.default_rng(shuffle_seed(self._seed, epoch)).permutation(
                len(ranges))
            ranges = [ranges[i] for i in order]
        rows = self._rows(self._train, Side(self._test_fraction, False), ranges)
        if self._shuffle_buffer:
            rows = shuffle_windows(rows, self._shuffle_buffer, shuffle_seed(self._seed, epoch))
        batches = rows.rebatch(batch_size, drop_remainder=True)
        return without_autotuning(batches.skip(skip_batches).prefetch(tf.data.AUTOTUNE))

    def test_batches(self, batch_size, *, shard_index=0, num_shards=1):
        reader, side = self._test_reader()
        rows = self._rows(reader, side, reader.files.ranges(shard_index, num_shards))
        return without_autotuning(rows.rebatch(batch_size).prefetch(tf.data.AUTOTUNE))

    def train_steps_per_epoch(self, batch_size, num_shards=1):
        """Full batches per epoch that every shard can read (the smallest shard's count): each
        shard's train rows from the files' metadata and the split's hash, less, with
        on_bad_line="skip", its bad rows, found in one pass over the files (cached)."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        if num_shards not in self._train_rows_per_shard:
            side = Side(self._test_fraction, False)
            self._train_rows_per_shard[num_shards] = [
                sum(self._train.rows_in(side, row_range)
                    for row_range in self._train.files.ranges(shard, num_shards))
                for shard in range(num_shards)]
        return min(self._train_rows_per_shard[num_shards]) // batch_size

    def bad_line_count(self):
        """Bad rows among the rows this process has read (on_bad_line="skip"), each counted
        once however many epochs read it."""
        return sum(sum(reader.bad_rows.values()) for reader in (self._train, self._test)
                   if reader is not None)

    def describe(self):
        if self._test:
            test = self._test.files.describe()
        elif self._test_fraction is None:
            test = "the train rows themselves"
        else:
            test = f"{self._test_fraction:g} of the train rows by row hash"
        mapping = self.column_map.columns
        columns = (f"; columns {', '.join(f'{k}={v}' for k, v in mapping.items())}" if mapping
                   else "")
        return (f"{type(self).__name__}: train {self._train.files.describe()} "
                f"({self._train.files.num_rows:,} rows), test {test}{columns}; "
                f"{self.preprocessing.describe()}; on bad rows: "
                f"{'skip' if self._skip_bad_rows else 'error'}")

    def test_lines(self, count):
        """The first `count` good rows of the test split (fewer when it is shorter) as lines of
        `train_layout` (without the label for test files without it), in order; rows holding
        the delimiter or a line end in a text field are passed over."""
        reader, side = self._test_reader()
        return reader.lines(side, count)

    # -- reading

    def _test_reader(self):
        """(RowReader, Side) of the test split."""
        if self._test is not None:
            return self._test, Side()
        return self._train, Side(self._test_fraction, self._test_fraction is not None)

    def _rows(self, reader, side, ranges):
        """Batches of variable size (one per block) of the rows of `ranges` on `side`, as
        (features, labels)."""
        preprocessing = self.preprocessing

        def finish(raw):
            return preprocessing.features(raw), tf.expand_dims(raw["labels"], 1)

        return reader.raw_blocks(side, ranges, preprocessing.encoder).map(
            finish, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)

    # -- vocabulary

    @classmethod
    def build_vocabulary(cls, paths, *, columns=None, min_count=1, on_bad_line="error",
                         on_short_line="missing", test_fraction=None, chunk_rows=CHUNK_ROWS,
                         progress=None, memory_mb=None):
        """Count categorical values and integer ranges in one pass over `paths` (only the train
        side of the `test_fraction` split when given), split over the ranks by row ranges under
        horovodrun, in about `memory_mb` MB of counts (tfscale.data.vocabulary_pass);
        `progress(rows counted)` is called now and then. `on_short_line` is taken as the text
        readers take it and has no effect: rows have every field."""
        from tfscale.data import vocabulary_pass  # the counting shared with text files

        del on_short_line
        check_bad_line_policy(on_bad_line)
        fmt = cls.FORMAT
        files = ParquetFiles(paths, ColumnMap(fmt, cls.COLUMNS if columns is None else columns))
        reader = RowReader(files, fmt, on_bad_line == "skip", int(chunk_rows))
        blocks = reader.checked_blocks(Side(test_fraction),
                                       files.ranges(distributed.rank(), distributed.size()))
        return vocabulary_pass.count_blocks(
            fmt, ((block, bad_rows) for _, (block, _), bad_rows in blocks),
            min_count=min_count, progress=progress,
            memory_mb=memory_mb or vocabulary_pass.DEFAULT_MEMORY_MB)

    @classmethod
    def with_columns(cls, columns):
        """This reader with `columns` as its `COLUMNS`, as a class, for code that takes a
        reader class (the launcher's cached vocabulary)."""
        return type(cls.__name__, (cls,), {"COLUMNS": dict(columns or {}),
                                           "__doc__": cls.__doc__})
