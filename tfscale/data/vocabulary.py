"""Categorical vocabularies (and integer ranges) for the text readers.

Owns the Vocabulary (kept values per categorical field with their counts, each integer field's
min and max, the min-count threshold), turning counted totals into one (`from_totals`), counting
a tf.data stream of parsed rows (`count_vocabulary`; files are counted by
tfscale.data.vocabulary_pass), and looking values up as ids: row 0 = missing (empty), row 1 = out
of vocabulary, then the kept values in a stable order (falling count, ties by value), so the most
frequent value of a field is row 2. Its file is tfscale.data.vocabulary_file's.
"""

import dataclasses
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import tensorflow as tf

from tfscale.data import vocabulary_file
from tfscale.data.fingerprint import HASH_RANGE, fingerprints, table_ids
from tfscale.data.key_table import KeyTable
from tfscale.data.pipeline import without_autotuning
from tfscale.data.schema import MISSING_ID
from tfscale.data.value_counts import ValueCounts
from tfscale.errors import UserError

OOV_ID = 1
FIRST_VALUE_ID = 2


@dataclasses.dataclass
class Vocabulary:
    """Kept values per categorical field and (min, max) per integer field of one data set.

    categorical: field -> list of (value, count), in id order from FIRST_VALUE_ID.
    dense_ranges: field -> (min, max) of the values present, or None if the field was always empty.
    distinct: field -> distinct values counted (before the min count), when known.
    sources: what the counted files were (tfscale.data.vocabulary_cache), when it is a cache.
    counting: how the counts were made (tfscale.data.vocabulary_pass): ranks, whether exact,
      the sketch's size, the occurrences it counted and its error bound; None when unrecorded.
    """

    format_name: str
    min_count: int
    rows: int
    categorical: dict
    dense_ranges: dict
    bad_lines_skipped: int = 0
    distinct: dict = None
    sources: dict = None
    counting: dict = None
    path: str = dataclasses.field(default=None, compare=False)  # loaded from / saved to

    def size(self, name):
        """Embedding rows of a field: missing + OOV + kept values."""
        return FIRST_VALUE_ID + len(self.categorical[name])

    def encoder(self, names):
        return VocabularyEncoder(self, names)

    def dense_bounds(self, names):
        """(mins, maxs) lists for the named integer fields (0, 0 for a field never present)."""
        ranges = [self.dense_ranges[name] or (0.0, 0.0) for name in names]
        return [low for low, _ in ranges], [high for _, high in ranges]

    def check_fits(self, format_name, categorical_names, dense_names):
        """UserError unless this vocabulary covers the fields of `format_name` data."""
        where = self.path or "the vocabulary"
        if self.format_name != format_name:
            raise UserError(f"{where}: a vocabulary of {self.format_name} data, not "
                            f"{format_name}; build one from {format_name} files")
        missing = [n for n in categorical_names if n not in self.categorical]
        missing += [n for n in dense_names if n not in self.dense_ranges]
        if missing:
            raise UserError(f"{where}: no entry for the fields {', '.join(missing)}")

    def describe(self):
        values = sum(len(entries) for entries in self.categorical.values())
        return (f"vocabulary {self.path or '(in memory)'} ({values} values with count >= "
                f"{self.min_count})")

    # -- files

    def save(self, path):
        """Write as a vocabulary file (tfscale.data.vocabulary_file), atomically."""
        header = {"format": self.format_name, "min_count": self.min_count, "rows": self.rows,
                  "bad_lines_skipped": self.bad_lines_skipped, "distinct": self.distinct,
                  "sources": self.sources, "counting": self.counting}
        vocabulary_file.write(path, header, self.dense_ranges, self.categorical)
        self.path = str(path)

    @classmethod
    def load(cls, path):
        """Read a vocabulary file, Parquet or the JSON of earlier versions (UserError naming the
        file if missing or corrupt)."""
        header, dense_ranges, categorical = vocabulary_file.read(path)
        try:
            return cls(format_name=str(header["format"]), min_count=int(header["min_count"]),
                       rows=int(header["rows"]), categorical=categorical,
                       dense_ranges=dense_ranges,
                       bad_lines_skipped=int(header.get("bad_lines_skipped", 0)),
                       distinct=header.get("distinct"), sources=header.get("sources"),
                       counting=header.get("counting"), path=str(path))
        except (KeyError, TypeError, ValueError) as error:
            raise UserError(f"{path}: not a valid vocabulary file ({error!r}); rebuild it with "
                            "python -m launch.build_vocab") from None


