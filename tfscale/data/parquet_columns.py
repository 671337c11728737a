"""The columns of a Parquet file read as the fields of a data set (Criteo, Avazu, ...).

Owns: the column mapping (a field's name -> the file's column), which Arrow types each kind of
field takes, the checks of a block of rows with their messages, and turning checked rows into
plain arrays (labels, integers with their presence), categorical columns encoded into ids where
Arrow holds them (Categorical), and other text columns handed to TensorFlow as one buffer of
bytes with offsets (Texts). The text readers' blocks, parsed by pyarrow, are checked here too
(tfscale.data.text_blocks). A null is a missing value, as an empty
field is in a line; so are an empty text and, in a floating point column of integers, NaN (what
pandas writes for the gaps of an integer column). A bad value (a label other than 0 or 1, an
integer feature that is not an integer of int64's range) makes its row a bad row.
"""

import dataclasses
import re

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import tensorflow as tf

import tfscale.data._kernels as _kernels
from tfscale.data import aligned
from tfscale.data.schema import MISSING_ID
from tfscale.data.text_lines import INT64_PATTERN, INT64_RANGE, Fields, LineLayout
from tfscale.data.value_counts import distinct_counts
from tfscale.errors import UserError

LABEL, INTEGER, TEXT = "label", "integer", "text"  # the kinds of field
_SHOWN_VALUE_CHARS = 40  # a bad text value is quoted in an error message up to this length
_SYNTAX = "[+-]?[0-9]+"  # an integer's digits, in range or not
_TAKES = {
    LABEL: "a label column holds 0 and 1 as integers, booleans or floating point numbers",
    INTEGER: "an integer feature's column holds integers, floating point numbers that are "
             "integers (NaN = missing, as pandas writes an integer column with gaps), or "
             "integers as text",
    TEXT: "a categorical column holds text, bytes or integers (or a dictionary of them)",
}


def _is_text(arrow_type):
    return (pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type)
            or pa.types.is_string_view(arrow_type) or pa.types.is_binary(arrow_type)
            or pa.types.is_large_binary(arrow_type))


def _takes(kind, arrow_type):
    """Whether a column of `arrow_type` can hold a field of `kind`."""
    if kind == LABEL:
        return (pa.types.is_integer(arrow_type) or pa.types.is_boolean(arrow_type)
                or pa.types.is_floating(arrow_type))
    if kind == INTEGER:
        return (pa.types.is_integer(arrow_type) or pa.types.is_floating(arrow_type)
                or pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type))
    if pa.types.is_dictionary(arrow_type):
        arrow_type = arrow_type.value_type
    return _is_text(arrow_type) or pa.types.is_integer(arrow_type)


class ColumnMap:
    """The fields of `text_format`'s rows and the columns of a file holding them.

    Args:
      text_format: the TextFormat whose fields are read (its label, its integer features
        `dense_names`, the text columns its derived fields come from, `derived_from`, and its
        categorical fields).
      columns: {field name: column name} for the fields whose column has another name; any
        field not named is read from the column of its own name.
    """

    def __init__(self, text_format, columns=None):
        columns = dict(columns or {})
        kinds = {text_format.label_name: LABEL}
        kinds.update((name, INTEGER) for name in text_format.dense_names)
        kinds.update((name, TEXT) for name in text_format.derived_from
                     + tuple(text_format.categorical_names) if name not in kinds)
        unknown = [name for name in columns if name not in kinds]
        if unknown:
            raise UserError(f"`columns` maps {', '.join(map(repr, unknown))}, not a field of "
                            f"{text_format.name} rows; its fields are {', '.join(kinds)}")
        malformed = [name for name, column in columns.items()
                     if not isinstance(column, str) or not column]
        if malformed:
            raise UserError(f"`columns` maps {', '.join(map(repr, malformed))} to no column "
                            "name; give each field the name of its column, as a string")
        self.text_format = text_format
        self.kinds = kinds
        self.columns = columns
        self.column = {name: columns.get(name, name) for name in kinds}
        by_column = {}
        for name, column in self.column.items():
            if column in by_column:
                raise UserError(f"`columns` reads both {by_column[column]} and {name} from the "
                                f"column {column!r}; give each field a column of its own")
            by_column[column] = name

    def names(self, kind):
        """The fields of `kind`, in the order of a served line."""
        return tuple(name for name, field_kind in self.kinds.items() if field_kind == kind)

    def describe(self, name):
        """How a message names field `name`: its column, and the field when they differ."""
        column = self.column[name]
        return f"column {column!r}" + ("" if column == name else f" ({name})")

    def check_schema(self, path, schema):
        """Whether the file `path` of Arrow `schema` holds the label column; a UserError naming
        the file and column if a feature's column is missing or of a type its field does not
        take."""
        missing = [name for name, kind in self.kinds.items()
                   if kind != LABEL and self.column[name] not in schema.names]
        if missing:
            shown = ", ".join(repr(self.column[name]) for name in missing[:5])
            more = f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""
            example = missing[0]
            raise UserError(
                f"{path}: no column {shown}{more}; a {self.text_format.name} file needs a column "
                f"per field. If yours has other names, map each field to its column, e.g. "
                f"`columns={{{example!r}: 'your_column'}}`")
        for name, kind in self.kinds.items():
            column = self.column[name]
            if column in schema.names and not _takes(kind, schema.field(column).type):
                raise UserError(f"{path}: {self.describe(name)} is of type "
                                f"{schema.field(column).type}; {_TAKES[kind]}. Cast it when "
                                "writing the file, or map the field to another column with "
                                "`columns`")
        return self.column[self.text_format.label_name] in schema.names


