"""The readers encode each block's categorical values where Arrow holds them
(parquet_columns.Categorical, tfscale.data.fingerprint): the ids they give are the ids
TensorFlow's encoders give the values as strings (what a served model computes from its lines),
bit for bit, with hashing and with a vocabulary, on Parquet files of repeated values, nulls,
empty values, odd bytes, integer and dictionary columns over several blocks and row groups, and
on text files; the vocabulary pass counts the same values."""

import collections

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tensorflow as tf

from tfscale.data import CriteoParquet, CriteoTSV
from tfscale.data.criteo import CATEGORICAL_NAMES, DENSE_NAMES
from tfscale.data.parquet_columns import Categorical
from tfscale.data.preprocessing import HashingEncoder, Preprocessing
from tfscale.data.vocabulary import Vocabulary

ROWS = 1000
ODD = [b"", b"a", b"\xff\xfe", "ünïcödé".encode(), b"0", b"00", b" a", b"a\x00b", b"A"]


def values(rng):
    """bytes [ROWS, 26] (b"": missing): Zipf-like repeats, odd bytes, column 3 integers as their
    text, column 5 long values."""
    table = np.empty([ROWS, len(CATEGORICAL_NAMES)], object)
    for k in range(len(CATEGORICAL_NAMES)):
        draws = rng.zipf(1.3, ROWS) % (5 + 40 * k)
        if k == 3:
            table[:, k] = [str(d - 7).encode() if d % 4 else b"" for d in draws]
        else:
            table[:, k] = [ODD[d] if d < len(ODD) else
                           (b"x" * (100 if k == 5 else 1) + b"%d" % d) for d in draws]
    return table


def parquet_file(path, table, rng):
    """`table`'s rows as Parquet: nulls and empty strings for missing values, column C4 as
    int64, C7 as a dictionary column whose dictionary holds unused and repeated values, C8 as
    large_binary; row groups of 300 rows."""
    columns = {"label": pa.array(rng.integers(0, 2, ROWS), pa.int64())}
    for name in DENSE_NAMES:
        columns[name] = pa.array(rng.integers(-5, 50, ROWS), pa.int64())
    for k, name in enumerate(CATEGORICAL_NAMES):
        column = table[:, k]
        nulls = [value == b"" and row % 2 == 0 for row, value in enumerate(column)]
        if k == 3:
            columns[name] = pa.array([None if value == b"" else int(value) for value in column],
                                     pa.int64())
        elif k == 6:
            dictionary = sorted(set(column)) + [b"unused"]
            dictionary = dictionary[:3] + dictionary  # repeated entries
            position = {value: index + 3 * (index >= 3) for index, value in
                        enumerate(sorted(set(column)))}
            indices = pa.array([None if null else position[value]
                                for null, value in zip(nulls, column)], pa.int32())
            columns[name] = pa.DictionaryArray.from_arrays(indices,
                                                           pa.array(dictionary, pa.binary()))
        else:
            columns[name] = pa.array([None if null else value
                                      for null, value in zip(nulls, column)],
                                     pa.large_binary() if k == 7 else pa.binary())
    pq.write_table(pa.table(columns), path, row_group_size=300)
    return str(path)


def per_value_ids(preprocessing, strings):
    """The ids of strings [n, 26] encoded one value at a time, as from lines."""
    raw = {"categorical": tf.constant(strings), "derived": tf.zeros([len(strings), 0], tf.int64),
           "dense": tf.zeros([len(strings), 13]), "dense_present": tf.zeros([len(strings), 13],
                                                                             bool)}
    return preprocessing.features(raw)["categorical"].numpy()


def read_ids(source):
    (features, _), = source.train_batches(ROWS).as_numpy_iterator()
    return features["categorical"]


def vocabulary_of(table):
    """A Vocabulary keeping every value of `table` seen twice or more."""
    categorical = {}
    for k, name in enumerate(CATEGORICAL_NAMES):
        counted = collections.Counter(value for value in table[:, k] if value)
        kept = sorted((value for value, count in counted.items() if count >= 2),
                      key=lambda value: (-counted[value], value))
        categorical[name] = [(value.decode("utf-8", "replace"), counted[value])
                             for value in kept]
    return Vocabulary(format_name="criteo", min_count=2, rows=ROWS, categorical=categorical,
                      dense_ranges={name: (0.0, 1.0) for name in DENSE_NAMES})


