"""The drifting synthetic stream (tfscale.data.drifting) and its days as sources
(tfscale.data.drifting_days): deterministic rows, ids born every day in the large fields whose
popularity fades with age as the generative model says (measured from generated rows), the
teacher's per-id weights drawn on demand and its exact per-day ceiling, and the three encodings:
the first day's vocabulary (its out-of-vocabulary share growing day by day), hashing with fitted
buckets, raw ids."""

import numpy as np
import pytest
import tensorflow as tf
from sklearn.metrics import roc_auc_score

from tfscale.data import drifting_days, synthetic
from tfscale.data.drifting import CATEGORICAL_NAMES, RAW_ID_LIMIT, DriftingCTR
from tfscale.data.schema import MISSING_ID
from tfscale.data.vocabulary import OOV_ID
from tfscale.data.vocabulary_cache import fitted_hash_buckets

DAYS = 5
ROWS = 12_000
HALF_LIFE = 2.0


@pytest.fixture(scope="module")
def stream():
    return DriftingCTR(seed=0, days=DAYS, rows_per_day=ROWS, vocabulary_scale=0.002,
                       half_life_days=HALF_LIFE)


def collect(dataset):
    """A dataset of dicts, or of (features, labels), concatenated into numpy arrays."""
    parts = [dict(element) if isinstance(element, dict) else {**element[0], "label": element[1]}
             for element in dataset]
    return {key: np.concatenate([part[key].numpy() for part in parts]) for key in parts[0]}


@pytest.fixture(scope="module")
def day_rows(stream):
    """Every row of every day, all keys, as numpy arrays: [day] -> {key: array}."""
    return [collect(stream.rows(day, 0, ROWS, 8192)) for day in range(DAYS)]


def large_fields(stream):
    return [f for f, births in enumerate(stream.births_per_day) if births]


def assert_same(a, b):
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def test_fields_follow_criteo_and_only_large_fields_are_born(stream):
    assert stream.cardinalities == synthetic.scaled_cardinalities(0.002)
    large = large_fields(stream)
    criteo = np.array(synthetic.CRITEO_CARDINALITIES)
    assert large == list(np.flatnonzero(criteo > synthetic.SMALL_FIELD_LIMIT))
    assert len(large) == 10
    for f in large:  # each day, (1 - decay) of the ids in circulation are new
        assert stream.births_per_day[f] == round((1 - 2 ** (-1 / HALF_LIFE)) * stream.cardinalities[f])


def test_rows_depend_only_on_seed_day_and_row(stream, day_rows):
    # Another start, batch size, number of days and rows per day: the same rows of day 2.
    other = DriftingCTR(seed=0, days=3, rows_per_day=9000, vocabulary_scale=0.002,
                        half_life_days=HALF_LIFE)
    part = collect(other.rows(2, 4000, 5000, 777))
    assert_same(part, {key: values[4000:9000] for key, values in day_rows[2].items()})
    reseeded = DriftingCTR(seed=1, days=3, rows_per_day=ROWS, vocabulary_scale=0.002,
                           half_life_days=HALF_LIFE)
    other_seed = collect(reseeded.rows(2, 0, 1000, 1000, keys=("categorical",)))
    assert not np.array_equal(other_seed["categorical"], day_rows[2]["categorical"][:1000])
    # Days differ from each other.
    assert not np.array_equal(day_rows[1]["categorical"], day_rows[2]["categorical"])


def test_ids_are_raw_growing_integers_and_small_fields_keep_theirs(stream, day_rows):
    large = large_fields(stream)
    small = [f for f in range(len(CATEGORICAL_NAMES)) if f not in large]
    previous_max = None
    for rows in day_rows:
        ids = rows["categorical"]
        assert ids.dtype == np.int64 and ids.min() >= 0 and ids.max() < RAW_ID_LIMIT
        for f in small:
            assert ids[:, f].max() <= stream.cardinalities[f]
        largest = ids[:, large].max(axis=0)
        if previous_max is not None:  # each large field's newest ids are newer every day
            assert (largest > previous_max).all()
        previous_max = largest


def test_new_ids_are_born_every_day(stream, day_rows):
    """Ids first seen on day d (never before) are mostly born that day; every large field gets
    some every day, and an id never appears before its birth."""
    for f in large_fields(stream):
        seen = set()
        for day, rows in enumerate(day_rows):
            ids = rows["categorical"][:, f]
            ids = ids[ids != MISSING_ID]
            born = stream.birth_day(f, ids)
            assert born.max() <= day
            new = np.array(sorted(set(ids.tolist()) - seen))
            seen.update(ids.tolist())
            born_today = stream.birth_day(f, new) == day
            assert born_today.sum() > 0.02 * ROWS, (f, day)  # hundreds of newborns a day
            if day > 0:  # after day 0, new ids are mostly newborns
                assert born_today.mean() > 0.3, (f, day, born_today.mean())