@dataclasses.dataclass
class Problem:
    """One check of a block of rows: `bad` bool [n] per row, `describe(row)` the problem of a
    bad row (built only for an error message)."""

    bad: np.ndarray
    describe: object


@dataclasses.dataclass
class Texts:
    """Text columns of a block of rows as Arrow binary arrays, one per column (a null: the
    missing value, read as b""). Handed to TensorFlow as their bytes and each value's place in
    them (`flat`), so no value becomes a Python object: TensorFlow cuts the values out of the
    bytes with one `tf.strings.substr` (`as_tensor`)."""

    columns: list
    rows: int

    def strings(self):
        """object [n, K] of bytes (a null: b"")."""
        texts = np.empty([self.rows, len(self.columns)], object)
        for k, column in enumerate(self.columns):
            texts[:, k] = _numpy(pc.fill_null(column, b""))
        return texts

    def take(self, keep):
        """The rows where `keep` (bool [n]) holds."""
        mask = pa.array(keep)
        return Texts([column.filter(mask) for column in self.columns], int(np.sum(keep)))

    def flat(self):
        """(bytes, offsets): the values of every column one after another (a null: b""), value
        [row, k] being bytes[offsets[k * n + row]:offsets[k * n + row + 1]]; offsets int32
        [K * n + 1]. Arrow joins them in its own memory: no value becomes a Python object."""
        joined = pa.concat_arrays([pc.fill_null(column, b"") for column in self.columns]
                                  or [pa.array([], pa.binary())])
        offsets = np.frombuffer(joined.buffers()[1], np.int32)[
            joined.offset:joined.offset + len(joined) + 1]
        data = joined.buffers()[2]
        return (b"" if data is None else data.to_pybytes()), offsets

    def as_tensor(self):
        """The values as a tf.string tensor [n, K] (eagerly)."""
        return strings_tensor(*self.flat(), self.rows, len(self.columns))


@dataclasses.dataclass
class Categorical:
    """Categorical columns of a block of rows, each a list of Arrow arrays (a column's chunks):
    text, bytes or integers (read as their decimal text), or a dictionary of them as Parquet's
    dictionary pages and pandas' categoricals give. A null or an empty value is the missing
    value.

    Encoded where Arrow holds them (`ids`): each value's fingerprint computed from Arrow's
    buffers and turned into its id by the encoder's twin of its TensorFlow encoding, in one pass
    of a C kernel without the GIL (tfscale.data.fingerprint), a dictionary's values once: no
    value becomes a string tensor."""

    columns: list
    rows: int

    @classmethod
    def of(cls, columns, rows):
        """The Categorical of Arrow arrays or chunked arrays `columns`, each of `rows` rows."""
        return cls([_chunks(column) for column in columns], rows)

    def ids(self, encoder):
        """int64 [n, C]: the ids `encoder` (a preprocessing.HashingEncoder or a
        vocabulary.VocabularyEncoder) gives the values of column k as field k."""
        ids = aligned.empty([self.rows, len(self.columns)], np.int64)  # as TensorFlow takes it
        for k, chunks in enumerate(self.columns):
            row = 0
            for chunk in chunks:
                _encode_chunk(chunk, encoder, k, ids[row:row + len(chunk), k])
                row += len(chunk)
        return ids

    def value_counts(self):
        """(fields int16 [V], values Arrow binary [V], counts int64 [V]): each column's distinct
        non-empty values with the rows holding them, column k as field k."""
        return distinct_counts([pa.chunked_array([_binary(chunk) for chunk in chunks],
                                                 pa.binary()) for chunks in self.columns])

    def strings(self):
        """object [n, C] of bytes (a null: b"")."""
        texts = np.empty([self.rows, len(self.columns)], object)
        for k, chunks in enumerate(self.columns):
            texts[:, k] = _numpy(pc.fill_null(_binary(pa.chunked_array(chunks)), b""))
        return texts

    def take(self, keep):
        """The rows where `keep` (bool [n]) holds."""
        mask = pa.array(keep)
        return Categorical([_chunks(pa.chunked_array(chunks).filter(mask))
                            for chunks in self.columns], int(np.sum(keep)))


