"""Tests of the Avazu CSV reader: header-driven columns, the dropped id, hour -> hour of day and day
of week, files without `click`, line errors and skipping, split and sharding."""

import datetime

import numpy as np
import pytest
import tensorflow as tf

from tfscale.data import avazu
from tfscale.data.avazu import AvazuCSV
from tfscale.errors import UserError, user_error_from_tf

HEADER = ("id,click,hour,C1,banner_pos,site_id,site_domain,site_category,app_id,app_domain,"
          "app_category,device_id,device_ip,device_model,device_type,device_conn_type,"
          "C14,C15,C16,C17,C18,C19,C20,C21")
REST = ("1005,0,1fbe01fe,f3845767,28905ebd,ecad2386,7801e8d9,07d7df22,a99f214a,ddd2926e,"
        "44956a24,1,2,15706,320,50,1722,0,35,-1,79")


def avazu_line(click, hour, row_id="10000094181510942730", rest=REST):
    """A line with a 20-digit id (larger than int64) unless told otherwise."""
    fields = [row_id] + ([] if click is None else [str(click)]) + [hour, rest]
    return ",".join(fields)


def write(path, lines, header=HEADER):
    path.write_text("\n".join([header] + lines) + "\n")
    return str(path)


def collect(dataset):
    dense, categorical, labels = [], [], []
    for features, label in dataset:
        dense.append(features["dense"].numpy())
        categorical.append(features["categorical"].numpy())
        labels.append(label.numpy())
    return np.concatenate(dense), np.concatenate(categorical), np.concatenate(labels)


def read_all(path, **options):
    return collect(AvazuCSV(path, test_fraction=0.0, **options).train_batches(1))


def test_parses_hour_fields_and_drops_the_id(tmp_path):
    path = write(tmp_path / "train.csv", [
        avazu_line(0, "14102100"),  # Tuesday 2014-10-21, 00h
        avazu_line(1, "14102523", row_id="99999999999999999999"),  # Saturday, 23h
        avazu_line(0, "14102613"),  # Sunday, 13h
        avazu_line(1, ""),  # missing hour
    ])
    source = AvazuCSV(path, test_fraction=0.0, hash_buckets=50)
    dense, categorical, labels = collect(source.train_batches(4))
    assert dense.shape == (4, 0) and dense.dtype == np.float32
    assert labels.tolist() == [[0.0], [1.0], [0.0], [1.0]]
    names = source.schema.categorical_names
    assert names[-2:] == ("hour_of_day", "day_of_week") and len(names) == 23
    assert source.schema.vocabulary_sizes[-2:] == (25, 8)
    assert source.schema.num_dense == 0
    hour_of_day, day_of_week = categorical[:, -2], categorical[:, -1]
    assert hour_of_day.tolist() == [1, 24, 14, 0]  # hour h -> h + 1, missing -> 0
    assert day_of_week.tolist() == [2, 6, 7, 0]  # Monday = 1 .. Sunday = 7
    assert (categorical[:, :-2] >= 1).all() and (categorical[:, :-2] <= 50).all()
    assert (categorical[0, :-2] == categorical[1, :-2]).all()  # same strings, same ids


def test_day_of_week_matches_the_calendar():
    start = datetime.date(2000, 1, 1)
    dates = [start + datetime.timedelta(days=d) for d in range(0, 11000, 94)]
    parts = [tf.constant([getattr(d, part) for d in dates], tf.int64)
             for part in ("year", "month", "day")]
    computed = avazu._day_of_week(*parts).numpy()
    assert computed.tolist() == [d.isoweekday() % 7 for d in dates]


def test_columns_are_found_by_header_name(tmp_path):
    lines = [avazu_line(1, "14102100"),
             avazu_line(0, "14102205", rest=REST.replace("1005", "1002"))]
    plain = read_all(write(tmp_path / "plain.csv", lines))
    # The same data with click and hour swapped and an extra column.
    names = HEADER.split(",")
    names[1], names[2] = names[2], names[1]
    swapped = []
    for line in lines:
        fields = line.split(",")
        fields[1], fields[2] = fields[2], fields[1]
        swapped.append(",".join(fields + ["extra"]))
    moved = read_all(write(tmp_path / "moved.csv", swapped, header=",".join(names + ["extra"])))
    for a, b in zip(plain, moved):
        np.testing.assert_array_equal(a, b)


