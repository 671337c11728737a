"""The shared line machinery of the delimited-text CTR readers (Criteo TSV, Avazu CSV).

Owns: resolving and checking input paths, streaming numbered chunks of lines with tf.data, the
train/test split, sharding by line number and the epoch shuffles, splitting lines into fields,
and per-line checks that stop with an error naming file and line (or skip and count the bad
lines; lines missing only trailing fields read them as missing and are counted). The CTRSource
over these lines is tfscale.data.delimited_text's; encoding the parsed columns into features is
tfscale.data.preprocessing's.

Every step works on whole chunks of lines (vectorised string ops), mapped in parallel and in order,
so reading is fast and deterministic. The pipelines hold no stateful op (no variable, lookup table
or py_function): under tf.config.experimental.enable_op_determinism, which the launcher turns on,
tf.data would otherwise run every map of the pipeline serially.
"""

import collections
import dataclasses
import glob
import gzip
import os
import re

import numpy as np
import tensorflow as tf

from tfscale.data.preprocessing import is_present
from tfscale.errors import DATA_ERROR_MARKER, UserError

CHUNK_LINES = 4096  # lines parsed together by one vectorised map call
BAD_LINE_POLICIES = ("error", "skip")  # a malformed line stops the run, or is skipped and counted
# A line missing only trailing fields: those fields are read as missing (and the line counted),
# or it is a malformed line like any other.
SHORT_LINE_POLICIES = ("missing", "error")
PARQUET_MAGIC = "PAR1"  # the first bytes of a Parquet file
LAYOUT_SAMPLE_LINES = 1000  # a file's layout is told from its header or its first data lines
INT64_RANGE = "-9223372036854775808 to 9223372036854775807"


def _at_most(limit):
    """A regex of the decimal numbers with as many digits as `limit` that are at most `limit`."""
    alternatives = [limit]
    for i, digit in enumerate(limit):
        if digit != "0":
            alternatives.append(f"{limit[:i]}[0-{int(digit) - 1}][0-9]{{{len(limit) - i - 1}}}")
    return "|".join(alternatives)


_INTEGER_SYNTAX = r"[+-]?[0-9]+"
# An integer in int64's range: up to 18 digits, or 19 up to the limit of its sign.
INT64_PATTERN = (f"(?:\\+?0*(?:[0-9]{{1,18}}|{_at_most(str(2**63 - 1))})"
                 f"|-0*(?:[0-9]{{1,18}}|{_at_most(str(2**63))}))")
_SHOWN_VALUE_CHARS = 40  # a bad value is quoted in an error message up to this length


# ----------------------------------------------------------------------------- files

# The automatic vocabulary's cache files carry this in their names (tfscale.data.vocabulary_cache):
# a glob over a data directory never matches them.
VOCABULARY_CACHE_MARK = ".tfscale-vocab-"


def resolve_paths(paths):
    """Expand a path, a glob or a list of them into existing, non-empty files (UserError if not);
    a glob's matches leave out the automatic vocabulary's cache files kept beside the data."""
    patterns = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    if not patterns:
        raise UserError("no input files given")
    files = []
    for pattern in map(os.fspath, patterns):
        if glob.has_magic(pattern):
            matches = sorted(match for match in glob.glob(pattern)
                             if VOCABULARY_CACHE_MARK not in os.path.basename(match))
            if not matches:
                raise UserError(f"{pattern}: no file matches this pattern")
            files.extend(matches)
        else:
            files.append(pattern)
    for path in files:
        if not os.path.exists(path):
            raise UserError(f"{path}: no such file")
        if not os.path.isfile(path):
            raise UserError(f"{path}: not a file")
        if os.path.getsize(path) == 0:
            raise UserError(f"{path}: the file is empty")
    return files


def compression_of(path):
    """The tf.data compression type of a file, from its extension."""
    return "GZIP" if path.endswith(".gz") else ""


def read_first_lines(path, count):
    """The first `count` lines of a (possibly gzipped) file, without line ends; fewer if short."""
    opener = gzip.open if compression_of(path) else open
    lines = []
    try:
        with opener(path, "rb") as stream:
            for raw in stream:
                lines.append(raw.rstrip(b"\r\n").decode("utf-8", "replace"))
                if len(lines) == count:
                    break
    except (OSError, EOFError) as error:
        raise UserError(f"{path}: cannot read the file ({error})") from None
    return lines


@dataclasses.dataclass(frozen=True)
class LineLayout:
    """The columns of the lines of one file, by name."""

    column_names: tuple

    @property
    def num_fields(self):
        return len(self.column_names)

    def index(self, name):
        return self.column_names.index(name)