def _chunks(column):
    """The chunks of an Arrow array or chunked array: one, unless they are dictionaries (each
    of its own)."""
    if (isinstance(column, pa.ChunkedArray) and pa.types.is_dictionary(column.type)
            and column.num_chunks):
        return column.chunks
    return [_one_array(column)]


def _encode_chunk(chunk, encoder, field, out):
    """Writes the int64 ids of one chunk of a categorical column into `out` [n] (a column of the
    block's ids), a dictionary's values encoded once, then taken by each row's index."""
    if not pa.types.is_dictionary(chunk.type):
        encoder.encode_arrow(_binary(chunk), field, out)
        return
    values = np.empty(len(chunk.dictionary), np.int64)
    encoder.encode_arrow(_binary(chunk.dictionary), field, values)
    indices = chunk.indices
    validity, at = indices.buffers()
    at = np.frombuffer(at, indices.type.to_pandas_dtype())[
        indices.offset:indices.offset + len(indices)]
    _kernels.take(values, at, validity if indices.null_count else None, indices.offset,
                  MISSING_ID, out)


def _one_array(column):
    """An Arrow Array of the values of an Array or ChunkedArray (a single chunk not copied)."""
    if not isinstance(column, pa.ChunkedArray):
        return column
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


def strings_tensor(data, offsets, rows, columns):
    """The tf.string [rows, columns] of `Texts.flat`'s (bytes, offsets): one substr over the
    bytes (TensorFlow's C++ kernel, inside a tf.data map or eagerly)."""
    starts = tf.transpose(tf.reshape(offsets[:-1], [columns, rows]))  # int32: cheap to move
    ends = tf.transpose(tf.reshape(offsets[1:], [columns, rows]))
    return tf.strings.substr(data, starts, ends - starts)


@dataclasses.dataclass
class CheckedRows:
    """A block of rows as arrays (bad rows still in), and the problems found in them.

    labels float32 [n] (0 for a file without labels), integers int64 [n, D] (0 where missing or
    bad), present bool [n, D], derived_from: Texts of K columns, categorical: Categorical of C
    columns."""

    labels: np.ndarray
    integers: np.ndarray
    present: np.ndarray
    derived_from: Texts
    categorical: Categorical
    problems: list

    def bad(self):
        """bool [n]: the rows with any problem."""
        bad = np.zeros(len(self.labels), bool)
        for problem in self.problems:
            bad |= problem.bad
        return bad

    def first_problem(self):
        """(row, what is wrong) of the first bad row, the first problem found in it."""
        row = int(np.flatnonzero(self.bad())[0])
        return row, next(p.describe(row) for p in self.problems if p.bad[row])

    def rows(self, keep):
        """The rows where `keep` (bool [n]) holds, without the problems."""
        return CheckedRows(
            self.labels[keep], self.integers[keep], self.present[keep],
            self.derived_from.take(keep), self.categorical.take(keep), [])


def check_rows(table, column_map, has_labels):
    """The CheckedRows of Arrow `table`, whose columns are those `column_map` names."""
    rows = table.num_rows
    problems = []
    labels = np.zeros(rows, np.float32)
    if has_labels:
        name = column_map.text_format.label_name
        labels, problem = _label(table.column(column_map.column[name]), column_map.describe(name))
        problems.append(problem)
    integers, present = [], []
    for name in column_map.names(INTEGER):
        values, found, problem = _integers(table.column(column_map.column[name]),
                                           column_map.describe(name))
        integers.append(values)
        present.append(found)
        problems.append(problem)
    derived_from = column_map.text_format.derived_from
    categorical = [name for name in column_map.names(TEXT) if name not in derived_from]
    return CheckedRows(
        labels=labels,
        integers=_stacked(integers, rows, np.int64),
        present=_stacked(present, rows, bool),
        derived_from=_texts(table, column_map, derived_from),
        categorical=Categorical.of(
            [table.column(column_map.column[name]) for name in categorical], rows),
        problems=problems,
    )