class VocabularyEncoder:
    """Categorical strings -> ids: row 0 = missing, row 1 = out of vocabulary, FIRST_VALUE_ID.. =
    the kept values.

    Looked up without a tf.lookup table (its ops are stateful, which makes tf.data pipelines
    serial under op determinism): each (field, value) becomes a 64-bit key, its value's
    fingerprint XOR a per-field salt, found by binary search (tf.searchsorted) in the sorted keys
    of the vocabulary, or, for the readers' Arrow arrays (`encode_arrow`), in a hash table of the
    same keys (key_table.KeyTable). Two keys would have to collide in 64
    bits to mix up values; if two kept values of a field ever did, the more frequent one's id
    wins, in both.
    """

    def __init__(self, vocabulary, names):
        self.sizes = tuple(vocabulary.size(name) for name in names)
        self._salt_values = np.random.default_rng(0).integers(0, 1 << 62, size=len(names))
        keys, ids = [np.array([np.iinfo(np.int64).max])], [np.array([OOV_ID])]  # a sentinel
        for column, name in enumerate(names):
            values = [value for value, _ in vocabulary.categorical[name]]
            if values:
                keys.append(_numpy_keys(fingerprints(pa.array(values, pa.binary()))[0],
                                        self._salt_values[column]))
                ids.append(np.arange(FIRST_VALUE_ID, FIRST_VALUE_ID + len(values)))
        keys, ids = np.concatenate(keys), np.concatenate(ids)
        self._table = KeyTable(keys, ids)  # equal keys: the first kept wins, as in the search
        order = np.argsort(keys, kind="stable")  # equal keys: the first kept wins the search
        self._salts = tf.constant(self._salt_values, tf.int64)
        self._sorted_keys = tf.constant(keys[order], tf.int64)
        self._ids = tf.constant(ids[order], tf.int64)

    @staticmethod
    def _keys(strings, salts):
        return tf.bitwise.bitwise_xor(tf.strings.to_hash_bucket_fast(strings, HASH_RANGE), salts)

    def encode(self, strings):
        """int64 ids [n, F] of strings [n, F], column f of field f."""
        ids = self._ids_of(tf.reshape(self._keys(strings, self._salts), [-1]))
        return tf.where(tf.strings.length(strings) > 0, tf.reshape(ids, tf.shape(strings)),
                        tf.constant(MISSING_ID, tf.int64))

    def encode_arrow(self, values, field, out):
        """Writes into `out` (int64 [n], numpy) the ids `encode` gives the values of Arrow binary
        or string array `values` as field number `field` (tfscale.data.fingerprint's kernel)."""
        table_ids(values, self._salt_values[field], self._table, OOV_ID, MISSING_ID, out)

    def kernel_rule(self):
        """(kind, per field, slots, tags, absent): how tfscale/data/_kernels.c's `parse_lines`
        gives a field's values the ids `encode` gives them (tfscale.data.line_kernel)."""
        return ("table", self._salt_values.astype(np.int64), self._table.slots, self._table.tags,
                OOV_ID)

    def _ids_of(self, keys):
        position = tf.minimum(tf.searchsorted(self._sorted_keys, keys, out_type=tf.int64),
                              tf.size(self._sorted_keys, out_type=tf.int64) - 1)
        found = tf.equal(tf.gather(self._sorted_keys, position), keys)
        return tf.where(found, tf.gather(self._ids, position), tf.constant(OOV_ID, tf.int64))


def _numpy_keys(hashes, salt):
    """int64 keys of fingerprints `hashes` (uint64) with `salt`: VocabularyEncoder._keys's."""
    return (hashes % np.uint64(HASH_RANGE)).astype(np.int64) ^ np.int64(salt)


# ----------------------------------------------------------------------------- counting

