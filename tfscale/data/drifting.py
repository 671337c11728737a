"""The drifting synthetic stream: Criteo-like days in which new ids are born every day and old
ones fade, with labels from a planted teacher model, so that the best achievable AUC of each day
is known. For online training (one pass per day, each day scored before it is trained on) and for
comparing tables that grow with their ids against fixed vocabularies and hashing.

Owns: the generative model below, the rows of a day (tf.data over fixed blocks of rows, stateless
random ops keyed by (seed, day, block)), the teacher and its per-day ceiling, and the birth day and
age law of an id. Encoding the raw ids for a model is tfscale.data.drifting_days's.

The generative model (docs/architecture.md, "The drifting stream"):
- Days d = 0, 1, ... (shown as day d + 1), each of `rows_per_day` rows. Row r of day d depends
  only on (seed, vocabulary_scale, half_life_days, click_rate, d, r): never on how many days the
  stream has, on rows_per_day, batch size, shard or where a read starts.
- The 13 integer features and every missing rate are SyntheticCTR's.
- The 26 categorical fields have SyntheticCTR's cardinalities n_f (Criteo's, the part above
  SMALL_FIELD_LIMIT times vocabulary_scale). A small field (n_f <= SMALL_FIELD_LIMIT) keeps its
  ids 1..n_f every day, id k drawn with probability ~ k^-s_f (the field's Zipf exponent s_f).
- A large field's ids are born: with decay = 2^(-1 / half_life_days), each day a cohort of
  m_f = round((1 - decay) * n_f) new ids is born, and a value of day d is an id of age a (born on
  day d - a) with probability (1 - decay) decay^a / (1 - decay^(MAX_AGE + 1)), a <= MAX_AGE =
  ceil(AGE_HALF_LIVES * half_life_days) (older ids retire); within its cohort the id of
  popularity rank k is drawn with probability ~ k^-s_f. So an id's chance to appear halves every
  half_life_days days after its birth, every day sees the same law of ages (cohorts born before
  day 0 make day 0 like any other), and the ids themselves keep changing: a value of day d has an
  id born after day 0 with probability 1 - decay^d (up to the retirement cut).
- Raw ids are int64 in [1, RAW_ID_LIMIT), 0 = missing: a small field's id is its popularity rank;
  a large field's is its birth order, 1 + (birth day + MAX_AGE) * m_f + (rank - 1), so ids keep
  growing, with no fixed vocabulary.
- Labels: the teacher of SyntheticCTR, logit = bias + sum_f w[f, id_f] + sum_{f<g} <h[f, id_f],
  h[g, id_g]> + sum_j d_j x_j, where every id, new or old, draws w ~ N(0, g_f^2) and
  h ~ N(0, g_f^2 I_8) from a hash of (seed, field, id) when it is first needed (nothing is
  tabulated); the three terms are scaled to SyntheticCTR's spreads and the bias set for
  click_rate on the first CALIBRATION_BLOCKS blocks of day 0. A day's ceiling is the exact AUC
  of the teacher's own probabilities on its rows (`teacher_auc(day)`).
"""

import math

import numpy as np
import tensorflow as tf

from tfscale import metrics
from tfscale.data import synthetic
from tfscale.data.schema import MISSING_ID
from tfscale.data.synthetic import (BLOCK_ROWS, CALIBRATION_BLOCKS, CATEGORICAL_MISSING_RATES,
                                    DENSE_LOG_MEANS, SMALL_FIELD_LIMIT, TEACHER_RANK,
                                    ZIPF_MAX, ZIPF_MIN)
from tfscale.data.text_lines import mix64

# Raw ids are below this (the id range dynamic tables key by (field, id)).
RAW_ID_LIMIT = 1 << 56
# Ids retire this many half-lives after their birth (their weight then below 2^-10).
AGE_HALF_LIVES = 10
ROW_KEYS = synthetic.ROW_KEYS
DENSE_NAMES = tuple(f"I{j + 1}" for j in range(len(DENSE_LOG_MEANS)))
CATEGORICAL_NAMES = tuple(f"C{f + 1}" for f in range(len(synthetic.CRITEO_CARDINALITIES)))

_NUM_FIELDS = len(CATEGORICAL_NAMES)
_NUM_DENSE = len(DENSE_NAMES)
# Stateless seeds are (seed, key): a block's streams have key ((day + 1) << _DAY_SHIFT) +
# block * _BLOCK_STREAMS + stream; one-off draws negative keys.
_DAY_SHIFT = 40
_BLOCK_STREAMS = 4
_KEY_FIELD_PARAMETERS, _KEY_DENSE_WEIGHTS = -1, -2
_ID_HASH_SALT = 0x5DEECE66D  # the ids' hash is keyed by mix64(seed + this)
# A (field, id) hashes to this many 64-bit words, two uniforms each, one Box-Muller pair: the
# normals of its teacher weights w and the TEACHER_RANK entries of h.
_WEIGHT_WORDS = math.ceil((1 + TEACHER_RANK) / 2)
_GOLDEN = 0x9E3779B97F4A7C15