class FileSet:
    """One set of input files (the train or the test files) sharing one layout."""

    def __init__(self, text_format, paths):
        self.paths = resolve_paths(paths)
        self.header_lines = text_format.header_lines
        self.layout = self._common_layout(text_format)
        self.has_labels = text_format.label_name in self.layout.column_names

    def _common_layout(self, text_format):
        layouts = []
        for path in self.paths:
            lines = read_first_lines(path, self.header_lines + LAYOUT_SAMPLE_LINES)
            if lines and lines[0].startswith(PARQUET_MAGIC):
                raise UserError(f"{path}: a Parquet file, not {text_format.name} text; read it "
                                f"with tfscale.data.PARQUET_FORMATS[{text_format.name!r}]")
            if len(lines) <= self.header_lines:
                raise UserError(f"{path}: the file has no data lines")
            layouts.append(text_format.layout(path, lines))
            if layouts[-1] != layouts[0]:
                raise UserError(f"{path}: its columns differ from those of {self.paths[0]}; "
                                "files read together must have the same columns")
        return layouts[0]

    def describe(self):
        more = f" (+{len(self.paths) - 1} files)" if len(self.paths) > 1 else ""
        return self.paths[0] + more

    def chunks(self, order, chunk_lines):
        """(file_index, first_line_number, lines) for consecutive chunks of the files in `order`;
        line numbers are 1-based in the file, counting header lines."""
        header = self.header_lines

        def read_file(file_index, path, compression):
            lines = tf.data.TextLineDataset(path, compression_type=compression, buffer_size=1 << 20)
            chunks = lines.skip(header).batch(chunk_lines).enumerate()
            return chunks.map(
                lambda k, chunk: (file_index, header + 1 + k * chunk_lines, chunk)
            )

        files = tf.data.Dataset.from_tensor_slices((
            tf.constant(order, tf.int64),
            tf.constant([self.paths[i] for i in order]),
            tf.constant([compression_of(self.paths[i]) for i in order]),
        ))
        return files.flat_map(read_file)


# ----------------------------------------------------------------------------- line selection

def mix64(values):
    """A well-mixed 64-bit hash of int64 values (splitmix64 finaliser), as uint64."""
    x = tf.bitcast(values, tf.uint64)
    x = (x ^ tf.bitwise.right_shift(x, tf.constant(30, tf.uint64))) * tf.constant(
        0xBF58476D1CE4E5B9, tf.uint64)
    x = (x ^ tf.bitwise.right_shift(x, tf.constant(27, tf.uint64))) * tf.constant(
        0x94D049BB133111EB, tf.uint64)
    return x ^ tf.bitwise.right_shift(x, tf.constant(31, tf.uint64))


def in_test_split(file_index, line_numbers, test_fraction):
    """Whether each line belongs to the test split: a fixed hash of (file, line number) falls in
    the first `test_fraction` of its range, so the split is the same in every run."""
    key = tf.bitwise.left_shift(file_index, tf.constant(40, tf.int64)) + line_numbers
    unit = tf.cast(tf.bitwise.right_shift(mix64(key), tf.constant(11, tf.uint64)), tf.float64)
    return unit * (1.0 / (1 << 53)) < test_fraction


@dataclasses.dataclass(frozen=True)
class LineSelection:
    """Which lines a pass reads: one side of the hashed train/test split (or every line when
    `test_fraction` is None), then the lines whose number modulo `num_shards` is `shard_index`."""

    test_fraction: float = None
    want_test: bool = False
    shard_index: int = 0
    num_shards: int = 1

    def __call__(self, file_index, line_numbers):
        keep = tf.equal(line_numbers % self.num_shards, self.shard_index)
        if self.test_fraction is not None:
            in_test = in_test_split(file_index, line_numbers, self.test_fraction)
            keep &= in_test if self.want_test else tf.logical_not(in_test)
        return keep


# ----------------------------------------------------------------------------- parsing

Check = collections.namedtuple("Check", "bad describe")
Check.__doc__ = """One rule for lines: `bad` bool [n] per line, `describe(row)` the problem of a
bad row as a scalar string (built only when an error is raised)."""


def quoted(value):
    """A field value for an error message: quoted and cut to a readable length."""
    return tf.strings.join(["'", tf.strings.substr(value, 0, _SHOWN_VALUE_CHARS), "'"])


