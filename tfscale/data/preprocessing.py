"""What turns the raw columns of a parsed line into a model's features, as one object shared by
training, prediction and the exported SavedModel, so all three encode a line the same way.

Owns: choosing the categorical encoder (hashing with per-field bucket counts, or a vocabulary
lookup) and the integer transform (log1p, or min-max with a vocabulary's ranges), the feature
schema they give, applying them to raw columns (`features`), and the JSON-able description a
trained model keeps beside its checkpoints (`to_config` / `from_config`).
"""

import os

import numpy as np
import tensorflow as tf

from tfscale.data import vocabulary as vocabulary_lib
from tfscale.data.fingerprint import HASH_RANGE, bucket_ids
from tfscale.data.schema import MISSING_ID, FeatureSchema
from tfscale.errors import UserError

DEFAULT_HASH_BUCKETS = 1 << 17  # per categorical field, when there is no vocabulary
DENSE_TRANSFORMS = ("log1p", "minmax")  # of the integer features


def is_present(strings):
    """Whether each field has a value (an empty field is a missing value)."""
    return tf.strings.length(strings) > 0


def log_transform(values, present):
    """sign(x) * log1p(|x|), so negative integers keep their sign; missing -> 0."""
    return tf.where(present, tf.sign(values) * tf.math.log1p(tf.abs(values)), 0.0)


def min_max_transform(lows, highs):
    """(x - min) / (max - min) clipped to [0, 1] with min/max per field from the vocabulary pass;
    missing, or a field whose min equals its max, -> 0."""
    lows = tf.constant(lows, tf.float32)
    spans = tf.constant(highs, tf.float32) - lows

    def transform(values, present):
        scaled = tf.math.divide_no_nan(values - lows, spans)
        return tf.where(present, tf.clip_by_value(scaled, 0.0, 1.0), 0.0)

    return transform


class HashingEncoder:
    """Categorical strings -> ids by hashing: row 0 = missing (empty), rows 1..buckets[f] hold the
    hash buckets of field f (tf.strings.to_hash_bucket_fast, stable across runs)."""

    def __init__(self, buckets):
        self.buckets = tuple(int(b) for b in buckets)
        self.sizes = tuple(b + 1 for b in self.buckets)
        self._buckets = tf.constant(self.buckets, tf.int64)

    def encode(self, strings):
        """int64 ids [n, F] of strings [n, F], column f of field f."""
        hashed = tf.strings.to_hash_bucket_fast(strings, HASH_RANGE)
        return tf.where(is_present(strings), hashed % self._buckets + 1,
                        tf.constant(MISSING_ID, tf.int64))

    def encode_arrow(self, values, field, out):
        """Writes into `out` (int64 [n], numpy) the ids `encode` gives the values of Arrow binary
        or string array `values` as field number `field` (tfscale.data.fingerprint's kernel)."""
        bucket_ids(values, self.buckets[field], 1, MISSING_ID, out)

    def kernel_rule(self):
        """(kind, per field, slots, tags, absent): how tfscale/data/_kernels.c's `parse_lines`
        gives a field's values the ids `encode` gives them (tfscale.data.line_kernel)."""
        return "buckets", np.array(self.buckets, np.uint64), None, None, 0

    def describe(self):
        sizes = sorted(set(self.buckets))
        if len(sizes) == 1:
            return f"hashing into {sizes[0]} buckets per field"
        return f"hashing into {sizes[0]}..{sizes[-1]} buckets per field ({sum(sizes):,} in all)"


def hash_buckets_per_field(hash_buckets, names):
    """A single bucket count or one per field, as a tuple per field (UserError if malformed)."""
    buckets = [hash_buckets] * len(names) if np.ndim(hash_buckets) == 0 else list(hash_buckets)
    if len(buckets) != len(names):
        raise UserError(f"`hash_buckets` has {len(buckets)} entries for {len(names)} categorical "
                        "fields; give one number or one per field")
    if any(int(b) < 1 for b in buckets):
        raise UserError(f"`hash_buckets` must be at least 1, got {buckets}")
    return tuple(int(b) for b in buckets)


