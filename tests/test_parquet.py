"""Tests of the Parquet readers: rows written by pyarrow and by pandas read as the same lines of
text read (same features, labels, split and vocabulary); nulls are missing values; a column of a
type its field does not take is refused naming file and column; a bad value is refused naming
file, row, row group and column, or skipped and counted; the column mapping; the split over
ranks by row ranges; shuffling, resuming and the test split's lines; the vocabulary pass over
rows, in one process and over 2 ranks."""

import os

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tensorflow as tf

from benchmarks.vocab_pass import make_file
from tests import grouped_launches
from tests.test_avazu import avazu_line
from tests.test_avazu import write as write_avazu
from tests.test_criteo import HAND_LINES, collect, criteo_line, data_error, numbered_lines, write
from tfscale.data import PARQUET_FORMATS, AvazuCSV, AvazuParquet, CriteoParquet, CriteoTSV
from tfscale.data.criteo import CATEGORICAL_NAMES, DENSE_NAMES
from tfscale.data.parquet import is_parquet
from tfscale.data.text_lines import INT64_RANGE
from tfscale.data.vocabulary import Vocabulary
from tfscale.errors import UserError

NAMES = ("label",) + DENSE_NAMES + CATEGORICAL_NAMES


def criteo_table(lines):
    """The Arrow table of labelled Criteo lines: int64 label and integers (null = empty),
    string categorical fields (null = empty)."""
    rows = [line.split("\t") + [""] * (40 - len(line.split("\t"))) for line in lines]
    columns = {"label": pa.array([int(row[0]) for row in rows], pa.int64())}
    for i, name in enumerate(DENSE_NAMES, 1):
        columns[name] = pa.array([int(row[i]) if row[i] else None for row in rows], pa.int64())
    for i, name in enumerate(CATEGORICAL_NAMES, 14):
        columns[name] = pa.array([row[i] or None for row in rows], pa.string())
    return pa.table(columns)


def write_parquet(path, table, row_group_size=None):
    pq.write_table(table, path, row_group_size=row_group_size)
    return str(path)


def assert_same_batches(left, right):
    """Two datasets of (features, labels) hold the same rows in the same order."""
    (dense_a, categorical_a, labels_a), (dense_b, categorical_b, labels_b) = (
        collect(left), collect(right))
    np.testing.assert_array_equal(categorical_a, categorical_b)
    np.testing.assert_allclose(dense_a, dense_b, rtol=1e-6)  # log1p's last bit may differ
    np.testing.assert_array_equal(labels_a, labels_b)
    assert len(labels_a) > 0


def lines_and_parquet(tmp_path, lines, row_group_size=None):
    text = write(tmp_path / "train.txt", lines)
    return text, write_parquet(tmp_path / "train.parquet", criteo_table(lines), row_group_size)


@pytest.mark.parametrize("row_group_size", [None, 7])
def test_rows_written_by_pyarrow_read_as_their_lines(tmp_path, row_group_size):
    """Same ids, integers, labels and hashed train/test split (by row number as by line
    number), in one row group or many."""
    lines = numbered_lines(120) + HAND_LINES
    text, parquet = lines_and_parquet(tmp_path, lines, row_group_size)
    assert is_parquet(parquet) and not is_parquet(text)
    tsv = CriteoTSV(text, test_fraction=0.25, hash_buckets=50)
    rows = CriteoParquet(parquet, test_fraction=0.25, hash_buckets=50, chunk_rows=16)
    assert_same_batches(tsv.train_batches(5), rows.train_batches(5))
    assert_same_batches(tsv.test_batches(7), rows.test_batches(7))
    assert rows.train_steps_per_epoch(5) == tsv.train_steps_per_epoch(5)
    assert rows.test_lines(1000) == tsv.test_lines(1000)


def test_a_vocabulary_counts_rows_as_their_lines(tmp_path):
    lines = numbered_lines(200) + HAND_LINES
    text, parquet = lines_and_parquet(tmp_path, lines, row_group_size=64)
    from_lines = CriteoTSV.build_vocabulary(text, test_fraction=0.2)
    from_rows = CriteoParquet.build_vocabulary(parquet, test_fraction=0.2, chunk_rows=50)
    assert (from_rows.categorical, from_rows.dense_ranges, from_rows.rows, from_rows.distinct) \
        == (from_lines.categorical, from_lines.dense_ranges, from_lines.rows,
            from_lines.distinct)
    tsv = CriteoTSV(text, vocabulary=from_lines, dense_transform="minmax")
    rows = CriteoParquet(parquet, vocabulary=from_rows, dense_transform="minmax")
    assert_same_batches(tsv.train_batches(4), rows.train_batches(4))