class Fields:
    """The fields of a chunk of lines, [n, num_fields] strings, looked up by column name."""

    def __init__(self, values, layout):
        self.values = values
        self.layout = layout

    def __getitem__(self, name):
        return self.values[:, self.layout.index(name)]

    def gather(self, names):
        """[n, len(names)] strings of the named columns (a slice when they are adjacent)."""
        indices = [self.layout.index(name) for name in names]
        start = indices[0] if indices else 0
        if indices == list(range(start, start + len(indices))):
            return self.values[:, start:start + len(indices)]
        return tf.gather(self.values, tf.constant(indices, tf.int32), axis=1)

    def masked(self, keep):
        return Fields(tf.boolean_mask(self.values, keep), self.layout)


class TextFormat:
    """What the lines of one data set look like; Criteo and Avazu subclass it."""

    name = None
    delimiter = None
    delimiter_name = None  # for messages: "tab", "comma"
    header_lines = 0
    label_name = None
    dense_names = ()  # integer fields
    categorical_names = ()  # string fields, encoded by hashing or a vocabulary
    derived_fields = ()  # (name, rows) of categorical fields computed from the line, exact ids
    derived_from = ()  # the columns derived_ids reads

    def layout(self, path, first_lines):
        """The LineLayout of a file from its first lines (the header, if the format has one, then
        up to LAYOUT_SAMPLE_LINES data lines; UserError if they fit no known layout)."""
        raise NotImplementedError

    def unlabelled(self, layout):
        """`layout` without the label column (the lines a model is asked to score)."""
        return LineLayout(tuple(n for n in layout.column_names if n != self.label_name))

    def input_names(self):
        """The columns the preprocessing reads, in the order a served model takes them."""
        derived_from = tuple(name for name in self.derived_from if name not in self.dense_names)
        return tuple(self.dense_names) + derived_from + tuple(self.categorical_names)

    def extra_checks(self, fields):
        """Checks beyond field count, label and integers (list of Check). The Parquet readers
        give them (and derived_ids) Fields of the `derived_from` columns only."""
        return []

    def derived_ids(self, fields):
        """int64 [n, len(derived_fields)] ids of the derived fields (row 0 = missing)."""
        return tf.zeros([tf.shape(fields.values)[0], 0], tf.int64)


@dataclasses.dataclass(frozen=True)
class LinesOf:
    """What a LineParser needs to know of the lines it parses: their layout, whether it holds
    the label, and the names errors give (a FileSet's paths, or e.g. "request" in a served
    model)."""

    layout: LineLayout
    has_labels: bool
    paths: tuple


