"""The built-in synthetic Criteo-like data set: a generated, deterministic stream of CTR rows whose
labels come from a planted "teacher" model, so the best achievable AUC (the ceiling) is known.

Owns: the field cardinalities and id frequency laws, the row generator (tf.data over fixed blocks
of rows, stateless random ops keyed by (seed, block index)), the teacher model and its ceiling
metrics, and writing rows as Criteo Kaggle TSV for the file reader.

Every value of row r depends only on the constructor's seed, vocabulary_scale and click_rate and
on r, never on batch size, sharding or where a read starts. Train rows are [0, train_rows), test
rows are [train_rows, train_rows + test_rows).
"""

import concurrent.futures
import gzip
import math
import typing

import numpy as np
import tensorflow as tf

from tfscale import metrics
from tfscale.data.schema import MISSING_ID, FeatureSchema
from tfscale.data.pipeline import held_by_reference, without_autotuning
from tfscale.data.source import CTRSource
from tfscale.data.preprocessing import log_transform

# Criteo Kaggle (train.txt) distinct values of C1..C26.
CRITEO_CARDINALITIES = (
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
    27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572,
)
# Cardinalities up to this stay as in Criteo; only the part above it is scaled down.
SMALL_FIELD_LIMIT = 10_000
# Share of empty values per field: Criteo Kaggle's rates, capped at 45%.
CATEGORICAL_MISSING_RATES = (
    0.0, 0.0, 0.034, 0.034, 0.0, 0.121, 0.0, 0.0, 0.0, 0.0, 0.0, 0.034, 0.0,
    0.0, 0.0, 0.034, 0.0, 0.0, 0.44, 0.44, 0.034, 0.45, 0.0, 0.034, 0.44, 0.44,
)
DENSE_MISSING_RATES = (0.45, 0.0, 0.215, 0.217, 0.026, 0.224, 0.043, 0.0005, 0.043, 0.45, 0.043,
                       0.45, 0.217)
# Integer feature j is floor(expm1(max(mean_j + std_j * z, 0))) + offset_j with z ~ N(0, 1): a
# heavy-tailed count with a mass at 0, shaped like Criteo's I1..I13 (I2 goes down to -1).
DENSE_LOG_MEANS = (0.9, 2.5, 2.3, 1.9, 7.6, 4.2, 1.7, 2.5, 3.8, 0.4, 1.0, 0.3, 1.9)
DENSE_LOG_STDS = (1.0, 1.6, 1.2, 1.0, 1.8, 1.5, 1.2, 1.0, 1.3, 0.7, 0.9, 1.0, 1.2)
DENSE_OFFSETS = (0, -1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)

# Zipf exponents are drawn per field from [ZIPF_MIN, ZIPF_MAX] (from the seed).
ZIPF_MIN, ZIPF_MAX = 1.05, 1.3
# Teacher: logit = bias + sum_f w[f, id_f] + sum_{f<g} <h[f, id_f], h[g, id_g]> + sum_j d_j x_j
# (x = transformed dense values). Each field has an importance g_f drawn from [0.5, 1.5]; every id,
# rare or frequent alike, draws w ~ N(0, g_f^2) and h ~ N(0, g_f^2 I_TEACHER_RANK); d_j ~ N(0, 1)
# (with `rare_id_probability`, the weights of rare ids are then shrunk).
# Then the three terms are rescaled so that their standard deviations over the calibration rows
# are the spreads below, and the bias so that the mean click probability is click_rate. Fixing the
# spreads (rather than the weights' scales) keeps the ceiling steady across seeds, whose few most
# frequent ids otherwise decide much of the spread. The teacher's test AUC is then about 0.81
# (Criteo's best published models reach about 0.81), and most of it is learnable: ids seen at
# least 30 times in 300K rows alone give 0.79, and a plain DeepFM reaches about 0.72 after one
# epoch of 300K rows and 0.75 after one epoch of 1M (it overfits in a second epoch, as on Criteo).
TEACHER_RANK = 8
FIRST_ORDER_SPREAD = 0.95
PAIRWISE_SPREAD = 0.95
DENSE_SPREAD = 0.55

# Rows are generated in blocks of this many; part of the data's definition (changing it changes
# every row), independent of the batch size.
BLOCK_ROWS = 4096
# The teacher's scales and bias are calibrated on rows [0, CALIBRATION_BLOCKS * BLOCK_ROWS).
CALIBRATION_BLOCKS = 16