def test_popularity_fades_with_age_as_the_model_says(stream, day_rows):
    """Measured from the rows: the share of each age matches age_share, and the ids born on
    day 0 fade by `decay` a day."""
    large = large_fields(stream)
    ages = []
    for day, rows in enumerate(day_rows):
        for f in large:
            ids = rows["categorical"][:, f]
            ages.append(day - stream.birth_day(f, ids[ids != MISSING_ID]))
    ages = np.concatenate(ages)
    for age in range(5):
        np.testing.assert_allclose((ages == age).mean(), stream.age_share(age), atol=0.005)
    assert ages.max() <= stream.max_age
    born_on_day_0 = []
    for day, rows in enumerate(day_rows):
        shares = [np.mean(stream.birth_day(f, ids[ids != MISSING_ID]) == 0)
                  for f in large for ids in [rows["categorical"][:, f]]]
        born_on_day_0.append(np.mean(shares))
    ratios = np.array(born_on_day_0[1:]) / np.array(born_on_day_0[:-1])
    np.testing.assert_allclose(ratios, stream.decay, atol=0.05)


def test_missing_rates_and_click_rate_follow_the_synthetic_data(day_rows):
    rows = {key: np.concatenate([r[key] for r in day_rows]) for key in day_rows[0]}
    missing = (rows["categorical"] == MISSING_ID).mean(axis=0)
    np.testing.assert_allclose(missing, synthetic.CATEGORICAL_MISSING_RATES, atol=0.01)
    dense_missing = 1 - rows["dense_present"].mean(axis=0)
    np.testing.assert_allclose(dense_missing, synthetic.DENSE_MISSING_RATES, atol=0.01)
    assert 0.2 < rows["label"].mean() < 0.3