class LineParser:
    """Turns chunks of lines of one FileSet (or LinesOf) into raw columns, checking every line.

    Raw columns: labels float32 [n] (zeros for files without labels), dense float32 [n, D] (the
    integers as read, 0 where missing), dense_present bool [n, D], categorical string [n, C],
    derived int64 [n, E], passthrough string [n, len(passthrough)] (columns handed on unparsed,
    e.g. Avazu's id), bad_lines, an int64 scalar: the malformed lines dropped, and short_lines,
    the lines missing trailing fields that were read as missing values. A bad line stops the
    pipeline with an InvalidArgumentError whose message starts with DATA_ERROR_MARKER and names
    file and line, unless `skip_bad_lines`. With `on_short_line="missing"` a line holding at least
    the label and one more field but missing the fields after them reads those as missing (empty);
    with "error" it is a bad line.
    """

    def __init__(self, text_format, files, skip_bad_lines=False, on_short_line="missing",
                 passthrough=()):
        check_short_line_policy(on_short_line)
        self._format = text_format
        self._files = files
        self._paths = tf.constant(files.paths)
        self._skip_bad_lines = skip_bad_lines
        self._passthrough = tuple(passthrough)
        layout = files.layout
        self._min_fields = layout.num_fields
        if on_short_line == "missing":
            labelled = text_format.label_name in layout.column_names
            self._min_fields = min(layout.num_fields,
                                   (layout.index(text_format.label_name) + 1 if labelled else 0) + 1)
        self._line_pattern = well_formed_line_pattern(text_format, layout, self._min_fields)

    def __call__(self, file_index, line_numbers, lines):
        layout = self._files.layout
        fields, found, bad = self._checked_fields(lines)
        short = tf.logical_and(tf.logical_not(bad), found < layout.num_fields)
        if self._skip_bad_lines:
            fields = fields.masked(tf.logical_not(bad))
        else:
            verdict = self._stop_at_first_bad(fields, found, bad, file_index, line_numbers)
            with tf.control_dependencies([verdict]):
                fields = Fields(tf.identity(fields.values), layout)
        raw = self._columns(fields)
        raw["bad_lines"] = tf.reduce_sum(tf.cast(bad, tf.int64))
        raw["short_lines"] = tf.reduce_sum(tf.cast(short, tf.int64))
        return raw

    def bad_lines_mask(self, lines):
        """Whether each of `lines` is malformed."""
        return self._checked_fields(lines)[2]

    def _checked_fields(self, lines):
        """(Fields, fields found per line, bad bool [n]) of a chunk of lines. Field count, label
        and integers are checked by one regex per line (much cheaper than a check per field);
        the per-field checks run only to describe a bad line."""
        fields, found = split_fields(lines, self._format.delimiter, self._files.layout.num_fields)
        fields = Fields(fields, self._files.layout)
        bad = tf.logical_not(tf.strings.regex_full_match(lines, self._line_pattern))
        bad |= tf.equal(tf.strings.length(lines), 0)  # not a row of missing values
        for check in self._format.extra_checks(fields):
            bad |= check.bad
        return fields, found, bad

    def _checks(self, fields, found):
        fmt, layout = self._format, self._files.layout
        expected, least = layout.num_fields, self._min_fields
        hint = ("" if least < expected else
                " (a line missing only trailing fields reads them as missing with "
                "`on_short_line='missing'`)")
        checks = [Check(
            tf.equal(tf.strings.length(fields.values[:, 0]), 0) & tf.equal(found, 1),
            lambda row: tf.constant("the line is empty"),
        ), Check(
            (found > expected) | (found < least),
            lambda row: tf.strings.join([
                f"expected {expected} {fmt.delimiter_name}-separated fields, found ",
                tf.strings.as_string(found[row]),
                tf.where(found[row] < expected, hint, ""),
            ]),
        )]
        if self._files.has_labels:
            label = fields[fmt.label_name]
            checks.append(Check(
                tf.logical_not((label == "0") | (label == "1")),
                lambda row: tf.strings.join([f"{fmt.label_name} must be 0 or 1, found ",
                                             quoted(label[row])]),
            ))
        if fmt.dense_names:
            checks.append(self._integer_check(fields.gather(fmt.dense_names)))
        return checks + fmt.extra_checks(fields)

    def _integer_check(self, dense):
        bad = is_present(dense) & tf.logical_not(
            tf.strings.regex_full_match(dense, INT64_PATTERN))
        names = tf.constant(self._format.dense_names)

        def describe(row):
            column = tf.argmax(tf.cast(bad[row], tf.int32), output_type=tf.int32)
            value = dense[row, column]
            beyond = tf.strings.regex_full_match(value, _INTEGER_SYNTAX)
            return tf.strings.join([
                names[column], tf.where(beyond, f" must be an integer in int64's range "
                                                f"({INT64_RANGE}), found ",
                                        " must be an integer, found "),
                quoted(value)])

        return Check(tf.reduce_any(bad, axis=1), describe)

    def _stop_at_first_bad(self, fields, found, bad, file_index, line_numbers):
        """An op that raises the data error of the first bad line, if any."""

        def fail():
            checks = self._checks(fields, found)
            row = tf.argmax(tf.cast(bad, tf.int32), output_type=tf.int32)
            problem = checks[-1].describe(row)
            for check in reversed(checks[:-1]):
                problem = tf.where(check.bad[row], check.describe(row), problem)
            message = tf.strings.join([
                DATA_ERROR_MARKER, self._paths[file_index], " line ",
                tf.strings.as_string(line_numbers[row]), ": ", problem,
            ])
            return _raise_invalid_argument(message)

        return tf.cond(tf.reduce_any(bad), fail, lambda: tf.constant(True))

    def _columns(self, fields):
        fmt = self._format
        rows = tf.shape(fields.values)[0]
        if self._files.has_labels:  # checked to be "0" or "1"
            labels = tf.cast(fields[fmt.label_name] == "1", tf.float32)
        else:
            labels = tf.zeros([rows], tf.float32)
        dense = fields.gather(fmt.dense_names)
        present = is_present(dense)
        return {
            "labels": labels,
            "dense": tf.strings.to_number(tf.where(present, dense, "0"), tf.float32),
            "dense_present": present,
            "categorical": fields.gather(fmt.categorical_names),
            "derived": fmt.derived_ids(fields),
            "passthrough": fields.gather(self._passthrough),
        }