def test_a_pandas_frame_with_gaps_reads_as_lines_with_empty_fields(tmp_path):
    """pandas writes an integer column with gaps as float64 with NaN, and None strings as
    nulls: both are missing values. Its index column is not read."""
    lines = numbered_lines(40) + HAND_LINES
    frame = criteo_table(lines).to_pandas()  # integers with nulls -> float64 with NaN
    assert frame["I2"].dtype == np.float64 and frame["I2"].isna().any()
    path = str(tmp_path / "frame.parquet")
    frame.to_parquet(path)  # with the index, as pandas writes it by default
    text = write(tmp_path / "train.txt", lines)
    assert_same_batches(CriteoTSV(text, test_fraction=0.0).train_batches(3),
                        CriteoParquet(path, test_fraction=0.0).train_batches(3))


def test_nulls_and_empty_strings_are_missing_values(tmp_path):
    table = criteo_table(HAND_LINES)
    assert table.column("I4").null_count == 2 and table.column("C3").null_count == 1
    strings = table.set_column(NAMES.index("C3"), "C3", pa.array(["", "e5ba7672"]))
    integers_as_text = table.set_column(NAMES.index("I1"), "I1", pa.array(["0", ""]))
    source = CriteoParquet(write_parquet(tmp_path / "a.parquet", table), test_fraction=0.0)
    dense, categorical, _ = collect(source.train_batches(2))
    assert dense[1].tolist() == [0.0] * 13 and categorical[0, 2] == categorical[1, 1] == 0
    for other in (strings, integers_as_text):
        path = write_parquet(tmp_path / "b.parquet", other)
        assert_same_batches(source.train_batches(2),
                            CriteoParquet(path, test_fraction=0.0).train_batches(2))


def test_other_column_types_its_fields_take(tmp_path):
    """Labels as booleans, integers of other widths and as text, categorical values as
    integers (read as their decimal text), binary or dictionary-encoded."""
    lines = [criteo_line(i % 2, [i, -i] + [None] * 11, [str(100 + i), f"v{i}"] + [""] * 24)
             for i in range(12)]
    table = criteo_table(lines)
    other = (table.set_column(0, "label", pa.array([bool(i % 2) for i in range(12)]))
             .set_column(1, "I1", pa.array(range(12), pa.uint8()))
             .set_column(2, "I2", pa.array([str(-i) for i in range(12)]))
             .set_column(14, "C1", pa.array([100 + i for i in range(12)], pa.int32()))
             .set_column(15, "C2", pa.array([f"v{i}" for i in range(12)]).dictionary_encode()))
    other = other.set_column(16, "C3", other.column("C3").cast(pa.binary()))
    assert_same_batches(
        CriteoParquet(write_parquet(tmp_path / "a.parquet", table), test_fraction=0.0)
        .train_batches(4),
        CriteoParquet(write_parquet(tmp_path / "b.parquet", other), test_fraction=0.0)
        .train_batches(4))


@pytest.mark.parametrize("column, values, problem", [
    ("I3", pa.array([1.0, 2.5] * 6), "column 'I3' must be an integer, found 2.5"),
    ("I1", pa.array([1.0, 1e30] * 6),
     f"column 'I1' must be an integer in int64's range ({INT64_RANGE}), found 1e+30"),
    ("I2", pa.array([1, 2**64 - 1] * 6, pa.uint64()),
     f"column 'I2' must be an integer in int64's range ({INT64_RANGE}), found "
     "18446744073709551615"),
    ("I4", pa.array(["7", "99999999999999999999999"] * 6),
     f"column 'I4' must be an integer in int64's range ({INT64_RANGE}), found "
     "'99999999999999999999999'"),
    ("I5", pa.array(["7", "abc"] * 6), "column 'I5' must be an integer, found 'abc'"),
    ("label", pa.array([0, 2] * 6), "column 'label' must be 0 or 1, found 2"),
    ("label", pa.array([0, None] * 6), "column 'label' must be 0 or 1, found null"),
])
def test_a_bad_value_names_file_row_group_row_and_column_or_is_skipped(tmp_path, column,
                                                                        values, problem):
    table = criteo_table(numbered_lines(12))
    table = table.set_column(NAMES.index(column), column, values)
    path = write_parquet(tmp_path / "bad.parquet", table, row_group_size=5)
    source = CriteoParquet(path, test_fraction=0.0, chunk_rows=2)
    assert data_error(source.train_batches(1)) == (
        f"{path} row 2 (row group 0): {problem}; fix the file, or skip such rows with "
        "`on_bad_line='skip'`")
    skipping = CriteoParquet(path, test_fraction=0.0, on_bad_line="skip", chunk_rows=2)
    dense, _, _ = collect(skipping.train_batches(1))
    assert len(dense) == 6 and skipping.bad_line_count() == 6
    collect(skipping.train_batches(1, epoch=1))
    assert skipping.bad_line_count() == 6  # each bad row counts once, however many epochs
    assert skipping.train_steps_per_epoch(2) == 3