@pytest.mark.parametrize("encoding", ["hash", "vocabulary"])
def test_parquet_ids_are_those_of_every_value_encoded_alone(tmp_path, encoding):
    rng = np.random.default_rng(0)
    table = values(rng)
    path = parquet_file(tmp_path / "rows.parquet", table, rng)
    options = ({"hash_buckets": [97 + k for k in range(26)]} if encoding == "hash" else
               {"vocabulary": vocabulary_of(table)})
    source = CriteoParquet(path, test_fraction=None, chunk_rows=128, **options)
    got = read_ids(source)
    want = per_value_ids(source.preprocessing, table)
    np.testing.assert_array_equal(got, want)
    assert len(set(table.flat)) > 200 and (want == 0).any() and len(np.unique(want)) > 100
    if encoding == "vocabulary":
        assert (want == 1).any()  # out of vocabulary


def test_text_ids_are_those_of_every_value_encoded_alone(tmp_path):
    rng = np.random.default_rng(1)
    table = values(rng)
    table[table == b"a\x00b"] = b"ab"  # no NUL, tab or line end in a line
    lines = [b"\t".join([b"%d" % (row % 2)] + [b"%d" % (row - 3)] * 13 + list(table[row]))
             for row in range(ROWS)]
    path = tmp_path / "rows.txt"
    path.write_bytes(b"\n".join(lines) + b"\n")
    for options in ({"hash_buckets": 1000}, {"vocabulary": vocabulary_of(table)}):
        source = CriteoTSV(str(path), test_fraction=None, **options)
        want = per_value_ids(source.preprocessing, table)
        np.testing.assert_array_equal(read_ids(source), want)


def test_the_parquet_vocabulary_pass_counts_every_value(tmp_path):
    rng = np.random.default_rng(2)
    table = values(rng)
    path = parquet_file(tmp_path / "rows.parquet", table, rng)
    counted = CriteoParquet.build_vocabulary(path, min_count=2, chunk_rows=128)
    want = vocabulary_of(table)
    assert counted.categorical == want.categorical
    encoder = Preprocessing(CriteoParquet.FORMAT, vocabulary=counted)
    assert encoder.schema.vocabulary_sizes[:26] == tuple(
        2 + len(want.categorical[name]) for name in CATEGORICAL_NAMES)


def test_columns_of_several_chunks_and_dictionaries_keep_every_row():
    chunked = pa.chunked_array([pa.array(["a", None, "b"]), pa.array([], pa.string()),
                                pa.array(["b", "c", ""])])
    dictionaries = pa.chunked_array([
        pa.DictionaryArray.from_arrays(pa.array([1, None, 1], pa.int8()),
                                       pa.array(["x", "y", "unused"])),
        pa.DictionaryArray.from_arrays(pa.array([1, 2, 3], pa.int8()),
                                       pa.array(["y", None, "z", "y"]))])
    integers = pa.chunked_array([pa.array([7, None]), pa.array([-7, 7, 0, None])])
    block = Categorical.of([chunked, dictionaries, integers], 6)
    want = [[b"a", b"y", b"7"], [b"", b"", b""], [b"b", b"y", b"-7"], [b"b", b"", b"7"],
            [b"c", b"z", b"0"], [b"", b"y", b""]]
    assert block.strings().tolist() == want
    encoder = HashingEncoder([1000, 1001, 1002])
    np.testing.assert_array_equal(block.ids(encoder),
                                  encoder.encode(tf.constant(want, tf.string)).numpy())
    kept = np.array([True, False, True, True, False, True])
    np.testing.assert_array_equal(block.take(kept).ids(encoder), block.ids(encoder)[kept])
    fields, values, counts = block.value_counts()
    counted = collections.Counter((int(k), row[k]) for row in want for k in range(3) if row[k])
    assert dict(zip(zip(fields.tolist(), values.to_pylist()), counts.tolist())) == counted
    assert len(fields) == len(counted)  # each column's values once
