"""The Avazu (Click-Through Rate Prediction) CSV reader.

Owns what an Avazu line is: a header names the columns (id, click, hour, C1, banner_pos, site_*,
app_*, device_*, C14..C21); `id` is dropped unparsed (it does not fit in int64); `hour`, YYMMDDHH,
becomes two categorical fields with exact ids, hour of day and day of week; every other column is
categorical. No dense features. Test files may lack `click`. Fields are split on commas (the data
has no quoting). Reading, checking, encoding and splitting are in delimited_text and text_lines
(and for Parquet files of the same columns, parquet).
"""

import tensorflow as tf

from tfscale.data.parquet import ParquetSource
from tfscale.data.delimited_text import DelimitedTextSource
from tfscale.data.text_lines import Check, LineLayout, TextFormat, quoted
from tfscale.errors import UserError

LABEL = "click"
HOUR = "hour"
CATEGORICAL_NAMES = (
    "C1", "banner_pos", "site_id", "site_domain", "site_category", "app_id", "app_domain",
    "app_category", "device_id", "device_ip", "device_model", "device_type", "device_conn_type",
    "C14", "C15", "C16", "C17", "C18", "C19", "C20", "C21",
)
# ids: 0 = missing hour, hour of day h -> h + 1, Monday..Sunday -> 1..7.
DERIVED_FIELDS = (("hour_of_day", 25), ("day_of_week", 8))
_HOUR_PATTERN = "[0-9]{8}"
# Sakamoto's day-of-week offsets per month (0 = Sunday).
_MONTH_OFFSETS = (0, 3, 2, 5, 0, 3, 5, 1, 4, 6, 2, 4)


class AvazuFormat(TextFormat):
    """Avazu lines, columns found by name in each file's header."""

    name = "avazu"
    delimiter = ","
    delimiter_name = "comma"
    header_lines = 1
    label_name = LABEL
    categorical_names = CATEGORICAL_NAMES
    derived_fields = DERIVED_FIELDS
    derived_from = (HOUR,)

    def layout(self, path, first_lines):
        columns = tuple(name.strip() for name in first_lines[0].split(self.delimiter))
        missing = [name for name in (HOUR,) + CATEGORICAL_NAMES if name not in columns]
        if missing:
            raise UserError(
                f"{path} line 1: the header lacks the columns {', '.join(missing)}; an Avazu "
                "file starts with a header like id,click,hour,C1,banner_pos,...,C21"
            )
        return LineLayout(columns)

    def extra_checks(self, fields):
        hour = fields[HOUR]
        valid = _valid_hour(hour)
        return [Check(
            (hour != "") & tf.logical_not(valid),
            lambda row: tf.strings.join(["hour must be YYMMDDHH (like 14102100), found ",
                                         quoted(hour[row])]),
        )]

    def derived_ids(self, fields):
        hour = fields[HOUR]
        valid = _valid_hour(hour)
        year, month, day, hour_of_day = _hour_parts(hour, valid)
        day_of_week = _day_of_week(2000 + year, month, day)  # 0 = Sunday
        zero = tf.zeros_like(year)
        return tf.stack([
            tf.where(valid, hour_of_day + 1, zero),
            tf.where(valid, (day_of_week + 6) % 7 + 1, zero),
        ], axis=1)


def _hour_parts(hour, valid):
    """(yy, mm, dd, hh) int64 of YYMMDDHH strings (1, 1, 1, 0 where not `valid`)."""
    value = tf.strings.to_number(tf.where(valid, hour, "00010100"), tf.int64)
    return value // 1000000, value // 10000 % 100, value // 100 % 100, value % 100


def _valid_hour(hour):
    """Whether each string is YYMMDDHH with month 1-12, day 1-31 and hour 0-23."""
    digits = tf.strings.regex_full_match(hour, _HOUR_PATTERN)
    _, month, day, hour_of_day = _hour_parts(hour, digits)
    return (digits & (month >= 1) & (month <= 12) & (day >= 1) & (day <= 31)
            & (hour_of_day <= 23))


def _day_of_week(year, month, day):
    """Day of week (0 = Sunday) of Gregorian dates, Sakamoto's method in integer arithmetic."""
    year = year - tf.cast(month < 3, tf.int64)
    offset = tf.gather(tf.constant(_MONTH_OFFSETS, tf.int64), month - 1)
    return (year + year // 4 - year // 100 + year // 400 + offset + day) % 7


class AvazuCSV(DelimitedTextSource):
    """Avazu CSV files (plain or .gz) as a CTRSource: zero dense fields (features["dense"] is
    [batch, 0]); features["categorical"] holds the 21 string fields (hashing or a vocabulary, see
    DelimitedTextSource) then hour_of_day and day_of_week.

    Args:
        train_paths: a path, glob, or list of them (`.gz` files are read as gzip); labelled.
        test_paths: the same for the test split; None holds out `test_fraction` of the train
            lines (by a fixed hash of file and line number).
        test_fraction: without `test_paths`, the fraction held out (0: an empty test split;
            None: none, the test split is the train split itself).
        vocabulary: a Vocabulary or the path of one saved by `launch.build_vocab`; categorical
            strings are then looked up (row 0 missing, row 1 out of vocabulary).
        hash_buckets: without a vocabulary, hash each categorical field into this many buckets
            (one int, or one per field); ids 1..buckets, 0 = missing.
        dense_transform: "log1p" (the default) or "minmax" (needs a vocabulary).
        preprocessing: a Preprocessing of this format to use instead of one made from
            `vocabulary`, `hash_buckets` and `dense_transform` (which must then be unset).
        shuffle_buffer: 0 reads the train split in file order; otherwise the file order is
            shuffled and rows within windows of this many, by (`seed`, epoch).
        seed: the seed of that shuffle.
        on_bad_line: "error" stops at the first malformed line; "skip" drops and counts them.
        on_short_line: "missing" reads the missing trailing fields of a short line as missing
            values; "error" treats such a line as malformed.
        chunk_lines: lines parsed together by one vectorised step of the passes that count
            rows, bad and short lines.

    Raises:
        UserError: a path or pattern matches no file, a file has no data lines or not the
            format's columns, or the files' columns differ; the training files have no label
            column; `preprocessing` with any of `vocabulary`, `hash_buckets` and
            `dense_transform`, or of another format; an invalid `test_fraction`,
            `hash_buckets`, `dense_transform`, `on_bad_line` or `on_short_line`.

    Example:
        ```python
        source = tfscale.data.AvazuCSV("avazu/train.gz", hash_buckets=1_000_000)
        train = tfscale.data.rank_batches(source, 65536)
        ```
    """

    FORMAT = AvazuFormat()


class AvazuParquet(ParquetSource):
    """Avazu rows in Parquet files as a CTRSource: columns click, hour (YYMMDDHH as text or an
    integer) and C1..C21 (or the names `columns` maps them to; `id` is not read), encoded as
    AvazuCSV encodes lines (see ParquetSource for every option).

    Example:
        ```python
        source = tfscale.data.AvazuParquet("avazu.parquet", hash_buckets=1_000_000)
        train = tfscale.data.rank_batches(source, 65536)
        ```
    """

    FORMAT = AvazuCSV.FORMAT