def test_the_first_bad_row_of_a_later_row_group_is_named(tmp_path):
    table = criteo_table(numbered_lines(30))
    table = table.set_column(NAMES.index("I7"), "I7", pa.array([1.0] * 23 + [0.5] * 7))
    path = write_parquet(tmp_path / "bad.parquet", table, row_group_size=10)
    assert data_error(CriteoParquet(path, path).test_batches(4)) == (
        f"{path} row 24 (row group 2): column 'I7' must be an integer, found 0.5; fix the file, "
        "or skip such rows with `on_bad_line='skip'`")


def test_the_vocabulary_pass_refuses_a_bad_row_by_name_or_skips_and_counts_it(tmp_path):
    table = criteo_table(numbered_lines(30))
    table = table.set_column(NAMES.index("label"), "label", pa.array([0] * 23 + [2] * 7))
    path = write_parquet(tmp_path / "bad.parquet", table, row_group_size=10)
    with pytest.raises(UserError) as caught:
        CriteoParquet.build_vocabulary(path, chunk_rows=4)
    assert str(caught.value) == (
        f"{path} row 24 (row group 2): column 'label' must be 0 or 1, found 2; fix the file, "
        "or skip such rows with `on_bad_line='skip'`")
    skipped = CriteoParquet.build_vocabulary(path, on_bad_line="skip", chunk_rows=4)
    assert (skipped.rows, skipped.bad_lines_skipped) == (23, 7)


# ----------------------------------------------------------------------------- 2 ranks

RANKS_PARQUET = "{dir}/vocabulary-parquet/train.parquet"
PARQUET_RANKS = grouped_launches.job(
    "vocabulary-2-ranks-parquet", 2, "tests.multiworker.vocabulary_ranks", RANKS_PARQUET, 3, 16,
    "{dir}/vocabulary-parquet/counted")


@grouped_launches.prepare
def write_parquet_rank_input(directory):
    """20,000 generated lines (about 35K distinct values: 16 MB of counts spill) as Parquet in
    row groups of 3,000 (the ranks' halves split a group), with the lines beside them."""
    os.makedirs(directory / "vocabulary-parquet", exist_ok=True)
    text = str(directory / "vocabulary-parquet" / "train.txt")
    make_file(text, 20_000, seed=11)
    with open(text) as stream:
        lines = stream.read().splitlines()
    write_parquet(directory / "vocabulary-parquet" / "train.parquet", criteo_table(lines),
                  row_group_size=3000)


def test_two_ranks_count_a_parquet_files_vocabulary_as_one_process_its_lines(launched_jobs):
    result = launched_jobs[PARQUET_RANKS]
    assert result.returncode == 0, result.output[-3000:]
    text = str(launched_jobs.path("{dir}/vocabulary-parquet/train.txt"))
    one = CriteoTSV.build_vocabulary(text, min_count=3, memory_mb=1024)  # exact
    assert one.counting["exact"]
    for rank in (0, 1):
        path = launched_jobs.path(f"{{dir}}/vocabulary-parquet/counted.rank{rank}")
        counted = Vocabulary.load(path)
        assert counted.counting["ranks"] == 2 and not counted.counting["exact"]
        assert (counted.categorical, counted.dense_ranges, counted.rows) == (
            one.categorical, one.dense_ranges, 20_000)


@pytest.mark.parametrize("column, values, takes", [
    ("I1", pa.array([[1]] * 2, pa.list_(pa.int64())), "an integer feature's column holds"),
    ("C2", pa.array([1.5, 2.5]), "a categorical column holds"),
    ("label", pa.array(["0", "1"]), "a label column holds"),
])
def test_a_column_of_another_type_is_refused_naming_file_and_column(tmp_path, column, values,
                                                                     takes):
    table = criteo_table(HAND_LINES).set_column(NAMES.index(column), column, values)
    path = write_parquet(tmp_path / "typed.parquet", table)
    with pytest.raises(UserError) as caught:
        CriteoParquet(path)
    message = str(caught.value)
    written = pq.read_schema(path).field(column).type  # as the file holds it
    assert message.startswith(f"{path}: column {column!r} is of type {written}; {takes}")
    assert "`columns`" in message