def summarise_chunk(raw):
    """Per-chunk distinct values with counts per categorical field, integer min/max, row count
    and malformed lines, of the raw columns of a LineParser."""
    values, counts = [], []
    for column in tf.unstack(raw["categorical"], axis=1):
        unique = tf.unique_with_counts(tf.boolean_mask(column, tf.strings.length(column) > 0))
        values.append(unique.y)
        counts.append(unique.count)
    present, dense = raw["dense_present"], raw["dense"]
    return {
        "values": tuple(values),
        "counts": tuple(counts),
        "lows": tf.reduce_min(tf.where(present, dense, np.inf), axis=0),
        "highs": tf.reduce_max(tf.where(present, dense, -np.inf), axis=0),
        "rows": tf.shape(dense)[0],
        "bad_lines": raw["bad_lines"],
    }


def add_summary(counts, summary):
    """Counts the values of one summarise_chunk summary (as numpy) into `counts`, a
    ValueCounts."""
    lengths = [len(values) for values in summary["values"]]
    if sum(lengths):
        counts.add(np.repeat(np.arange(len(lengths), dtype=np.int16), lengths),
                   pa.array(np.concatenate(summary["values"]), pa.binary()),
                   np.concatenate(summary["counts"]).astype(np.int64))


def count_vocabulary(raw_chunks, *, format_name, categorical_names, dense_names, min_count,
                     progress=None, progress_every_seconds=5.0):
    """A Vocabulary from one pass over `raw_chunks` (a tf.data.Dataset of the raw columns of a
    LineParser, or a stream shaped alike): values seen at least `min_count` times, integer
    min/max per field, the rows counted, the distinct values per field and the malformed lines
    skipped, all exact. `progress(rows)` is called every `progress_every_seconds` while
    counting."""
    if int(min_count) < 1:
        raise UserError(f"min_count must be at least 1, got {min_count}")
    counts = ValueCounts(len(categorical_names), gate=min_count, max_values=np.iinfo(np.int64).max,
                         sketch_width=1)
    lows = np.full(len(dense_names), np.inf)
    highs = np.full(len(dense_names), -np.inf)
    rows = bad_lines = 0
    last_report = time.monotonic()
    summaries = without_autotuning(raw_chunks.map(
        summarise_chunk, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True
    ).prefetch(tf.data.AUTOTUNE))
    for summary in summaries.as_numpy_iterator():
        add_summary(counts, summary)
        lows = np.minimum(lows, summary["lows"])
        highs = np.maximum(highs, summary["highs"])
        rows += int(summary["rows"])
        bad_lines += int(summary["bad_lines"])
        if progress is not None and time.monotonic() - last_report >= progress_every_seconds:
            progress(rows)
            last_report = time.monotonic()
    return from_totals(format_name=format_name, categorical_names=categorical_names,
                       dense_names=dense_names, min_count=min_count, totals=counts.table(),
                       distinct=counts.distinct(), lows=lows, highs=highs, rows=rows,
                       bad_lines=bad_lines)


def from_totals(*, format_name, categorical_names, dense_names, min_count, totals, distinct, lows,
                highs, rows, bad_lines, counting=None):
    """The Vocabulary of counted `totals` (a pyarrow table of field index, value bytes and
    count): per field the values counted at least `min_count` times, by falling count then
    value; `distinct` per field, integer `lows` and `highs` (inf and -inf for a field never
    present)."""
    kept = totals.filter(pc.greater_equal(totals["count"], int(min_count))).sort_by(
        [("field", "ascending"), ("count", "descending"), ("value", "ascending")])
    bounds = np.searchsorted(kept["field"].to_numpy(), np.arange(len(categorical_names) + 1))
    values, counts = _decoded(kept["value"]), kept["count"].to_pylist()
    categorical = {name: list(zip(values[bounds[i]:bounds[i + 1]],
                                  counts[bounds[i]:bounds[i + 1]]))
                   for i, name in enumerate(categorical_names)}
    dense_ranges = {name: None if low > high else (float(low), float(high))
                    for name, low, high in zip(dense_names, lows, highs)}
    return Vocabulary(format_name=format_name, min_count=int(min_count), rows=int(rows),
                      categorical=categorical, dense_ranges=dense_ranges,
                      bad_lines_skipped=int(bad_lines),
                      distinct={name: int(d) for name, d in zip(categorical_names, distinct)},
                      counting=counting)


def _decoded(values):
    """Python strings of binary values (invalid UTF-8 replaced, as the reader shows it)."""
    try:
        return values.cast(pa.string()).to_pylist()
    except pa.ArrowInvalid:
        return [value.decode("utf-8", "replace") for value in values.to_pylist()]
