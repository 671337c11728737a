"""Categorical vocabularies (and integer ranges) for the text readers.

Owns: counting the categorical values and each integer field's min and max in one streaming pass
over parsed rows, the min-count threshold, saving and loading as one readable JSON file, and
looking values up as ids: row 0 = missing (empty), row 1 = out of vocabulary, then the kept values
in a stable order (falling count, ties by value), so the most frequent value of a field is row 2.
"""

import collections
import dataclasses
import json
import os
import time

import numpy as np
import tensorflow as tf

from tfscale.data.pipeline import without_autotuning
from tfscale.data.schema import MISSING_ID
from tfscale.errors import UserError

OOV_ID = 1
FIRST_VALUE_ID = 2
_FILE_KIND = "tfscale vocabulary"
_FILE_VERSION = 1


@dataclasses.dataclass
class Vocabulary:
    """Kept values per categorical field and (min, max) per integer field of one data set.

    categorical: field -> list of (value, count), in id order from FIRST_VALUE_ID.
    dense_ranges: field -> (min, max) of the values present, or None if the field was always empty.
    distinct: field -> distinct values counted (before the min count), when known.
    sources: what the counted files were (tfscale.data.vocabulary_cache), when it is a cache.
    """

    format_name: str
    min_count: int
    rows: int
    categorical: dict
    dense_ranges: dict
    bad_lines_skipped: int = 0
    distinct: dict = None
    sources: dict = None
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
        """Write as JSON, one line per field, atomically."""
        path = os.fspath(path)
        header = {"kind": _FILE_KIND, "version": _FILE_VERSION, "format": self.format_name,
                  "min_count": self.min_count, "rows": self.rows,
                  "bad_lines_skipped": self.bad_lines_skipped}
        if self.distinct is not None:
            header["distinct"] = self.distinct
        if self.sources is not None:
            header["sources"] = self.sources
        dense_ranges = {name: None if r is None else [float(r[0]), float(r[1])]
                        for name, r in self.dense_ranges.items()}
        categorical = {name: [[value, count] for value, count in entries]
                       for name, entries in self.categorical.items()}
        text = (json.dumps(header)[:-1] + ',\n "dense_ranges": ' + _json_lines(dense_ranges)
                + ',\n "categorical": ' + _json_lines(categorical) + "\n}\n")
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path + ".tmp", "w", encoding="utf-8") as stream:
            stream.write(text)
        os.replace(path + ".tmp", path)
        self.path = path

    @classmethod
    def load(cls, path):
        """Read a vocabulary saved by `save` (UserError naming the file if missing or corrupt)."""
        path = os.fspath(path)
        if not os.path.isfile(path):
            raise UserError(f"{path}: no such vocabulary file; build one with "
                            "python -m launch.build_vocab")
        try:
            with open(path, encoding="utf-8") as stream:
                data = json.load(stream)
        except (OSError, UnicodeDecodeError, ValueError) as error:
            raise UserError(f"{path}: not a readable vocabulary file ({error})") from None
        try:
            return cls._from_json(data, path)
        except KeyError as error:
            problem = f"no entry {error}"
        except (TypeError, ValueError) as error:
            problem = str(error)
        raise UserError(f"{path}: not a valid vocabulary file ({problem}); rebuild it with "
                        "python -m launch.build_vocab")

    @classmethod
    def _from_json(cls, data, path):
        if not isinstance(data, dict) or (data.get("kind"), data.get("version")) != (
                _FILE_KIND, _FILE_VERSION):
            raise ValueError(f"expected a JSON object of kind {_FILE_KIND!r}, version "
                             f"{_FILE_VERSION}")
        categorical = {}
        for name, entries in data["categorical"].items():
            categorical[name] = [(str(value), int(count)) for value, count in entries]
        dense_ranges = {name: None if r is None else (float(r[0]), float(r[1]))
                        for name, r in data["dense_ranges"].items()}
        return cls(format_name=str(data["format"]), min_count=int(data["min_count"]),
                   rows=int(data["rows"]), categorical=categorical, dense_ranges=dense_ranges,
                   bad_lines_skipped=int(data.get("bad_lines_skipped", 0)),
                   distinct=data.get("distinct"), sources=data.get("sources"), path=path)


def _json_lines(mapping):
    """A JSON object with one line per key."""
    items = [f"  {json.dumps(key)}: {json.dumps(value)}" for key, value in mapping.items()]
    return "{\n" + ",\n".join(items) + "\n }" if items else "{}"