def test_the_column_mapping_reads_columns_of_other_names(tmp_path):
    lines = numbered_lines(30)
    table = criteo_table(lines)
    renamed = table.rename_columns(["click"] + [f"int_{i}" for i in range(1, 14)]
                                   + list(CATEGORICAL_NAMES))
    mapping = {"label": "click", **{f"I{i}": f"int_{i}" for i in range(1, 14)}}
    path = write_parquet(tmp_path / "renamed.parquet", renamed)
    plain = CriteoParquet(write_parquet(tmp_path / "plain.parquet", table), test_fraction=0.2)
    mapped = CriteoParquet(path, test_fraction=0.2, columns=mapping)
    assert_same_batches(plain.train_batches(3), mapped.train_batches(3))
    assert_same_batches(plain.train_batches(3),
                        CriteoParquet.with_columns(mapping)(path, test_fraction=0.2)
                        .train_batches(3))
    assert "columns label=click, I1=int_1" in mapped.describe()
    with pytest.raises(UserError, match=r"renamed.parquet: no column 'I1', 'I2', 'I3', 'I4', "
                                        r"'I5' \(and 8 more\).*`columns=\{'I1': "):
        CriteoParquet(path)
    with pytest.raises(UserError, match="renamed.parquet: training files need the label column "
                                        r"'label'.*`columns=\{'label': 'your_label_column'\}`"):
        CriteoParquet(path, columns={k: v for k, v in mapping.items() if k != "label"})
    with pytest.raises(UserError, match="`columns` maps 'I14', not a field of criteo rows"):
        CriteoParquet(path, columns={**mapping, "I14": "x"})
    with pytest.raises(UserError, match="reads both I1 and I2 from the column 'int_1'"):
        CriteoParquet(path, columns={**mapping, "I2": "int_1"})


def test_test_files_without_labels_and_files_that_are_not_parquet(tmp_path):
    lines = numbered_lines(10)
    train = write_parquet(tmp_path / "train.parquet", criteo_table(lines))
    test = write_parquet(tmp_path / "test.parquet", criteo_table(lines).drop_columns(["label"]))
    source = CriteoParquet(train, test)
    assert not source.test_has_labels
    _, _, labels = collect(source.test_batches(4))
    assert labels.tolist() == [[0.0]] * 10
    assert source.test_lines(2) == [line.split("\t", 1)[1] for line in lines[:2]]
    with pytest.raises(UserError, match="test.parquet: training files need the label column"):
        CriteoParquet(test)
    with pytest.raises(UserError, match="lacks the label column, which .*train.parquet has"):
        CriteoParquet([train, test])
    text = write(tmp_path / "train.txt", lines)
    with pytest.raises(UserError, match="train.txt: not a readable Parquet file"):
        CriteoParquet(text)
    with pytest.raises(UserError, match=r"train.parquet: a Parquet file, not criteo text; read "
                                        r"it with tfscale.data.PARQUET_FORMATS\['criteo'\]"):
        CriteoTSV(train)


@pytest.mark.parametrize("num_shards", [2, 3])
def test_ranks_read_even_disjoint_row_ranges_covering_the_split(tmp_path, num_shards):
    """Over several files and row groups; each rank's steps are what it can read."""
    lines = numbered_lines(100)
    paths = [write_parquet(tmp_path / f"part-{i}.parquet", criteo_table(lines[i * 50:][:50]),
                           row_group_size=8) for i in range(2)]
    source = CriteoParquet(str(tmp_path / "part-*.parquet"), test_fraction=0.2, chunk_rows=5)
    whole = collect(source.train_batches(1))[0][:, 0].tolist()
    shards = [collect(source.train_batches(1, shard_index=s, num_shards=num_shards))[0][:, 0]
              .tolist() for s in range(num_shards)]
    assert sum(shards, []) == whole  # in order: rank r holds the r-th slice of the rows
    test = collect(source.test_batches(3))[0][:, 0].tolist()
    assert sum((collect(source.test_batches(3, shard_index=s, num_shards=num_shards))[0][:, 0]
                .tolist() for s in range(num_shards)), []) == test
    assert len(whole) + len(test) == 100
    sizes = [len(shard) for shard in shards]
    assert max(sizes) - min(sizes) <= 8  # the split's hash aside, even to a row
    assert source.train_steps_per_epoch(2, num_shards) == min(sizes) // 2
    assert len(paths) == 2


