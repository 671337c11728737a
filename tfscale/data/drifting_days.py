"""The days of the drifting stream (tfscale.data.drifting) as CTRSources, their raw ids encoded
one of three ways, so that the three kinds of tables can be compared on the same days:

- `vocabulary_ids(vocabulary)`: a vocabulary counted on one day (`count_day_vocabulary`, the
  first day for online training): an id unseen that day, or seen fewer than `min_count` times,
  reads the field's out-of-vocabulary row (tfscale.data.vocabulary.OOV_ID), as the file readers'
  vocabulary does; row 0 = missing;
- `hashed_ids(buckets)`: the file readers' hashing (tfscale.data.preprocessing.HashingEncoder)
  of each id's decimal string into per-field buckets (fitted to a day's distinct ids by
  tfscale.data.vocabulary_cache.fitted_hash_buckets, as the launcher does for files);
- `RAW_IDS`: the raw int64 ids in [0, RAW_ID_LIMIT) (0 = missing), for tables keyed by
  (field, id) that grow with them.

Owns: the encodings, counting a day's vocabulary, and `DriftingDay`, one day as a CTRSource whose
train split and test split are both the whole day (online training scores a day, then trains on
it)."""

import tensorflow as tf

from tfscale.data.drifting import CATEGORICAL_NAMES, DENSE_NAMES, RAW_ID_LIMIT
from tfscale.data.preprocessing import HashingEncoder, hash_buckets_per_field
from tfscale.data.schema import MISSING_ID, FeatureSchema
from tfscale.data.source import CTRSource
from tfscale.data.synthetic import check_batch_size, check_shard
from tfscale.data.vocabulary import count_vocabulary

VOCABULARY_FORMAT = "drifting"  # the format name of a vocabulary counted on drifting days
_TRAINING_KEYS = ("dense", "categorical", "label")


def id_strings(ids):
    """Raw ids as decimal strings, a missing id (0) as the empty string: what the file readers'
    encoders take."""
    return tf.where(ids == MISSING_ID, "", tf.strings.as_string(ids))


class RawIds:
    """The raw ids themselves, for tables keyed by (field, id): every field's rows are the id
    range [0, RAW_ID_LIMIT)."""

    sizes = (RAW_ID_LIMIT,) * len(CATEGORICAL_NAMES)

    def encode(self, ids):
        return ids

    def describe(self):
        return "raw ids"


RAW_IDS = RawIds()


class StringIds:
    """Raw ids through a string encoder of the file readers (its `sizes` and `encode`): their
    decimal strings (id_strings) looked up or hashed."""

    def __init__(self, encoder, description):
        self.encoder = encoder
        self.sizes = encoder.sizes
        self._description = description

    def encode(self, ids):
        return self.encoder.encode(id_strings(ids))

    def describe(self):
        return self._description


def vocabulary_ids(vocabulary):
    """The encoding by `vocabulary` (count_day_vocabulary's): row 0 missing, row 1 out of
    vocabulary, then the kept ids."""
    kept = sum(len(entries) for entries in vocabulary.categorical.values())
    return StringIds(vocabulary.encoder(CATEGORICAL_NAMES),
                     f"vocabulary of {vocabulary.rows:,} rows ({kept:,} ids seen at least "
                     f"{vocabulary.min_count} times)")


def hashed_ids(buckets):
    """The encoding that hashes each field into `buckets` (one number, or one per field)."""
    encoder = HashingEncoder(hash_buckets_per_field(buckets, CATEGORICAL_NAMES))
    return StringIds(encoder, encoder.describe())


def count_day_vocabulary(stream, day=0, min_count=1, chunk_rows=65536):
    """The Vocabulary of day `day` of `stream` (a DriftingCTR): the ids seen at least
    `min_count` times that day, the integer fields' ranges and every field's distinct ids (what
    fitted hash buckets are sized from), in one pass as the file readers count theirs."""
    rows = stream.rows(day, 0, stream.rows_per_day, chunk_rows,
                       keys=("dense_raw", "dense_present", "categorical"))
    raw = rows.map(lambda chunk: {
        "categorical": id_strings(chunk["categorical"]),
        "dense": tf.cast(chunk["dense_raw"], tf.float32),
        "dense_present": chunk["dense_present"],
        "bad_lines": tf.constant(0, tf.int64),
    })
    return count_vocabulary(raw, format_name=VOCABULARY_FORMAT,
                            categorical_names=CATEGORICAL_NAMES, dense_names=DENSE_NAMES,
                            min_count=min_count)


class DriftingDay(CTRSource):
    """Day `day` (0-based) of `stream` (a DriftingCTR) with its ids encoded by `encoding`
    (RAW_IDS, vocabulary_ids(...) or hashed_ids(...)). Its train split and its test split are
    both the whole day: shard s of n trains on the s-th contiguous slice of rows_per_day // n
    rows (full batches) and scores the s-th of n near-equal contiguous slices (every row)."""

    def __init__(self, stream, day, encoding):
        self.stream = stream
        self.day = day
        self.name = stream.day_name(day)
        self.encoding = encoding
        self.schema = FeatureSchema(dense_names=DENSE_NAMES, categorical_names=CATEGORICAL_NAMES,
                                    vocabulary_sizes=encoding.sizes)

    def train_batches(self, batch_size, *, epoch=0, skip_batches=0, shard_index=0, num_shards=1):
        """The day's full batches (every epoch the same rows in the same order)."""
        steps = self.train_steps_per_epoch(batch_size, num_shards)
        check_shard(shard_index, num_shards)
        if not 0 <= skip_batches <= steps:
            raise ValueError(f"skip_batches={skip_batches} must be in [0, {steps}] (batches of "
                             "the day)")
        first = shard_index * (self.stream.rows_per_day // num_shards) + skip_batches * batch_size
        rows = self.stream.rows(self.day, first, (steps - skip_batches) * batch_size, batch_size,
                                keys=_TRAINING_KEYS, drop_remainder=True)
        return rows.map(self._features_and_labels)

    def test_batches(self, batch_size, *, shard_index=0, num_shards=1):
        """Every row of the day once (this shard's slice); the last batch may be short."""
        check_batch_size(batch_size)
        check_shard(shard_index, num_shards)
        rows = self.stream.rows_per_day
        first = rows * shard_index // num_shards
        end = rows * (shard_index + 1) // num_shards
        return self.stream.rows(self.day, first, end - first, batch_size,
                                keys=_TRAINING_KEYS).map(self._features_and_labels)

    def train_steps_per_epoch(self, batch_size, num_shards=1):
        check_batch_size(batch_size)
        if num_shards < 1:
            raise ValueError(f"num_shards={num_shards} must be >= 1")
        return self.stream.rows_per_day // num_shards // batch_size

    def describe(self):
        return f"{self.name}; categorical {self.encoding.describe()}"

    def teacher_auc(self):
        """The teacher's exact AUC on the day: the best a model can expect."""
        return self.stream.teacher_auc(self.day)

    def teacher_logloss(self):
        return self.stream.teacher_logloss(self.day)

    def _features_and_labels(self, rows):
        features = {"dense": rows["dense"], "categorical": self.encoding.encode(rows["categorical"])}
        return features, rows["label"][:, None]


def drifting_days(stream, encoding):
    """[(name, DriftingDay)] of every day of `stream` in order, each encoded by `encoding`: the
    `days` of tfscale.training.train_progressively."""
    return [(day.name, day) for day in (DriftingDay(stream, d, encoding)
                                        for d in range(stream.days))]