def well_formed_line_pattern(text_format, layout, min_fields=None):
    """The regex a well-formed line of `layout` matches in full (the same rules as
    LineParser._checks): its columns (at least the first `min_fields` of them, default all), the
    label 0 or 1, integers empty or INT64_PATTERN, any other field anything but the
    delimiter."""
    delimiter = "\\t" if text_format.delimiter == "\t" else re.escape(text_format.delimiter)

    def column(name):
        if name == text_format.label_name:
            return "[01]"
        if name in text_format.dense_names:
            return f"{INT64_PATTERN}?"
        return f"[^{delimiter}]*"

    columns = [column(name) for name in layout.column_names]
    least = len(columns) if min_fields is None else max(1, int(min_fields))
    pattern = ""
    for optional in reversed(columns[least:]):  # each trailing column may end the line
        pattern = f"(?:{delimiter}{optional}{pattern})?"
    return delimiter.join(columns[:least]) + pattern


def split_fields(lines, delimiter, num_fields):
    """([n, num_fields] strings, fields found per line): short lines padded with "", long ones
    cut; when every line has num_fields fields the split is only reshaped (the fast path)."""
    split = tf.strings.split(lines, delimiter)
    found = split.row_lengths()
    values = tf.cond(
        tf.reduce_all(tf.equal(found, num_fields)),
        lambda: tf.reshape(split.flat_values, [-1, num_fields]),
        lambda: split.to_tensor(default_value="", shape=[None, num_fields]),
    )
    return values, found


def _raise_invalid_argument(message):
    """An op that fails with InvalidArgumentError "...: <message>" (message starting with "[").

    StringToNumber rejects the text and quotes it verbatim in its error; tf.debugging.Assert would
    escape it, and tf.py_function, being stateful, would make the pipeline serial (module doc)."""
    return tf.math.is_nan(tf.strings.to_number(message))


def parsed_chunks(files, parser, selection, order, chunk_lines, finish=lambda raw: raw):
    """`finish(raw columns)` of the lines of `files` (in `order`) that `selection` keeps, one
    element per chunk, parsed in parallel and delivered in order."""

    def parse_chunk(file_index, first_line, lines):
        numbers = first_line + tf.range(tf.size(lines, out_type=tf.int64))
        keep = selection(file_index, numbers)
        return finish(parser(file_index, tf.boolean_mask(numbers, keep),
                             tf.boolean_mask(lines, keep)))

    return files.chunks(order, chunk_lines).map(
        parse_chunk, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


# ----------------------------------------------------------------------------- shuffling

def shuffle_seed(seed, epoch):
    """The shuffle seed of one epoch: a fixed function of (seed, epoch), any integers."""
    entropy = [int(seed) % (1 << 64), int(epoch) % (1 << 64)]
    return int(np.random.SeedSequence(entropy).generate_state(1)[0])


def shuffle_windows(rows, window_rows, seed):
    """Shuffle batched rows within consecutive windows of `window_rows` rows: each window is
    permuted as a whole by a seed from (seed, window index), so it costs one gather per window
    instead of per-row buffer work, and is deterministic."""

    def permute(index, window):
        size = tf.shape(tf.nest.flatten(window)[0])[0]
        order = tf.random.experimental.stateless_shuffle(
            tf.range(size), seed=tf.stack([tf.constant(seed, tf.int64), index]))
        return tf.nest.map_structure(lambda tensor: tf.gather(tensor, order), window)

    return rows.rebatch(window_rows).enumerate().map(
        permute, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def held_out_fraction(test_paths, test_fraction):
    """The fraction of the training rows a source holds out as its test split: None with
    `test_paths` (or `test_fraction` None: no row held out), else `test_fraction`, which must be
    in [0, 1)."""
    if test_paths is not None or test_fraction is None:
        return None
    if not 0.0 <= test_fraction < 1.0:
        raise UserError(f"test_fraction must be in [0, 1) or None, got {test_fraction}")
    return float(test_fraction)


def check_bad_line_policy(on_bad_line):
    """UserError unless `on_bad_line` is one of BAD_LINE_POLICIES."""
    if on_bad_line not in BAD_LINE_POLICIES:
        raise UserError(f"`on_bad_line={on_bad_line!r}`: give one of {', '.join(BAD_LINE_POLICIES)}")


def check_short_line_policy(on_short_line):
    """UserError unless `on_short_line` is one of SHORT_LINE_POLICIES."""
    if on_short_line not in SHORT_LINE_POLICIES:
        raise UserError(f"`on_short_line={on_short_line!r}`: give one of "
                        f"{', '.join(SHORT_LINE_POLICIES)}")