class VocabularyEncoder:
    """Categorical strings -> ids: row 0 = missing, row 1 = out of vocabulary, FIRST_VALUE_ID.. =
    the kept values.

    Looked up without a tf.lookup table (its ops are stateful, which makes tf.data pipelines
    serial under op determinism): each (field, value) becomes a 64-bit key, its value's
    fingerprint XOR a per-field salt, found by binary search (tf.searchsorted) in the sorted keys
    of the vocabulary. Two keys would have to collide in 64 bits to mix up values; if two kept
    values of a field ever did, the more frequent one's id wins.
    """

    def __init__(self, vocabulary, names):
        self.sizes = tuple(vocabulary.size(name) for name in names)
        self._salts = tf.constant(
            np.random.default_rng(0).integers(0, 1 << 62, size=len(names)), tf.int64)
        keys, ids = [np.array([np.iinfo(np.int64).max])], [np.array([OOV_ID])]  # a sentinel
        for column, name in enumerate(names):
            values = [value for value, _ in vocabulary.categorical[name]]
            if values:
                salt = self._salts[column]
                keys.append(self._keys(tf.constant(values, tf.string), salt).numpy())
                ids.append(np.arange(FIRST_VALUE_ID, FIRST_VALUE_ID + len(values)))
        keys, ids = np.concatenate(keys), np.concatenate(ids)
        order = np.argsort(keys, kind="stable")  # equal keys: the first kept wins the search
        self._sorted_keys = tf.constant(keys[order], tf.int64)
        self._ids = tf.constant(ids[order], tf.int64)

    @staticmethod
    def _keys(strings, salts):
        return tf.bitwise.bitwise_xor(tf.strings.to_hash_bucket_fast(strings, (1 << 63) - 1),
                                      salts)

    def encode(self, strings):
        keys = tf.reshape(self._keys(strings, self._salts), [-1])
        position = tf.minimum(tf.searchsorted(self._sorted_keys, keys, out_type=tf.int64),
                              tf.size(self._sorted_keys, out_type=tf.int64) - 1)
        found = tf.equal(tf.gather(self._sorted_keys, position), keys)
        ids = tf.where(found, tf.gather(self._ids, position), tf.constant(OOV_ID, tf.int64))
        return tf.where(tf.strings.length(strings) > 0, tf.reshape(ids, tf.shape(strings)),
                        tf.constant(MISSING_ID, tf.int64))


# ----------------------------------------------------------------------------- counting

def _summarise_chunk(raw):
    """Per-chunk distinct values with counts per categorical field, integer min/max, row count."""
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


def count_vocabulary(raw_chunks, *, format_name, categorical_names, dense_names, min_count,
                     progress=None, progress_every_seconds=5.0):
    """A Vocabulary from one pass over `raw_chunks` (a tf.data.Dataset of the raw columns of a
    LineParser): values seen at least `min_count` times, integer min/max per field, the rows
    counted, the distinct values per field and the malformed lines skipped. `progress(rows)` is
    called every `progress_every_seconds` while counting."""
    if int(min_count) < 1:
        raise UserError(f"min_count must be at least 1, got {min_count}")
    totals = [collections.defaultdict(int) for _ in categorical_names]
    lows = np.full(len(dense_names), np.inf)
    highs = np.full(len(dense_names), -np.inf)
    rows = bad_lines = 0
    last_report = time.monotonic()
    summaries = without_autotuning(raw_chunks.map(
        _summarise_chunk, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True
    ).prefetch(tf.data.AUTOTUNE))
    for summary in summaries.as_numpy_iterator():
        for total, values, counts in zip(totals, summary["values"], summary["counts"]):
            for value, count in zip(values.tolist(), counts.tolist()):
                total[value] += count
        lows = np.minimum(lows, summary["lows"])
        highs = np.maximum(highs, summary["highs"])
        rows += int(summary["rows"])
        bad_lines += int(summary["bad_lines"])
        if progress is not None and time.monotonic() - last_report >= progress_every_seconds:
            progress(rows)
            last_report = time.monotonic()
    categorical = {name: _kept_values(total, min_count)
                   for name, total in zip(categorical_names, totals)}
    dense_ranges = {name: None if low > high else (float(low), float(high))
                    for name, low, high in zip(dense_names, lows, highs)}
    return Vocabulary(format_name=format_name, min_count=int(min_count), rows=rows,
                      categorical=categorical, dense_ranges=dense_ranges,
                      bad_lines_skipped=bad_lines,
                      distinct={name: len(total) for name, total in zip(categorical_names, totals)})


def _kept_values(total, min_count):
    """(value, count) with count >= min_count, by falling count then value."""
    kept = [(value.decode("utf-8", "replace"), count)
            for value, count in total.items() if count >= min_count]
    return sorted(kept, key=lambda entry: (-entry[1], entry[0]))