_NUM_FIELDS = len(CRITEO_CARDINALITIES)
_NUM_DENSE = len(DENSE_LOG_MEANS)
# Stateless seeds are (seed, stream): blocks use streams >= 0, one-off tables negative ones.
_BLOCK_STREAMS = 3
_STREAM_FIELD_PARAMETERS, _STREAM_ID_ORDER, _STREAM_TEACHER = -1, -2, -3
# Keys of a generated block, see SyntheticCTR.rows.
ROW_KEYS = ("dense", "dense_raw", "dense_present", "categorical", "label", "teacher_probability")
_TRAINING_KEYS = ("dense", "categorical", "label")
_HEX_DIGITS = np.frombuffer(b"0123456789abcdef", np.uint8)


def scaled_cardinalities(vocabulary_scale=1 / 20):
    """Distinct ids of C1..C26: Criteo's count up to SMALL_FIELD_LIMIT, the rest times the scale."""
    return tuple(
        c if c <= SMALL_FIELD_LIMIT else SMALL_FIELD_LIMIT + round((c - SMALL_FIELD_LIMIT) * vocabulary_scale)
        for c in CRITEO_CARDINALITIES
    )


def criteo_hash(field_index, ids):
    """8-char lowercase hex strings standing for (field, id), as Criteo's hashed categories do.

    A bijective 32-bit mix (murmur3's finaliser) of field_index * 2**27 + id, so distinct ids give
    distinct strings (ids must be below 2**27)."""
    x = np.asarray(ids, dtype=np.uint32).reshape(-1) | np.uint32(field_index << 27)
    x ^= x >> np.uint32(16)
    x *= np.uint32(0x85EBCA6B)
    x ^= x >> np.uint32(13)
    x *= np.uint32(0xC2B2AE35)
    x ^= x >> np.uint32(16)
    nibbles = (x[:, None] >> np.arange(28, -1, -4, dtype=np.uint32)) & np.uint32(0xF)
    return _HEX_DIGITS[nibbles].view("S8").ravel().astype(str)


def _stable_argsort_unit(keys):
    """np.argsort(keys, kind="stable") for float64 keys in [0, 1), several times faster: one
    in-place sort of 64-bit words holding a key's leading bits above its index, then the few
    runs of equal leading bits put in (key, index) order."""
    index_bits = max(int(keys.size - 1).bit_length(), 1)
    words = (keys * 2.0**52).astype(np.uint64)
    words >>= np.uint64(max(index_bits - 12, 0))
    words <<= np.uint64(index_bits)
    words |= np.arange(keys.size, dtype=np.uint64)
    words.sort()
    leading = words >> np.uint64(index_bits)
    words &= np.uint64((1 << index_bits) - 1)
    order = words.view(np.int64)
    tied = np.flatnonzero(leading[1:] == leading[:-1])
    if tied.size:
        members = np.union1d(tied, tied + 1)
        runs = np.cumsum(np.concatenate([[0], leading[members[1:]] != leading[members[:-1]]]))
        indices = order[members]
        order[members] = indices[np.lexsort((indices, keys[indices], runs))]
    return order