def test_test_file_without_click(tmp_path):
    train = write(tmp_path / "train.csv", [avazu_line(1, "14102100")] * 3)
    header = HEADER.replace("id,click,", "id,")
    test = write(tmp_path / "test.csv", [avazu_line(None, "14102100")] * 3, header=header)
    source = AvazuCSV(train, test)
    assert not source.test_has_labels
    _, categorical, labels = collect(source.test_batches(2))
    _, train_categorical, _ = collect(source.train_batches(3))
    assert labels.tolist() == [[0.0]] * 3
    np.testing.assert_array_equal(categorical, train_categorical)


@pytest.mark.parametrize("bad_line, problem", [
    (avazu_line(1, "14102100") + ",x", "expected 24 comma-separated fields, found 25"),
    (avazu_line("yes", "14102100"), "click must be 0 or 1, found 'yes'"),
    (avazu_line(1, "14132100"), "hour must be YYMMDDHH (like 14102100), found '14132100'"),
    (avazu_line(1, "1410210"), "hour must be YYMMDDHH (like 14102100), found '1410210'"),
    (avazu_line(1, "14102124"), "hour must be YYMMDDHH (like 14102100), found '14102124'"),
])
def test_malformed_line_names_file_and_line(tmp_path, bad_line, problem):
    lines = [avazu_line(i % 2, "14102100") for i in range(10)]
    lines[5] = bad_line  # line 7 of the file, after the header
    path = write(tmp_path / "train.csv", lines)
    source = AvazuCSV(path, test_fraction=0.0, chunk_lines=4)
    with pytest.raises(tf.errors.InvalidArgumentError) as caught:
        collect(source.train_batches(2))
    assert str(user_error_from_tf(caught.value)) == f"{path} line 7: {problem}"


def test_skip_mode_drops_and_counts_bad_lines(tmp_path):
    lines = [avazu_line(i % 2, f"141021{i:02d}") for i in range(10)]
    lines[1] = avazu_line(1, "99999999")
    lines[4] = "short,line"
    path = write(tmp_path / "train.csv", lines)
    source = AvazuCSV(path, test_fraction=0.0, on_bad_line="skip", chunk_lines=3)
    _, categorical, _ = collect(source.train_batches(1))
    assert (categorical[:, -2] - 1).tolist() == [0, 2, 3, 5, 6, 7, 8, 9]
    assert source.bad_line_count() == 2


def test_header_without_avazu_columns_is_a_user_error(tmp_path):
    path = write(tmp_path / "train.csv", ["1,2,3"], header="a,b,c")
    with pytest.raises(UserError, match="train.csv line 1: the header lacks the columns hour, C1"):
        AvazuCSV(path)
    header_only = tmp_path / "header.csv"
    header_only.write_text(HEADER + "\n")
    with pytest.raises(UserError, match="header.csv: the file has no data lines"):
        AvazuCSV(str(header_only))


def test_split_and_shards_are_disjoint_and_cover(tmp_path):
    lines = [avazu_line(i % 2, f"1410{21 + i // 24:02d}{i % 24:02d}") for i in range(96)]
    path = write(tmp_path / "train.csv", lines)
    source = AvazuCSV(path, test_fraction=0.3, chunk_lines=16)

    def hours(dataset):  # a row's (day, hour) identifies it
        categorical = collect(dataset)[1]
        return sorted(zip(categorical[:, -1].tolist(), categorical[:, -2].tolist()))

    test = hours(source.test_batches(100))
    shards = [hours(source.train_batches(1, shard_index=s, num_shards=2)) for s in range(2)]
    every_row = hours(AvazuCSV(path, path).test_batches(100))  # the file as a test split
    assert len(set(every_row)) == 96
    assert sorted(test + shards[0] + shards[1]) == every_row
    assert not set(shards[0]) & set(shards[1]) and not set(test) & set(shards[0] + shards[1])


def test_vocabulary_encoding_keeps_exact_hour_fields(tmp_path):
    lines = [avazu_line(1, "14102100"), avazu_line(0, "14102101"),
             avazu_line(1, "14102102", rest=REST.replace("1005", "1010"))]
    path = write(tmp_path / "train.csv", lines)
    vocabulary = AvazuCSV.build_vocabulary(path, min_count=2)
    assert vocabulary.categorical["C1"] == [("1005", 2)] and vocabulary.dense_ranges == {}
    source = AvazuCSV(path, path, vocabulary=vocabulary)
    assert source.schema.vocabulary_sizes[0] == 3 and source.schema.vocabulary_sizes[-2:] == (25, 8)
    _, categorical, _ = collect(source.test_batches(3))
    assert categorical[:, 0].tolist() == [2, 2, 1]  # 1010 is under min_count: out of vocabulary
    assert categorical[:, -2].tolist() == [1, 2, 3]