def test_shuffle_is_deterministic_per_seed_and_epoch_and_resumes(tmp_path):
    path = write_parquet(tmp_path / "train.parquet", criteo_table(numbered_lines(200)),
                         row_group_size=32)

    def order(seed, epoch, skip_batches=0):
        source = CriteoParquet(path, test_fraction=0.1, shuffle_buffer=64, seed=seed)
        return [collect([batch])[0][:, 0].tolist() for batch in source.train_batches(
            10, epoch=epoch, skip_batches=skip_batches)]

    first = order(1, 0)
    assert first == order(1, 0) and order(1, 0, skip_batches=3) == first[3:]
    rows = sum(first, [])
    assert rows != sorted(rows) and len(set(rows)) == len(rows)
    assert order(1, 1) != first and order(2, 0) != first


def test_avazu_rows_with_an_integer_hour_read_as_their_lines(tmp_path):
    """Avazu's hour as an integer becomes its text, then hour of day and day of week; a bad
    hour is a bad row; `id` is not read."""
    lines = [avazu_line(i % 2, f"1410{21 + i // 24:02d}{i % 24:02d}") for i in range(60)]
    text = write_avazu(tmp_path / "train.csv", lines)
    frame = pd.read_csv(text, dtype=str, keep_default_na=False).drop(columns=["id"])
    frame["click"] = frame["click"].astype(int)
    frame["hour"] = frame["hour"].astype(int)
    path = str(tmp_path / "train.parquet")
    frame.to_parquet(path, index=False)
    assert_same_batches(AvazuCSV(text, test_fraction=0.0).train_batches(4),
                        AvazuParquet(path, test_fraction=0.0).train_batches(4))
    assert AvazuParquet(path).train_layout.column_names[:3] == ("click", "hour", "C1")
    frame.loc[5, "hour"] = 14103125
    frame.to_parquet(path, index=False)
    assert data_error(AvazuParquet(path, test_fraction=0.0).train_batches(4)) == (
        f"{path} row 6 (row group 0): hour must be YYMMDDHH (like 14102100), found '14103125'; "
        "fix the file, or skip such rows with `on_bad_line='skip'`")
    skipping = AvazuParquet(path, test_fraction=0.0, on_bad_line="skip")
    assert len(collect(skipping.train_batches(1))[2]) == 59 and skipping.bad_line_count() == 1


def test_every_text_format_has_a_parquet_reader_of_its_format():
    from tfscale.data import FILE_FORMATS

    assert set(PARQUET_FORMATS) == set(FILE_FORMATS)
    assert all(PARQUET_FORMATS[name].FORMAT is FILE_FORMATS[name].FORMAT for name in FILE_FORMATS)


@pytest.mark.parametrize("data", ["criteo", "avazu"])
def test_the_test_rows_as_lines_score_as_the_rows(tmp_path, data):
    """What a run records and serves: its test rows written as lines of `train_layout`
    (tfscale.serving.export's score_lines parses them) get the scores of the rows themselves."""
    import models
    from tfscale.serving.export import RawInputs, RawScorer

    if data == "criteo":
        path = write_parquet(tmp_path / "rows.parquet", criteo_table(
            numbered_lines(60) + HAND_LINES))
    else:
        path = str(tmp_path / "rows.parquet")
        pd.DataFrame({"click": [i % 2 for i in range(60)],
                      "hour": [14102100 + i % 24 for i in range(60)],
                      **{name: [f"{name}-{i % 7}" for i in range(60)]
                         for name in AvazuCSV.FORMAT.categorical_names}}).to_parquet(path)
    source = PARQUET_FORMATS[data](path, test_fraction=0.3, hash_buckets=40)
    model = models.build_model("deepfm", source.schema, embedding_dim=4, hidden_units=[8])
    features, _ = next(iter(source.test_batches(1000)))
    lines = source.test_lines(1000)
    assert len(lines) == features["dense"].shape[0] > 5
    scorer = RawScorer(model, source.preprocessing, RawInputs(source.FORMAT, source.train_layout))
    np.testing.assert_allclose(scorer.lines(tf.constant(lines)).numpy(),
                               np.reshape(model(features, training=False), [-1]), atol=1e-6)