def test_teacher_weights_are_drawn_from_seed_field_and_id(stream, day_rows):
    ids = day_rows[3]["categorical"][:50]
    first, hidden = stream.teacher_weights(ids)
    assert first.shape == (50, 26) and hidden.shape == (50, 26, synthetic.TEACHER_RANK)
    # The same (field, id) anywhere, among any other ids: the same weights (up to the last bit
    # of float32 math, which vectorised kernels round by position).
    again_first, again_hidden = stream.teacher_weights(ids[::-1])
    np.testing.assert_allclose(first.numpy()[::-1], again_first.numpy(), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(hidden.numpy()[::-1], again_hidden.numpy(), rtol=1e-6, atol=1e-7)
    # One id in every field: a weight of its own per field; another seed: other weights.
    same_id = np.full((1, 26), 7, np.int64)
    per_field = stream.teacher_weights(same_id)[0].numpy()[0]
    assert len(np.unique(per_field)) == 26
    reseeded = DriftingCTR(seed=1, days=1, rows_per_day=10, vocabulary_scale=0.002)
    assert not np.allclose(reseeded.teacher_weights(same_id)[0].numpy()[0], per_field)
    # Normal draws scaled by the field's importance.
    many = np.arange(1, 20_001, dtype=np.int64)[:, None] * np.ones((1, 26), np.int64)
    draws = stream.teacher_weights(many)[0].numpy() / stream.field_importances
    assert abs(draws.mean()) < 0.03 and abs(draws.std() - 1) < 0.03


def test_each_days_ceiling_is_the_teachers_exact_auc(stream, day_rows):
    for day in (0, DAYS - 1):
        rows = day_rows[day]
        exact = roc_auc_score(rows["label"], rows["teacher_probability"])
        assert stream.teacher_auc(day) == pytest.approx(exact, abs=1e-9)
        assert 0.78 < stream.teacher_auc(day) < 0.85


@pytest.fixture(scope="module")
def first_day_vocabulary(stream):
    return drifting_days.count_day_vocabulary(stream, 0, min_count=1)


def test_first_day_vocabulary_leaves_more_ids_out_every_day(stream, day_rows,
                                                             first_day_vocabulary):
    """Ids unseen on day 1 read the out-of-vocabulary row: none on day 1 itself, then a share
    growing day by day as new ids take over."""
    encoding = drifting_days.vocabulary_ids(first_day_vocabulary)
    large = large_fields(stream)
    sizes = np.array(encoding.sizes)
    shares = []
    for rows in day_rows:
        ids = encoding.encode(tf.constant(rows["categorical"])).numpy()
        assert ((ids == MISSING_ID) == (rows["categorical"] == MISSING_ID)).all()
        assert (ids.max(axis=0) < sizes).all()
        ids = ids[:, large]
        shares.append(np.mean(ids[ids != MISSING_ID] == OOV_ID))
    assert shares[0] == 0
    assert all(later > earlier + 0.02 for earlier, later in zip(shares, shares[1:])), shares
    # A minimum count leaves the first day's rare ids out too.
    counted_twice = drifting_days.count_day_vocabulary(stream, 0, min_count=2)
    ids = drifting_days.vocabulary_ids(counted_twice).encode(
        tf.constant(day_rows[0]["categorical"])).numpy()[:, large]
    assert 0 < np.mean(ids[ids != MISSING_ID] == OOV_ID) < shares[1]
    # Through a day's batches, as training reads them.
    day = drifting_days.DriftingDay(stream, 2, encoding)
    np.testing.assert_array_equal(
        collect(day.test_batches(8192))["categorical"],
        encoding.encode(tf.constant(day_rows[2]["categorical"])).numpy())


def test_hashed_ids_in_buckets_fitted_to_the_first_days_distinct_ids(stream, day_rows,
                                                                     first_day_vocabulary):
    distinct = [len(np.unique(day_rows[0]["categorical"][:, f][
        day_rows[0]["categorical"][:, f] != MISSING_ID])) for f in range(26)]
    buckets = fitted_hash_buckets(first_day_vocabulary, CATEGORICAL_NAMES, 5000)
    assert buckets == tuple(min(5000, 2 * d) for d in distinct)
    day = drifting_days.DriftingDay(stream, 3, drifting_days.hashed_ids(buckets))
    assert day.schema.vocabulary_sizes == tuple(b + 1 for b in buckets)
    raw = day_rows[3]["categorical"]
    hashed = collect(day.test_batches(8192))["categorical"]
    assert ((hashed == MISSING_ID) == (raw == MISSING_ID)).all()
    assert (hashed.max(axis=0) <= np.array(buckets)).all()
    for f in (2, 20):  # each id always in one bucket
        assert len(set(zip(raw[:, f], hashed[:, f]))) == len(np.unique(raw[:, f]))


def test_raw_ids_pass_through_for_tables_keyed_by_id(stream, day_rows):
    day = drifting_days.DriftingDay(stream, 4, drifting_days.RAW_IDS)
    assert day.schema.vocabulary_sizes == (RAW_ID_LIMIT,) * 26
    batches = collect(day.test_batches(8192))
    np.testing.assert_array_equal(batches["categorical"], day_rows[4]["categorical"])
    assert batches["categorical"].dtype == np.int64
    np.testing.assert_array_equal(batches["label"][:, 0], day_rows[4]["label"])


def test_a_day_is_both_the_train_and_the_test_split_sharded_over_ranks(stream, day_rows):
    day = drifting_days.DriftingDay(stream, 1, drifting_days.RAW_IDS)
    features, labels = next(iter(day.train_batches(512)))
    assert features["dense"].dtype == tf.float32 and features["dense"].shape == (512, 13)
    assert labels.shape == (512, 1)
    # Shard s trains on the s-th slice of the day (full batches) and scores the s-th of its rows.
    assert day.train_steps_per_epoch(1500, num_shards=3) == 2
    whole = day_rows[1]["categorical"]
    for s in range(3):
        train = collect(day.train_batches(1500, shard_index=s, num_shards=3))["categorical"]
        start = s * (ROWS // 3)
        np.testing.assert_array_equal(train, whole[start:start + 3000])
    scored = [collect(day.test_batches(1500, shard_index=s, num_shards=3))["categorical"]
              for s in range(3)]
    np.testing.assert_array_equal(np.concatenate(scored), whole)
    skipped = collect(day.train_batches(1000, skip_batches=5))["categorical"]
    np.testing.assert_array_equal(skipped, whole[5000:])


def test_days_are_named_by_everything_that_makes_their_rows(stream):
    names = [name for name, _ in drifting_days.drifting_days(stream, drifting_days.RAW_IDS)]
    assert len(names) == DAYS and len(set(names)) == DAYS
    assert names[1] == stream.day_name(1)
    for part in ("day 2 of", "seed=0", "12,000 rows a day", "0.002", "half-life 2 days"):
        assert part in names[1]


def test_bad_arguments_are_refused(stream):
    with pytest.raises(ValueError, match=r"day=5 must be in \[0, 5\)"):
        stream.rows(5, 0, 10, 10)
    with pytest.raises(ValueError, match="not within the day's 12000 rows"):
        stream.rows(0, 11_990, 20, 10)
    with pytest.raises(ValueError, match="half_life_days=0"):
        DriftingCTR(half_life_days=0)
    with pytest.raises(ValueError, match="field C1 is small"):
        stream.birth_day(0, [1])