class Preprocessing:
    """Raw columns (tfscale.data.text_lines.LineParser) of one TextFormat -> features.

    Args:
      text_format: the TextFormat whose lines are read.
      vocabulary: a Vocabulary or the path of one; categorical strings are then looked up (row 0
        missing, row 1 out of vocabulary, then its values).
      hash_buckets: without a vocabulary, hash each categorical field into this many buckets
        (one int, or one per field; default DEFAULT_HASH_BUCKETS); ids 1..buckets, 0 = missing.
        Ignored when there is a vocabulary.
      dense_transform: "log1p" (sign(x) * log1p(|x|)) or "minmax" (needs a vocabulary, which
        records each field's min and max); missing integers are 0 either way.
    """

    def __init__(self, text_format, *, vocabulary=None, hash_buckets=None,
                 dense_transform="log1p"):
        self.text_format = text_format
        self.vocabulary = self._load_vocabulary(vocabulary)
        names = text_format.categorical_names
        if self.vocabulary is not None:
            self.encoder = self.vocabulary.encoder(names)
        else:
            buckets = DEFAULT_HASH_BUCKETS if hash_buckets is None else hash_buckets
            self.encoder = HashingEncoder(hash_buckets_per_field(buckets, names))
        self.dense_transform_name = dense_transform
        self._dense_transform = self._dense_transform_of(dense_transform)
        self.schema = FeatureSchema(
            dense_names=tuple(text_format.dense_names),
            categorical_names=tuple(names) + tuple(n for n, _ in text_format.derived_fields),
            vocabulary_sizes=self.encoder.sizes + tuple(r for _, r in text_format.derived_fields),
        )

    def _load_vocabulary(self, vocabulary):
        if vocabulary is None:
            return None
        if not isinstance(vocabulary, vocabulary_lib.Vocabulary):
            vocabulary = vocabulary_lib.Vocabulary.load(vocabulary)
        fmt = self.text_format
        vocabulary.check_fits(fmt.name, fmt.categorical_names, fmt.dense_names)
        return vocabulary

    def _dense_transform_of(self, name):
        if name == "log1p":
            return log_transform
        if name == "minmax":
            if self.vocabulary is None:
                raise UserError("`dense_transform='minmax'` needs a vocabulary (it records each "
                                "integer field's min and max)")
            return min_max_transform(*self.vocabulary.dense_bounds(self.text_format.dense_names))
        raise UserError(f"`dense_transform={name!r}`: give one of {', '.join(DENSE_TRANSFORMS)}")

    def features(self, raw):
        """{"dense": float32 [n, D], "categorical": int64 [n, F]} of raw columns: categorical
        strings [n, C] (text_lines.LineParser), or the ids the readers encoded from Arrow's
        columns (data.handover: `categorical_ids`, the same ids)."""
        if "categorical_ids" in raw:
            ids = raw["categorical_ids"]
        else:
            ids = self.encoder.encode(raw["categorical"])
        categorical = tf.concat([ids, raw["derived"]], axis=1)
        return {
            "dense": self._dense_transform(raw["dense"], raw["dense_present"]),
            "categorical": categorical,
        }

    def describe(self):
        encoding = self.vocabulary.describe() if self.vocabulary else self.encoder.describe()
        dense = (f"; integers {self.dense_transform_name}" if self.text_format.dense_names
                 else "")
        return f"categorical {encoding}{dense}"

    # -- the description kept beside a trained model

    def to_config(self, vocabulary_file=None):
        """A JSON-able dict; with a vocabulary, it is saved to `vocabulary_file` (a copy that
        stays with the model whatever happens to the cache it came from) and named there by its
        base name."""
        config = {"format": self.text_format.name, "dense_transform": self.dense_transform_name}
        if self.vocabulary is None:
            config["encoding"] = {"kind": "hash", "buckets": list(self.encoder.buckets)}
        else:
            if vocabulary_file is None:
                raise ValueError("a vocabulary encoding needs `vocabulary_file` to save it to")
            copy = vocabulary_lib.Vocabulary(**{
                field: getattr(self.vocabulary, field)
                for field in ("format_name", "min_count", "rows", "categorical", "dense_ranges",
                              "bad_lines_skipped", "distinct", "sources", "counting")})
            copy.save(vocabulary_file)
            config["encoding"] = {"kind": "vocabulary",
                                  "file": os.path.basename(vocabulary_file)}
        return config

    @classmethod
    def from_config(cls, config, text_format, directory):
        """The Preprocessing `to_config` described; its vocabulary file is read from
        `directory`."""
        encoding = config["encoding"]
        if encoding["kind"] == "hash":
            return cls(text_format, hash_buckets=encoding["buckets"],
                       dense_transform=config["dense_transform"])
        return cls(text_format, vocabulary=os.path.join(directory, encoding["file"]),
                   dense_transform=config["dense_transform"])


def source_preprocessing(text_format, preprocessing=None, *, vocabulary=None, hash_buckets=None,
                         dense_transform=None):
    """The Preprocessing a data source of `text_format` encodes with: `preprocessing` as given
    (it must read `text_format`, and the other three arguments be unset), or one made from
    `vocabulary`, `hash_buckets` and `dense_transform` (default "log1p")."""
    if preprocessing is None:
        return Preprocessing(text_format, vocabulary=vocabulary, hash_buckets=hash_buckets,
                             dense_transform="log1p" if dense_transform is None
                             else dense_transform)
    if (vocabulary, hash_buckets, dense_transform) != (None, None, None):
        raise UserError("give either `preprocessing` or `vocabulary`, `hash_buckets` and "
                        "`dense_transform` (which make one), not both")
    if preprocessing.text_format is not text_format:
        raise UserError(f"`preprocessing` reads {preprocessing.text_format.name} data, not "
                        f"{text_format.name}")
    return preprocessing