class SyntheticCTR(CTRSource):
    """A Criteo-like generated CTR stream with a planted teacher model.

    Args:
      seed: picks everything: per-field Zipf exponents and importances, the id order, the
        teacher's weights and every row.
      train_rows: rows [0, train_rows) are the train split.
      test_rows: rows [train_rows, train_rows + test_rows) are the test split.
      vocabulary_scale: factor on the part of a Criteo cardinality above SMALL_FIELD_LIMIT; the
        default 1/20 gives about 1.8M ids in total, 1.0 gives Criteo's own sizes.
      click_rate: the teacher's bias is calibrated so the mean click probability is this.
      rare_id_probability: None (the default): every id's teacher weights are drawn alike, so a
        rare id carries as much signal as a frequent one. A probability p0: the teacher weights
        of an id whose probability in its field p is below p0 are scaled by
        (p / p0) ** rare_id_power, so rare ids carry less signal, as on real CTR data (an
        experiment's option: docs/results/cowclip_official.md).
      rare_id_power: the exponent above (> 0).

    Raises:
      ValueError: `train_rows` or `test_rows` is negative, `vocabulary_scale` is not in (0, 1],
        `click_rate` not in (0, 1), `rare_id_probability` neither None nor in (0, 1], or
        `rare_id_power` not above 0.
    """

    def __init__(self, seed=0, train_rows=1_000_000, test_rows=200_000, vocabulary_scale=1 / 20,
                 click_rate=0.25, rare_id_probability=None, rare_id_power=1.0):
        if train_rows < 0 or test_rows < 0:
            raise ValueError(f"train_rows={train_rows} and test_rows={test_rows} must be >= 0")
        if not 0 < vocabulary_scale <= 1:
            raise ValueError(f"vocabulary_scale={vocabulary_scale} must be in (0, 1]")
        if not 0 < click_rate < 1:
            raise ValueError(f"click_rate={click_rate} must be in (0, 1)")
        if rare_id_probability is not None and not 0 < rare_id_probability <= 1:
            raise ValueError(f"rare_id_probability={rare_id_probability} must be in (0, 1] or None")
        if not rare_id_power > 0:
            raise ValueError(f"rare_id_power={rare_id_power} must be > 0")
        self.seed = int(seed)
        self.train_rows = int(train_rows)
        self.test_rows = int(test_rows)
        self.vocabulary_scale = vocabulary_scale
        self.click_rate = click_rate
        self.rare_id_probability = rare_id_probability
        self.rare_id_power = float(rare_id_power)
        self.cardinalities = scaled_cardinalities(vocabulary_scale)
        self.schema = FeatureSchema(
            dense_names=tuple(f"I{j + 1}" for j in range(_NUM_DENSE)),
            categorical_names=tuple(f"C{f + 1}" for f in range(_NUM_FIELDS)),
            vocabulary_sizes=tuple(c + 1 for c in self.cardinalities),
        )
        sizes = np.array(self.schema.vocabulary_sizes, dtype=np.int64)
        # Row of (field f, id) in the concatenated per-id tables is offsets[f] + id.
        self._offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        field_parameters = self._stateless_uniform([2, _NUM_FIELDS], _STREAM_FIELD_PARAMETERS)
        self.zipf_exponents = ZIPF_MIN + (ZIPF_MAX - ZIPF_MIN) * field_parameters[0]
        self.field_importances = 0.5 + field_parameters[1]
        # Seconds of work at Criteo's cardinalities: built in a background thread meanwhile the
        # caller goes on (building a model); what needs the tables waits for them.
        self._per_id_tables = _in_background(self._build_per_id_tables)
        self._ranks = {}
        self._test_teacher = None

    @property
    def teacher_bias(self):
        """The teacher's bias, calibrated so that the mean click probability is click_rate."""
        return self._tables().bias

    # ----- the CTRSource interface -----

    def train_batches(self, batch_size, *, epoch=0, skip_batches=0, shard_index=0, num_shards=1):
        """One epoch of full batches; every epoch reads the same rows in the same order (rows are
        iid, so `epoch` changes nothing). Shard s reads the s-th contiguous slice of the split.

        Args:
            batch_size: the rows of a batch (this shard's).
            epoch: the epoch (changes nothing).
            skip_batches: the batches of the epoch to skip (a resumed run's).
            shard_index: this shard's index, in [0, num_shards).
            num_shards: the number of shards (Horovod ranks).

        Returns:
            A tf.data.Dataset of (features {"dense", "categorical"}, labels [b, 1]) batches.

        Raises:
            ValueError: `batch_size` or `num_shards` is below 1, `shard_index` not in
                [0, num_shards), or `skip_batches` not in [0, batches per epoch]."""
        steps = self.train_steps_per_epoch(batch_size, num_shards)
        check_shard(shard_index, num_shards)
        if not 0 <= skip_batches <= steps:
            raise ValueError(f"skip_batches={skip_batches} must be in [0, {steps}] (batches per epoch)")
        first = shard_index * (self.train_rows // num_shards) + skip_batches * batch_size
        rows = self.rows(first, (steps - skip_batches) * batch_size, batch_size,
                         keys=_TRAINING_KEYS, drop_remainder=True)
        return rows.map(_features_and_labels)

    def test_batches(self, batch_size, *, shard_index=0, num_shards=1):
        """The test split once; shard s reads the s-th of num_shards near-equal contiguous
        slices.

        Args:
            batch_size: the rows of a batch (the last one may be short).
            shard_index: this shard's index, in [0, num_shards).
            num_shards: the number of shards (Horovod ranks).

        Returns:
            A tf.data.Dataset of (features {"dense", "categorical"}, labels [b, 1]) batches.

        Raises:
            ValueError: `batch_size` is below 1, or `shard_index` not in [0, num_shards)."""
        check_batch_size(batch_size)
        check_shard(shard_index, num_shards)
        first = self.train_rows + self.test_rows * shard_index // num_shards
        end = self.train_rows + self.test_rows * (shard_index + 1) // num_shards
        return self.rows(first, end - first, batch_size, keys=_TRAINING_KEYS).map(_features_and_labels)

    def train_steps_per_epoch(self, batch_size, num_shards=1):
        """Full batches per shard per epoch.

        Args:
            batch_size: the rows of a batch (one shard's).
            num_shards: the number of shards.

        Returns:
            An int.

        Raises:
            ValueError: `batch_size` or `num_shards` is below 1."""
        check_batch_size(batch_size)
        if num_shards < 1:
            raise ValueError(f"num_shards={num_shards} must be >= 1")
        return self.train_rows // num_shards // batch_size

    def describe(self):
        return (f"SyntheticCTR(seed={self.seed}, train_rows={self.train_rows}, "
                f"test_rows={self.test_rows}, vocabulary_scale={self.vocabulary_scale:.4g}: "
                f"{self.schema.total_vocabulary} ids, click rate {self.click_rate:.0%}"
                + (f", ids below probability {self.rare_id_probability:.3g} carry signal x "
                   f"(p / {self.rare_id_probability:.3g})^{self.rare_id_power:g}"
                   if self.rare_id_probability is not None else "") + ")")

    # ----- rows -----

    def rows(self, first_row, num_rows, batch_size, *, keys=ROW_KEYS, drop_remainder=False):
        """Rows [first_row, first_row + num_rows) as a tf.data.Dataset of dicts of batches.

        Args:
            first_row: the first row of the stream to read.
            num_rows: the number of rows.
            batch_size: the rows of a batch.
            keys: the entries of each batch, any of "dense" float32 [b, 13] transformed,
                "dense_raw" int64 [b, 13] raw counts (0 where missing), "dense_present" bool
                [b, 13], "categorical" int64 [b, 26] (0 = missing), "label" float32 [b],
                "teacher_probability" float32 [b] (default: all).
            drop_remainder: leave out a last batch shorter than `batch_size`.

        Returns:
            A tf.data.Dataset of dicts from key to batch tensor.

        Raises:
            ValueError: `batch_size` is below 1, `first_row` or `num_rows` is negative, or
                `keys` holds an unknown key."""
        check_batch_size(batch_size)
        if first_row < 0 or num_rows < 0:
            raise ValueError(f"first_row={first_row} and num_rows={num_rows} must be >= 0")
        unknown = set(keys) - set(ROW_KEYS)
        if unknown:
            raise ValueError(f"unknown row keys {sorted(unknown)}; choose from {ROW_KEYS}")
        tables = held_by_reference(self._tables())
        return rows_of_blocks(lambda block: self._block(block, tables()), first_row, num_rows,
                              batch_size, keys, drop_remainder)

    def _block(self, block, tables):
        """All values of rows [block * BLOCK_ROWS, (block + 1) * BLOCK_ROWS), as ROW_KEYS."""
        values = self._unlabelled_block(block, tables.id_of_rank)
        terms = _teacher_terms(tables, values["categorical"] + self._offsets, values["dense"])
        probability = tf.sigmoid(tf.add_n(terms) + tables.bias)
        values["label"] = tf.cast(values.pop("label_uniform") < probability, tf.float32)
        values["teacher_probability"] = probability
        return values

    def _unlabelled_block(self, block, id_of_rank):
        """A block's features and the uniforms that draw its labels."""
        block = tf.cast(block, tf.int64)
        seed = lambda stream: tf.stack([tf.constant(self.seed, tf.int64), block * _BLOCK_STREAMS + stream])
        id_uniforms = tf.random.stateless_uniform([BLOCK_ROWS, _NUM_FIELDS], seed(0), dtype=tf.float64)
        # Columns: categorical missing, dense missing, label.
        uniforms = tf.random.stateless_uniform([BLOCK_ROWS, _NUM_FIELDS + _NUM_DENSE + 1], seed(1))
        normals = tf.random.stateless_normal([BLOCK_ROWS, _NUM_DENSE], seed(2))
        return {
            **dense_features(uniforms[:, _NUM_FIELDS:-1], normals),
            "categorical": self._sample_ids(id_uniforms, uniforms[:, :_NUM_FIELDS], id_of_rank),
            "label_uniform": uniforms[:, -1],
        }

    def _sample_ids(self, id_uniforms, missing_uniforms, id_of_rank):
        """Ids by inverting each field's discretised power law CDF; missing ones become 0.

        Rank k in [1, n] has probability proportional to k^(1-s) - (k+1)^(1-s) (a bounded Pareto
        on [1, n+1) rounded down), which falls off as k^-s like Zipf's law."""
        n = tf.constant(self.cardinalities, tf.float64)
        power = tf.constant(1.0 - self.zipf_exponents, tf.float64)
        tail_mass = 1.0 - tf.pow(n + 1.0, power)
        rank = tf.clip_by_value(tf.floor(tf.pow(1.0 - id_uniforms * tail_mass, 1.0 / power)), 1.0, n)
        offsets = tf.constant(self._offsets, tf.int64)
        ids = tf.cast(tf.gather(id_of_rank, offsets + tf.cast(rank, tf.int64)), tf.int64)
        missing = missing_uniforms < tf.constant(CATEGORICAL_MISSING_RATES, tf.float32)
        return tf.where(missing, tf.constant(MISSING_ID, tf.int64), ids)

    # ----- one-off tables -----

    def _tables(self):
        """The _PerIdTables, once the background thread has built them."""
        return self._per_id_tables.result()

    def _build_per_id_tables(self):
        return self._teacher(self._id_order())

    def _stateless_uniform(self, shape, stream):
        seed = tf.constant([self.seed, stream], tf.int64)
        return _stateless_draw(tf.raw_ops.StatelessRandomUniformV2, shape, seed, tf.float64).numpy()

    def _id_order(self):
        """A random order of each field's ids 1..n, so that frequency does not follow the id:
        the rank -> id table as an int32 tensor indexed by offset + rank (id 0 at rank 0)."""
        keys = self._stateless_uniform([self.schema.total_vocabulary], _STREAM_ID_ORDER)
        id_of_rank = np.zeros(keys.size, np.int32)
        for offset, n in zip(self._offsets, self.cardinalities):
            field = slice(offset + 1, offset + n + 1)
            id_of_rank[field] = _stable_argsort_unit(keys[field]) + 1
        return tf.constant(id_of_rank)

    def _rank_of_id(self, field_index):
        """Field `field_index`'s id -> rank table (numpy int32, rank 0 for id 0), the inverse of
        the id order; built on first use."""
        if field_index not in self._ranks:
            offset, n = self._offsets[field_index], self.cardinalities[field_index]
            ids = self._tables().id_of_rank[offset:offset + n + 1].numpy()
            ranks = np.zeros(n + 1, np.int32)
            ranks[ids] = np.arange(n + 1, dtype=np.int32)
            self._ranks[field_index] = ranks
        return self._ranks[field_index]

    def _teacher(self, id_of_rank):
        """The teacher's per-id draws and calibrated scales (see _PerIdTables) and its bias; see
        FIRST_ORDER_SPREAD. `id_of_rank`: the id order, which the calibration rows need."""
        seeds = tf.random.experimental.stateless_split(tf.constant([self.seed, _STREAM_TEACHER], tf.int64), 3)
        total = self.schema.total_vocabulary
        unscaled = _PerIdTables(
            id_of_rank=id_of_rank,
            first_order_normals=_stateless_draw(tf.raw_ops.StatelessRandomNormalV2, [total], seeds[0]),
            hidden_normals=_stateless_draw(tf.raw_ops.StatelessRandomNormalV2, [total, TEACHER_RANK],
                                           seeds[1]),
            importances=tf.constant(self.field_importances, tf.float32),
            first_order_scale=1.0, hidden_scale=1.0,
            dense_weights=tf.random.stateless_normal([_NUM_DENSE], seeds[2]), bias=0.0,
            signal=self._rare_id_signal(id_of_rank))

        blocks = [self._unlabelled_block(block, id_of_rank) for block in range(CALIBRATION_BLOCKS)]
        rows = tf.concat([block["categorical"] for block in blocks], 0) + self._offsets
        dense = tf.concat([block["dense"] for block in blocks], 0)
        terms = [term.numpy().astype(np.float64) for term in _teacher_terms(unscaled, rows, dense)]
        scales = [spread / term.std() for spread, term in
                  zip((FIRST_ORDER_SPREAD, PAIRWISE_SPREAD, DENSE_SPREAD), terms)]
        bias = bias_for_click_rate(sum(scale * term for scale, term in zip(scales, terms)), self.click_rate)
        # The pairwise term is quadratic in the hidden vectors.
        return unscaled._replace(first_order_scale=scales[0], hidden_scale=math.sqrt(scales[1]),
                                 dense_weights=unscaled.dense_weights * scales[2], bias=bias)

    def _rare_id_signal(self, id_of_rank):
        """float32 [ids]: the factor on each row's (field offset + id) teacher weights, min(1,
        p / rare_id_probability) ** rare_id_power (1 for missing values); None without the
        option (the default data's terms stay bitwise as recorded)."""
        if self.rare_id_probability is None:
            return None
        order = id_of_rank.numpy()
        signal = np.ones(order.size, np.float32)
        for field_index, (offset, n) in enumerate(zip(self._offsets, self.cardinalities)):
            probability = self._rank_probability(field_index, np.arange(1, n + 1))
            signal[offset + order[offset + 1:offset + n + 1]] = np.minimum(
                1.0, probability / self.rare_id_probability) ** self.rare_id_power
        return tf.constant(signal)

    def _rank_probability(self, field_index, rank):
        """Probability (numpy float64) that a row's value of field `field_index` is the id of
        each `rank` (>= 1). TensorFlow's pow, not NumPy's: NumPy picks its kernel by CPU
        (AVX-512 or not), which changes the last bits."""
        n = self.cardinalities[field_index]
        power = 1.0 - float(self.zipf_exponents[field_index])
        rank = tf.constant(rank, tf.float64)
        mass = (tf.pow(rank, power) - tf.pow(rank + 1, power)) / (1.0 - math.pow(n + 1.0, power))
        return (1.0 - CATEGORICAL_MISSING_RATES[field_index]) * mass.numpy()

    # ----- the ceiling and id statistics -----

    def test_teacher_probabilities(self):
        """(labels, teacher probabilities) of the test rows in order, as float numpy arrays.

        Returns:
            A tuple of two numpy arrays of the test split's length (computed once)."""
        if self._test_teacher is None:
            labels, probabilities = [], []
            keys = ("label", "teacher_probability")
            for rows in self.rows(self.train_rows, self.test_rows, 65536, keys=keys):
                labels.append(rows["label"].numpy())
                probabilities.append(rows["teacher_probability"].numpy())
            self._test_teacher = (np.concatenate(labels), np.concatenate(probabilities))
        return self._test_teacher

    def teacher_auc(self):
        """The teacher's exact AUC on the test rows: the best AUC any model can expect.

        Returns:
            A float.

        Raises:
            ValueError: the test split is empty or its labels are all of one class."""
        return metrics.exact_auc(*self.test_teacher_probabilities())

    def teacher_logloss(self):
        """The teacher's mean log loss on the test rows.

        Returns:
            A float."""
        return metrics.log_loss(*self.test_teacher_probabilities())

    def id_probability(self, field_index, ids):
        """Probability that a row's value of field `field_index` is each of `ids` (0 = missing).

        Args:
            field_index: the categorical field, 0 for C1.
            ids: ids of that field (array-like), in [0, its cardinality].

        Returns:
            A float numpy array of `ids`' shape.

        Raises:
            ValueError: an id is outside [0, the field's cardinality]."""
        ids = np.asarray(ids, dtype=np.int64)
        n = self.cardinalities[field_index]
        if ids.size and (ids.min() < 0 or ids.max() > n):
            raise ValueError(f"ids of field C{field_index + 1} must be in [0, {n}]")
        # Missing ids (rank 0) get rank 1 here; np.where below replaces them.
        rank = np.maximum(self._rank_of_id(field_index)[ids], 1)
        return np.where(ids == MISSING_ID, CATEGORICAL_MISSING_RATES[field_index],
                        self._rank_probability(field_index, rank))

    # ----- Criteo TSV -----

    def write_criteo_tsv(self, path, first_row, num_rows, *, with_label=True, chunk_rows=65536):
        """Write rows [first_row, first_row + num_rows) in Criteo Kaggle format: label (if
        with_label), I1..I13 as integers, C1..C26 as 8-char hex, tab separated, empty = missing.
        A path ending in .gz is gzip-compressed. Streams chunk by chunk.

        Args:
            path: the file to write (replaced if it exists).
            first_row: the first row of the stream to write.
            num_rows: the number of rows.
            with_label: write the label column (False: a test file's 39 fields).
            chunk_rows: the rows generated and written at a time."""
        opener = gzip.open if str(path).endswith(".gz") else open
        keys = ("dense_raw", "dense_present", "categorical", "label")
        with opener(path, "wt", newline="\n") as out:
            for chunk in self.rows(first_row, num_rows, chunk_rows, keys=keys):
                out.write(_criteo_lines({key: value.numpy() for key, value in chunk.items()}, with_label))


def rows_of_blocks(block_values, first_row, num_rows, batch_size, keys, drop_remainder=False):
    """Rows [first_row, first_row + num_rows) of a stream generated in blocks of BLOCK_ROWS
    (`block_values(block)`: a dict of the block's rows, tensors [BLOCK_ROWS, ...]) as a
    tf.data.Dataset of dicts of batches of the given `keys`."""
    end_row = first_row + num_rows
    first_block = first_row // BLOCK_ROWS
    end_block = -(-end_row // BLOCK_ROWS) if num_rows else first_block

    @tf.autograph.experimental.do_not_convert  # plain tensor code: no conversion to trace
    def block_slice(block):
        rows = block_values(block)
        lo = tf.maximum(first_row - block * BLOCK_ROWS, 0)
        hi = tf.minimum(end_row - block * BLOCK_ROWS, BLOCK_ROWS)
        # gather, not a slice: an aligned slice shares its buffer, which rebatch logs as an error.
        return {key: tf.gather(rows[key], tf.range(lo, hi)) for key in keys}

    blocks = tf.data.Dataset.range(first_block, end_block).map(
        block_slice, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return without_autotuning(
        blocks.rebatch(batch_size, drop_remainder=drop_remainder).prefetch(tf.data.AUTOTUNE))


class _PerIdTables(typing.NamedTuple):
    """The id order (int32, indexed by field offset + rank: the id) and the teacher. Its weights
    of a row (field offset + id) are its standard normal draws times the field's importance,
    times the calibrated scale: applied to the rows a block gathers, so the build makes no copy
    of the per-id draws (at Criteo's cardinalities 1.2 GB). Tensors, not variables: a stateful
    op in the dataset's map would make tf.data run it serially under op determinism; the
    dataset holds them by reference (tfscale.data.pipeline.held_by_reference)."""

    id_of_rank: tf.Tensor
    first_order_normals: tf.Tensor  # float32 [ids]
    hidden_normals: tf.Tensor  # float32 [ids, TEACHER_RANK]
    importances: tf.Tensor  # float32 [fields]
    first_order_scale: float
    hidden_scale: float
    dense_weights: tf.Tensor  # scaled
    bias: float
    signal: typing.Optional[tf.Tensor]  # float32 [ids], SyntheticCTR's rare-id factors, or None


def _stateless_draw(op, shape, seed, dtype=tf.float32):
    """What tf.random.stateless_uniform or stateless_normal (`op`: their raw V2 op) draw from
    `seed` in [0, 1) or N(0, 1), without their `* 1 + 0`: the same values in one tensor, not
    three."""
    key, counter = tf.raw_ops.StatelessRandomGetKeyCounter(seed=seed)
    return op(shape=shape, key=key, counter=counter, alg=tf.random.Algorithm.AUTO_SELECT.value,
              dtype=dtype)


def _in_background(function):
    """A future of function() run in a new thread; its result() waits and re-raises."""
    executor = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    future = executor.submit(function)
    executor.shutdown(wait=False)
    return future


def _criteo_lines(rows, with_label):
    """Rows (numpy dict as from SyntheticCTR.rows) as Criteo TSV text."""
    columns = []
    if with_label:
        columns.append(rows["label"].astype(np.int64).astype(str))
    for j in range(_NUM_DENSE):
        columns.append(np.where(rows["dense_present"][:, j], rows["dense_raw"][:, j].astype(str), ""))
    for f in range(_NUM_FIELDS):
        ids = rows["categorical"][:, f]
        columns.append(np.where(ids == MISSING_ID, "", criteo_hash(f, ids)))
    return "".join("\t".join(line) + "\n" for line in zip(*columns))


def _teacher_terms(tables, rows, dense):
    """The teacher's first-order, pairwise (FM) and dense logit terms, each [batch]; `rows` are
    categorical ids plus field offsets."""
    first_weights = _scaled(tf.gather(tables.first_order_normals, rows), tables.importances,
                            tables.first_order_scale)
    vectors = _scaled(tf.gather(tables.hidden_normals, rows), tables.importances[:, None],
                      tables.hidden_scale)
    if tables.signal is not None:
        row_signal = tf.gather(tables.signal, rows)
        first_weights *= row_signal
        vectors *= row_signal[..., None]
    return teacher_terms(first_weights, vectors, tables.dense_weights, dense)


def _scaled(normals, importances, scale):
    """(normals * importances) * scale, rounded in that order, as when the whole per-id tables
    were scaled (the data's recorded digests). multiply_no_nan (the product, for these nonzero
    factors) keeps Grappler from folding the two constant factors into one in a graph, which
    rounds differently."""
    return tf.math.multiply_no_nan(normals, importances) * scale


def teacher_terms(first_weights, vectors, dense_weights, dense):
    """The teacher's first-order, pairwise (FM) and dense logit terms, each [batch], from each
    row's first-order weights [batch, fields] and hidden vectors [batch, fields, rank]."""
    first = tf.reduce_sum(first_weights, axis=1)
    summed = tf.reduce_sum(vectors, axis=1)
    # sum_{f<g} <h_f, h_g> = (|sum_f h_f|^2 - sum_f |h_f|^2) / 2, in O(fields * rank).
    pairwise = 0.5 * (tf.reduce_sum(summed * summed, axis=1) - tf.reduce_sum(vectors * vectors, axis=[1, 2]))
    # A product and a sum, not matvec: TensorFlow runs MatMul on oneDNN's kernels on some CPUs
    # and on Eigen's on others, which round differently; the data must not depend on the CPU.
    return first, pairwise, tf.reduce_sum(dense * dense_weights, axis=1)


def bias_for_click_rate(logits, click_rate):
    """The bias b with mean(sigmoid(logits + b)) = click_rate, by bisection."""
    low, high = -30.0, 30.0
    for _ in range(60):
        middle = (low + high) / 2
        if np.mean(1.0 / (1.0 + np.exp(-(logits + middle)))) < click_rate:
            low = middle
        else:
            high = middle
    return (low + high) / 2


def dense_features(missing_uniforms, normals):
    """The integer features of rows from uniforms [rows, 13] (a value is missing below its
    field's rate) and standard normals [rows, 13]: "dense" (the Criteo reader's transform,
    sign(x) * log1p(|x|), missing -> 0), "dense_raw" (counts, 0 where missing) and
    "dense_present"."""
    dense_present = missing_uniforms >= tf.constant(DENSE_MISSING_RATES, tf.float32)
    dense_raw = tf.where(dense_present, _dense_counts(normals), tf.zeros([], tf.int64))
    return {"dense": log_transform(tf.cast(dense_raw, tf.float32), dense_present),
            "dense_raw": dense_raw, "dense_present": dense_present}


def _dense_counts(normals):
    """Heavy-tailed integer counts from standard normals (see DENSE_LOG_MEANS)."""
    log_count = tf.constant(DENSE_LOG_MEANS) + tf.constant(DENSE_LOG_STDS) * normals
    counts = tf.cast(tf.floor(tf.math.expm1(tf.maximum(log_count, 0.0))), tf.int64)
    return counts + tf.constant(DENSE_OFFSETS, tf.int64)


def _features_and_labels(rows):
    return ({"dense": rows["dense"], "categorical": rows["categorical"]}, rows["label"][:, None])


def check_batch_size(batch_size):
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size} must be >= 1")


def check_shard(shard_index, num_shards):
    if not 0 <= shard_index < num_shards:
        raise ValueError(f"shard_index={shard_index} must be in [0, num_shards={num_shards})")