class DriftingCTR:
    """A Criteo-like stream of days whose ids are born and fade, with a planted teacher model
    (the generative model is the module's docstring).

    Args:
      seed: picks everything: Zipf exponents, field importances, the teacher and every row.
      days: how many days the stream has (a day's rows do not depend on it).
      rows_per_day: rows of each day.
      vocabulary_scale: factor on the part of a Criteo cardinality above SMALL_FIELD_LIMIT, as
        SyntheticCTR's (1/20: about 1.8M ids in circulation; a large field's daily births scale
        with it).
      half_life_days: days after which an id's chance to appear has halved (> 0).
      click_rate: the teacher's bias is calibrated so the mean click probability is this.
    """

    def __init__(self, seed=0, days=7, rows_per_day=1_000_000, vocabulary_scale=1 / 20,
                 half_life_days=7.0, click_rate=0.25):
        if days < 1 or rows_per_day < 1:
            raise ValueError(f"days={days} and rows_per_day={rows_per_day} must be >= 1")
        if not 0 < vocabulary_scale <= 1:
            raise ValueError(f"vocabulary_scale={vocabulary_scale} must be in (0, 1]")
        if not 0 < half_life_days < math.inf:
            raise ValueError(f"half_life_days={half_life_days} must be a positive number")
        if not 0 < click_rate < 1:
            raise ValueError(f"click_rate={click_rate} must be in (0, 1)")
        self.seed = int(seed)
        self.days = int(days)
        self.rows_per_day = int(rows_per_day)
        self.vocabulary_scale = vocabulary_scale
        self.half_life_days = float(half_life_days)
        self.click_rate = click_rate
        self.cardinalities = synthetic.scaled_cardinalities(vocabulary_scale)
        self.decay = 2.0 ** (-1.0 / self.half_life_days)
        self.max_age = math.ceil(AGE_HALF_LIVES * self.half_life_days)
        # New ids per day of each field (0: a small field, whose ids are never born).
        self.births_per_day = tuple(
            max(1, round((1.0 - self.decay) * n)) if n > SMALL_FIELD_LIMIT else 0
            for n in self.cardinalities)
        field_parameters = self._stateless_uniform([2, _NUM_FIELDS], _KEY_FIELD_PARAMETERS)
        self.zipf_exponents = ZIPF_MIN + (ZIPF_MAX - ZIPF_MIN) * field_parameters[0]
        self.field_importances = 0.5 + field_parameters[1]
        self._dense_weights = tf.random.stateless_normal(
            [_NUM_DENSE], tf.constant([self.seed, _KEY_DENSE_WEIGHTS], tf.int64))
        self._hash_salt = mix64(tf.constant(self.seed, tf.int64) + _ID_HASH_SALT)
        self._calibrated = None  # (scales of the teacher's terms, bias), on first use
        self._ceilings = {}

    def describe(self):
        return (f"DriftingCTR(seed={self.seed}, {self.rows_per_day:,} rows a day, "
                f"vocabulary_scale={self.vocabulary_scale:g}, half-life "
                f"{self.half_life_days:g} days, click rate {self.click_rate:g})")

    def day_name(self, day):
        """What identifies day `day` (0-based) of this stream, e.g. in checkpoints."""
        self._check_day(day)
        return f"day {day + 1} of {self.describe()}"

    # ----- rows

    def rows(self, day, first_row, num_rows, batch_size, *, keys=ROW_KEYS, drop_remainder=False):
        """Rows [first_row, first_row + num_rows) of day `day` (0-based) as a tf.data.Dataset of
        dicts of batches, with SyntheticCTR.rows's keys; "categorical" holds the raw ids, int64
        [b, 26] in [0, RAW_ID_LIMIT) (0 = missing)."""
        self._check_day(day)
        synthetic.check_batch_size(batch_size)
        if first_row < 0 or num_rows < 0 or first_row + num_rows > self.rows_per_day:
            raise ValueError(f"rows [{first_row}, {first_row + num_rows}) are not within the "
                             f"day's {self.rows_per_day} rows")
        unknown = set(keys) - set(ROW_KEYS)
        if unknown:
            raise ValueError(f"unknown row keys {sorted(unknown)}; choose from {ROW_KEYS}")
        if {"label", "teacher_probability"} & set(keys):
            self.calibration()  # eagerly, before the blocks are traced
            block_values = self._block
        else:  # features alone: no teacher to compute
            block_values = self._unlabelled_block
        return synthetic.rows_of_blocks(lambda block: block_values(day, block), first_row,
                                        num_rows, batch_size, keys, drop_remainder)

    def _block(self, day, block):
        """All values of rows [block * BLOCK_ROWS, (block + 1) * BLOCK_ROWS) of `day`."""
        values = self._unlabelled_block(day, block)
        probability = tf.sigmoid(self._teacher_logits(values["categorical"], values["dense"]))
        values["label"] = tf.cast(values.pop("label_uniform") < probability, tf.float32)
        values["teacher_probability"] = probability
        return values

    def _unlabelled_block(self, day, block):
        """A block's features and the uniforms that draw its labels."""
        key = tf.cast(block, tf.int64) * _BLOCK_STREAMS + ((day + 1) << _DAY_SHIFT)
        seed = lambda stream: tf.stack([tf.constant(self.seed, tf.int64), key + stream])
        rank_uniforms = tf.random.stateless_uniform([BLOCK_ROWS, _NUM_FIELDS], seed(0),
                                                    dtype=tf.float64)
        age_uniforms = tf.random.stateless_uniform([BLOCK_ROWS, _NUM_FIELDS], seed(1),
                                                   dtype=tf.float64)
        # Columns: categorical missing, dense missing, label.
        uniforms = tf.random.stateless_uniform([BLOCK_ROWS, _NUM_FIELDS + _NUM_DENSE + 1],
                                               seed(2))
        normals = tf.random.stateless_normal([BLOCK_ROWS, _NUM_DENSE], seed(3))
        return {
            **synthetic.dense_features(uniforms[:, _NUM_FIELDS:-1], normals),
            "categorical": self._sample_ids(day, rank_uniforms, age_uniforms,
                                            uniforms[:, :_NUM_FIELDS]),
            "label_uniform": uniforms[:, -1],
        }

    def _sample_ids(self, day, rank_uniforms, age_uniforms, missing_uniforms):
        """Raw ids: an age (0 in small fields) by inverting its truncated geometric law, a rank
        within the cohort (the field, in small fields) by inverting the discretised power law
        SyntheticCTR uses; missing ones become 0."""
        large = np.array(self.births_per_day) > 0
        ranks = tf.constant(np.where(large, self.births_per_day, self.cardinalities), tf.float64)
        power = tf.constant(1.0 - self.zipf_exponents, tf.float64)
        tail_mass = 1.0 - tf.pow(ranks + 1.0, power)
        rank = tf.clip_by_value(tf.floor(tf.pow(1.0 - rank_uniforms * tail_mass, 1.0 / power)),
                                1.0, ranks)
        kept_mass = 1.0 - self.decay ** (self.max_age + 1)
        age = tf.clip_by_value(
            tf.floor(tf.math.log(1.0 - age_uniforms * kept_mass) / math.log(self.decay)),
            0.0, float(self.max_age))
        births = tf.constant(self.births_per_day, tf.int64)
        cohort = tf.constant(day + self.max_age, tf.int64) - tf.cast(age, tf.int64)
        first_id = tf.where(tf.constant(large), 1 + cohort * births, tf.constant(1, tf.int64))
        ids = first_id + tf.cast(rank, tf.int64) - 1
        missing = missing_uniforms < tf.constant(CATEGORICAL_MISSING_RATES, tf.float32)
        return tf.where(missing, tf.constant(MISSING_ID, tf.int64), ids)

    # ----- the teacher

    def teacher_weights(self, ids):
        """The teacher's first-order weights [n, 26] and hidden vectors [n, 26, TEACHER_RANK]
        (before the calibration's scales) of raw ids [n, 26] (column f: field f), each a
        function of (seed, field, id) alone. Each distinct (field, id) is hashed once."""
        ids = tf.convert_to_tensor(ids, tf.int64)
        fields = tf.range(_NUM_FIELDS, dtype=tf.int64)
        keys = tf.bitwise.left_shift(fields, tf.constant(56, tf.int64)) + ids  # below 2^61
        distinct, position = tf.unique(tf.reshape(keys, [-1]))
        normals = tf.gather(self._normals_of_keys(distinct), tf.reshape(position, tf.shape(ids)))
        importance = tf.constant(self.field_importances, tf.float32)
        return normals[..., 0] * importance, normals[..., 1:] * importance[:, None]

    def _normals_of_keys(self, keys):
        """1 + TEACHER_RANK standard normals [n, 1 + TEACHER_RANK] per int64 key [n]: salted
        keys plus multiples of the golden ratio (wrapping), mixed, give two 24-bit uniforms per
        64 bits, turned into normals in Box-Muller pairs."""
        salted = mix64(tf.bitcast(tf.bitwise.bitwise_xor(tf.bitcast(keys, tf.uint64),
                                                         self._hash_salt), tf.int64))
        steps = tf.constant(np.arange(1, _WEIGHT_WORDS + 1, dtype=np.uint64) * np.uint64(_GOLDEN))
        words = mix64(tf.bitcast(salted[:, None] + steps, tf.int64))  # [n, _WEIGHT_WORDS]
        halves = tf.concat([tf.bitwise.right_shift(words, tf.constant(40, tf.uint64)),
                            tf.bitwise.right_shift(words, tf.constant(8, tf.uint64))
                            & tf.constant(0xFFFFFF, tf.uint64)], axis=1)
        uniforms = (tf.cast(halves, tf.float32) + 0.5) * (1.0 / (1 << 24))  # in (0, 1)
        radius = tf.sqrt(-2.0 * tf.math.log(uniforms[:, :_WEIGHT_WORDS]))
        angle = (2.0 * math.pi) * uniforms[:, _WEIGHT_WORDS:]
        normals = tf.concat([radius * tf.cos(angle), radius * tf.sin(angle)], axis=1)
        return normals[:, :1 + TEACHER_RANK]

    def _raw_terms(self, ids, dense):
        first_weights, vectors = self.teacher_weights(ids)
        return synthetic.teacher_terms(first_weights, vectors, self._dense_weights, dense)

    def _teacher_logits(self, ids, dense):
        scales, bias = self.calibration()
        terms = self._raw_terms(ids, dense)
        return tf.add_n([scale * term for scale, term in zip(scales, terms)]) + bias

    def calibration(self):
        """(The scales of the teacher's three terms, so that their spreads over the calibration
        rows are SyntheticCTR's, and the bias for click_rate), computed on first use."""
        if self._calibrated is None:
            self._calibrated = self._calibrate()
        return self._calibrated

    def _calibrate(self):
        blocks = [self._unlabelled_block(0, block) for block in range(CALIBRATION_BLOCKS)]
        terms = [np.concatenate(parts).astype(np.float64) for parts in zip(*(
            [term.numpy() for term in self._raw_terms(block["categorical"], block["dense"])]
            for block in blocks))]
        spreads = (synthetic.FIRST_ORDER_SPREAD, synthetic.PAIRWISE_SPREAD,
                   synthetic.DENSE_SPREAD)
        scales = [float(spread / term.std()) for spread, term in zip(spreads, terms)]
        bias = synthetic.bias_for_click_rate(
            sum(scale * term for scale, term in zip(scales, terms)), self.click_rate)
        return tuple(scales), bias

    def teacher_auc(self, day):
        """The teacher's exact AUC on day `day`'s rows: the best AUC a model can expect there."""
        return self._ceiling(day)["auc"]

    def teacher_logloss(self, day):
        """The teacher's mean log loss on day `day`'s rows."""
        return self._ceiling(day)["logloss"]

    def _ceiling(self, day):
        if day not in self._ceilings:
            labels, probabilities = [], []
            for rows in self.rows(day, 0, self.rows_per_day, 65536,
                                  keys=("label", "teacher_probability")):
                labels.append(rows["label"].numpy())
                probabilities.append(rows["teacher_probability"].numpy())
            labels, probabilities = np.concatenate(labels), np.concatenate(probabilities)
            self._ceilings[day] = {"auc": metrics.exact_auc(labels, probabilities),
                                   "logloss": metrics.log_loss(labels, probabilities)}
        return self._ceilings[day]

    # ----- births and ages

    def birth_day(self, field_index, ids):
        """The day (0-based; negative: before day 0) each raw id of large field `field_index`
        was born, as a numpy int64 array."""
        births = self.births_per_day[field_index]
        if births == 0:
            raise ValueError(f"field C{field_index + 1} is small: its ids are never born")
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size and ids.min() < 1:
            raise ValueError("raw ids start at 1 (0 is a missing value)")
        return (ids - 1) // births - self.max_age

    def age_share(self, age):
        """The probability that a present value of a large field has an id `age` days old."""
        if not 0 <= age <= self.max_age:
            return 0.0
        return (1.0 - self.decay) * self.decay ** age / (1.0 - self.decay ** (self.max_age + 1))

    # ----- helpers

    def _check_day(self, day):
        if not 0 <= day < self.days:
            raise ValueError(f"day={day} must be in [0, {self.days}) (0-based)")

    def _stateless_uniform(self, shape, key):
        seed = tf.constant([self.seed, key], tf.int64)
        return tf.random.stateless_uniform(shape, seed, dtype=tf.float64).numpy()