def derived_ids(block, text_format):
    """The derived ids of `block`'s rows (int64 [n, E]), from its `derived_from` columns; the
    format's extra checks of those columns join the block's problems."""
    if not text_format.derived_from:
        return np.zeros([len(block.labels), 0], np.int64)
    ids, checks = derived_from_values(block.derived_from.as_tensor(), text_format)
    for check in checks:
        block.problems.append(Problem(
            check.bad.numpy(), lambda row, check=check: check.describe(row).numpy().decode()))
    return ids


def derived_from_values(values, text_format):
    """(int64 [n, E] derived ids, the format's extra checks, text_lines.Check) of `values`, the
    tf.string [n, K] values of `text_format`'s `derived_from` columns."""
    fields = Fields(values, LineLayout(tuple(text_format.derived_from)))
    return text_format.derived_ids(fields).numpy(), text_format.extra_checks(fields)


def _stacked(columns, rows, dtype):
    return np.stack(columns, axis=1) if columns else np.zeros([rows, 0], dtype)


def _texts(table, column_map, names):
    """The Texts of the columns holding the fields `names`."""
    return Texts([_binary(table.column(column_map.column[name])) for name in names],
                 table.num_rows)


def _numpy(array):
    return array.to_numpy(zero_copy_only=False)


def _label(column, name):
    """(float32 [n] labels, Problem): a label must be 0 or 1."""
    values = pc.cast(column, pa.float64())
    valid = pc.fill_null(pc.or_(pc.equal(values, 0.0), pc.equal(values, 1.0)), False)
    labels = _numpy(pc.fill_null(values, 0.0)).astype(np.float32)

    def describe(row):
        value = column[row].as_py()
        return f"{name} must be 0 or 1, found {'null' if value is None else value}"

    return labels, Problem(~_numpy(valid), describe)


def _integers(column, name):
    """(int64 [n] values, bool [n] present, Problem) of an integer feature's column."""
    arrow_type = column.type
    if pa.types.is_floating(arrow_type):
        present = pc.and_(pc.is_valid(column), pc.invert(pc.fill_null(pc.is_nan(column), True)))
        values = pc.fill_null(column, 0.0)
        integral = pc.and_(pc.equal(pc.floor(values), values),
                           pc.and_(pc.greater_equal(values, -2.0**63), pc.less(values, 2.0**63)))
        good = pc.and_(present, integral)
        bad = pc.and_(present, pc.invert(integral))
        integers = pc.cast(pc.if_else(good, values, 0.0), pa.int64())
    elif pa.types.is_integer(arrow_type):
        present = pc.is_valid(column)
        if arrow_type == pa.uint64():
            bad = pc.fill_null(pc.greater(column, pa.scalar(2**63 - 1, pa.uint64())), False)
        else:
            bad = pa.array(np.zeros(len(column), bool))
        integers = pc.cast(pc.fill_null(column, 0), pa.int64(), safe=False)  # bad rows wrap
    else:  # integers as text, checked as a line's are
        present = pc.greater(pc.fill_null(pc.utf8_length(column), 0), 0)
        integral = pc.fill_null(pc.match_substring_regex(column, f"^{INT64_PATTERN}$"), False)
        bad = pc.and_(present, pc.invert(integral))
        good = pc.and_(present, integral)
        integers = pc.cast(pc.utf8_ltrim(pc.if_else(good, column, "0"), "+"), pa.int64())

    def describe(row):
        value = column[row].as_py()
        if isinstance(value, str):
            shown, integer = f"'{value[:_SHOWN_VALUE_CHARS]}'", re.fullmatch(_SYNTAX, value)
        else:
            shown, integer = repr(value), abs(value) >= 2.0**63 or value == int(value)
        if not integer:
            return f"{name} must be an integer, found {shown}"
        return f"{name} must be an integer in int64's range ({INT64_RANGE}), found {shown}"

    return _numpy(integers), _numpy(present), Problem(_numpy(bad), describe)


def _binary(column):
    """A text column as one binary Array (integers as their decimal text)."""
    arrow_type = column.type
    if pa.types.is_dictionary(arrow_type):
        arrow_type = arrow_type.value_type
        column = pc.cast(column, arrow_type)
    if pa.types.is_integer(arrow_type):
        column = pc.cast(column, pa.string())
    column = _one_array(column)
    if column.type == pa.string():
        return column.view(pa.binary())  # the same buffers
    return pc.cast(column, pa.binary())
