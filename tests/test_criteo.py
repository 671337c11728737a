"""Tests of the Criteo TSV reader: exact parsing, hashing, gzip, unlabelled files, line errors and
skipping, path checks, the train/test split, sharding, shuffling and resuming."""

import gzip
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import graph_pb2
from tensorflow.python.framework import op_def_registry

from tfscale.data.criteo import CriteoTSV
from tfscale.errors import UserError, user_error_from_tf


def criteo_line(label, ints, cats):
    """A Criteo line: label ("" for none), 13 integers (None = missing), 26 strings."""
    fields = [] if label == "" else [str(label)]
    fields += ["" if v is None else str(v) for v in ints]
    fields += list(cats)
    return "\t".join(fields)


def numbered_lines(count, label=True):
    """Lines whose I1 is the row index (so rows can be told apart) and C1 a repeated value."""
    rng = np.random.default_rng(count)
    return [criteo_line(i % 2 if label else "", [i] + [None] * 12,
                        [f"{rng.integers(5):08x}"] + [""] * 25) for i in range(count)]


def write(path, lines, opener=open):
    with opener(path, "wt") as stream:
        stream.write("\n".join(lines) + "\n")
    return str(path)


def collect(dataset):
    """(dense, categorical, labels) numpy arrays of a whole dataset."""
    dense, categorical, labels = [], [], []
    for features, label in dataset:
        dense.append(features["dense"].numpy())
        categorical.append(features["categorical"].numpy())
        labels.append(label.numpy())
    if not labels:
        return np.zeros([0, 13]), np.zeros([0, 26], np.int64), np.zeros([0, 1])
    return np.concatenate(dense), np.concatenate(categorical), np.concatenate(labels)


def row_ids(dense):
    """The I1 row index of each row (I1 is stored as log1p)."""
    return np.rint(np.expm1(dense[:, 0].astype(np.float64))).astype(int).tolist()


def data_error(dataset):
    """The UserError a data check raises while reading `dataset`."""
    with pytest.raises(tf.errors.InvalidArgumentError) as caught:
        collect(dataset)
    error = user_error_from_tf(caught.value)
    assert error is not None, caught.value
    return str(error)


HAND_LINES = [
    criteo_line(1, [0, -2, 5, None, 100, 1, 2, 3, 4, 5, 6, 7, 8],
                ["68fd1e64", "80e26c9b"] + [""] * 23 + ["0b153874"]),
    criteo_line(0, [None] * 13, ["68fd1e64", ""] + ["e5ba7672"] * 24),
]


def test_parses_labels_integers_and_missing_values(tmp_path):
    path = write(tmp_path / "train.txt", HAND_LINES)
    source = CriteoTSV(path, test_fraction=0.0, hash_buckets=1000)
    dense, categorical, labels = collect(source.train_batches(2))
    assert labels.tolist() == [[1.0], [0.0]]
    expected = np.array([0, -np.log1p(2), np.log1p(5), 0, np.log1p(100)] + list(
        np.log1p([1, 2, 3, 4, 5, 6, 7, 8])), np.float32)
    np.testing.assert_allclose(dense[0], expected, rtol=1e-6)
    assert dense[1].tolist() == [0.0] * 13  # missing integers -> 0
    assert dense.dtype == np.float32 and categorical.dtype == np.int64
    assert categorical[0, 2:25].tolist() == [0] * 23  # missing categorical -> row 0
    assert categorical[1, 1] == 0
    assert categorical[0, 0] == categorical[1, 0] > 0  # same value, same id
    assert source.schema.num_dense == 13 and source.schema.num_categorical == 26
    assert source.schema.vocabulary_sizes == (1001,) * 26


def test_hash_ids_within_buckets_and_stable(tmp_path):
    path = write(tmp_path / "train.txt", numbered_lines(50) + HAND_LINES)
    buckets = [3 + i for i in range(26)]
    first = collect(CriteoTSV(path, test_fraction=0.0, hash_buckets=buckets).train_batches(4))
    again = collect(CriteoTSV(path, test_fraction=0.0, hash_buckets=buckets).train_batches(4))
    categorical = first[1]
    sizes = np.array(buckets) + 1
    assert (categorical >= 0).all() and (categorical < sizes).all()
    assert (categorical[:, 1:] != 0).any()
    np.testing.assert_array_equal(categorical, again[1])
    # One value -> one id per field, wherever it appears.
    hashed = tf.strings.to_hash_bucket_fast("e5ba7672", (1 << 63) - 1).numpy()
    assert categorical[-1, 2:].tolist() == (hashed % np.array(buckets[2:]) + 1).tolist()


def test_gzip_reads_the_same_as_plain(tmp_path):
    lines = numbered_lines(30) + HAND_LINES
    plain = CriteoTSV(write(tmp_path / "a.txt", lines), test_fraction=0.2)
    gzipped = CriteoTSV(write(tmp_path / "a.txt.gz", lines, gzip.open), test_fraction=0.2)
    for left, right in [(plain.train_batches(4), gzipped.train_batches(4)),
                        (plain.test_batches(4), gzipped.test_batches(4))]:
        for a, b in zip(collect(left), collect(right)):
            np.testing.assert_array_equal(a, b)


def test_batches_come_without_tf_data_autotuning(tmp_path):
    """Its thread makes deleting an iterator wait (tfscale.data.pipeline)."""
    source = CriteoTSV(write(tmp_path / "a.txt", numbered_lines(30)), test_fraction=0.2)
    assert source.train_batches(4).options().autotune.enabled is False
    assert source.test_batches(4).options().autotune.enabled is False


def test_test_file_without_labels(tmp_path):
    train = write(tmp_path / "train.txt", numbered_lines(8))
    test = write(tmp_path / "test.txt", numbered_lines(8, label=False))
    source = CriteoTSV(train, test, hash_buckets=100)
    assert not source.test_has_labels
    dense, categorical, labels = collect(source.test_batches(3))
    assert row_ids(dense) == list(range(8)) and labels.tolist() == [[0.0]] * 8
    train_dense, train_categorical, _ = collect(source.train_batches(8))
    np.testing.assert_array_equal(categorical, train_categorical)
    np.testing.assert_array_equal(dense, train_dense)


def test_training_file_without_labels_is_a_user_error(tmp_path):
    test = write(tmp_path / "test.txt", numbered_lines(4, label=False))
    with pytest.raises(UserError, match="test.txt: training files need the 'label' column"):
        CriteoTSV(test)


@pytest.mark.parametrize("bad_line, problem", [
    ("1", "expected 40 tab-separated fields, found 1"),  # a short line needs a feature
    (criteo_line(1, [1] * 13, ["a"] * 26) + "\tx", "expected 40 tab-separated fields, found 41"),
    (criteo_line(1, [1, 2, 3, 4, "x7", 6, 7, 8, 9, 10, 11, 12, 13], ["a"] * 26),
     "I5 must be an integer, found 'x7'"),
    (criteo_line(1, [1] * 12 + ["2.5"], ["a"] * 26), "I13 must be an integer, found '2.5'"),
    (criteo_line(2, [1] * 13, ["a"] * 26), "label must be 0 or 1, found '2'"),
    (criteo_line(1, ["99999999999999999999999"] + [1] * 12, ["a"] * 26),
     "I1 must be an integer in int64's range (-9223372036854775808 to 9223372036854775807), "
     "found '99999999999999999999999'"),
    (criteo_line(1, [1] * 12 + ["-9223372036854775809"], ["a"] * 26),
     "I13 must be an integer in int64's range (-9223372036854775808 to 9223372036854775807), "
     "found '-9223372036854775809'"),
    ("", "the line is empty"),
])
def test_malformed_line_names_file_and_line(tmp_path, bad_line, problem):
    lines = numbered_lines(20)
    lines[16] = bad_line
    path = write(tmp_path / "train.txt", lines)
    source = CriteoTSV(path, tmp_path / "train.txt", chunk_lines=8)
    assert data_error(source.train_batches(4)) == f"{path} line 17: {problem}"


def test_integers_at_int64s_limits_are_read(tmp_path):
    """The ends of int64's range (and leading zeros) are integers; one past them is not."""
    edges = ["9223372036854775807", "-9223372036854775808", "+0009223372036854775807", "-0"]
    path = write(tmp_path / "train.txt", [criteo_line(1, edges + [1] * 9, ["a"] * 26)])
    dense, _, _ = collect(CriteoTSV(path, test_fraction=0.0).train_batches(1))
    expected = np.float32(np.log1p(2.0**63))
    np.testing.assert_allclose(dense[0, :4], [expected, -expected, expected, 0.0], rtol=1e-6)


@pytest.mark.parametrize("bad_line", [
    criteo_line(1, ["9223372036854775808"] + [1] * 12, ["a"] * 26), ""])
def test_skip_mode_drops_and_counts_integers_beyond_int64_and_empty_lines(tmp_path, bad_line):
    lines = numbered_lines(10)
    lines[4] = bad_line
    path = write(tmp_path / "train.txt", lines)
    source = CriteoTSV(path, test_fraction=0.0, on_bad_line="skip", chunk_lines=4)
    dense, _, _ = collect(source.train_batches(1))
    assert row_ids(dense) == [0, 1, 2, 3, 5, 6, 7, 8, 9]
    assert source.bad_line_count() == 1


def test_empty_line_of_a_file_without_labels_is_refused(tmp_path):
    """Without a label column an empty line would otherwise read as a row of missing values."""
    train = write(tmp_path / "train.txt", numbered_lines(8))
    lines = numbered_lines(8, label=False)
    lines[5] = ""
    test = write(tmp_path / "test.txt", lines)
    source = CriteoTSV(train, test, hash_buckets=100)
    assert data_error(source.test_batches(3)) == f"{test} line 6: the line is empty"


def test_first_bad_line_is_reported(tmp_path):
    lines = numbered_lines(30)
    lines[9] = lines[9] + "\tx"
    lines[3] = lines[3].replace("\t", "\tfoo\t", 1)
    path = write(tmp_path / "train.txt", lines)
    source = CriteoTSV(path, path, chunk_lines=16)
    assert data_error(source.test_batches(30)).startswith(f"{path} line 4: ")


def test_skip_mode_drops_and_counts_bad_lines(tmp_path):
    lines = numbered_lines(12)
    lines[2] = "garbage"
    lines[7] = criteo_line(1, ["abc"] + [1] * 12, ["a"] * 26)
    path = write(tmp_path / "train.txt", lines)
    source = CriteoTSV(path, test_fraction=0.0, on_bad_line="skip", chunk_lines=4)
    assert source.bad_line_count() == 0
    dense, _, _ = collect(source.train_batches(1))
    assert row_ids(dense) == [0, 1, 3, 4, 5, 6, 8, 9, 10, 11]
    assert source.bad_line_count() == 2
    collect(source.train_batches(1, epoch=1))
    assert source.bad_line_count() == 2  # each bad line counts once, however many epochs


def test_missing_empty_and_unmatched_paths_are_user_errors(tmp_path):
    with pytest.raises(UserError, match="nope.txt: no such file"):
        CriteoTSV(tmp_path / "nope.txt")
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    with pytest.raises(UserError, match="empty.txt: the file is empty"):
        CriteoTSV(str(empty))
    with pytest.raises(UserError, match=r"day_\*.gz: no file matches"):
        CriteoTSV(str(tmp_path / "day_*.gz"))
    train = write(tmp_path / "train.txt", numbered_lines(3))
    with pytest.raises(UserError, match="missing_test.txt: no such file"):
        CriteoTSV(train, str(tmp_path / "missing_test.txt"))


def test_glob_reads_every_file(tmp_path):
    write(tmp_path / "part-0.txt", numbered_lines(10)[:5])
    write(tmp_path / "part-1.txt", numbered_lines(10)[5:])
    source = CriteoTSV(str(tmp_path / "part-*.txt"), test_fraction=0.0)
    assert row_ids(collect(source.train_batches(1))[0]) == list(range(10))


def test_split_is_disjoint_and_covers_every_line(tmp_path):
    path = write(tmp_path / "train.txt", numbered_lines(400))
    source = CriteoTSV(path, test_fraction=0.25, chunk_lines=64)
    train = row_ids(collect(source.train_batches(1))[0])
    test = row_ids(collect(source.test_batches(7))[0])
    assert not set(train) & set(test)
    assert sorted(train + test) == list(range(400))
    assert 60 < len(test) < 140
    again = CriteoTSV(path, test_fraction=0.25, chunk_lines=16)
    assert row_ids(collect(again.test_batches(7))[0]) == test  # fixed by line number


def test_shards_are_disjoint_and_cover_the_split(tmp_path):
    path = write(tmp_path / "train.txt", numbered_lines(90))
    source = CriteoTSV(path, test_fraction=0.2, chunk_lines=16)
    whole = row_ids(collect(source.train_batches(1))[0])
    shards = [row_ids(collect(source.train_batches(1, shard_index=s, num_shards=3))[0])
              for s in range(3)]
    assert sorted(sum(shards, [])) == sorted(whole)
    assert all(not set(a) & set(b) for i, a in enumerate(shards) for b in shards[i + 1:])
    test_shards = [row_ids(collect(source.test_batches(5, shard_index=s, num_shards=3))[0])
                   for s in range(3)]
    assert sorted(sum(test_shards, [])) == sorted(row_ids(collect(source.test_batches(5))[0]))


def test_shuffle_is_deterministic_per_seed_and_epoch(tmp_path):
    path = write(tmp_path / "train.txt", numbered_lines(300))

    def order(seed, epoch):
        source = CriteoTSV(path, test_fraction=0.1, shuffle_buffer=100, seed=seed, chunk_lines=32)
        return row_ids(collect(source.train_batches(10, epoch=epoch))[0])

    test_rows = row_ids(collect(CriteoTSV(path, test_fraction=0.1).test_batches(300))[0])
    every_row = sorted(set(range(300)) - set(test_rows))
    first = order(seed=1, epoch=0)
    assert first == order(seed=1, epoch=0)
    assert first != sorted(first) and len(set(first)) == len(first) == len(every_row) // 10 * 10
    assert set(first) <= set(every_row)
    assert order(seed=1, epoch=1) != first
    assert order(seed=2, epoch=0) != first


def test_skip_batches_equals_dropping_batches(tmp_path):
    path = write(tmp_path / "train.txt", numbered_lines(100))
    source = CriteoTSV(path, test_fraction=0.1, shuffle_buffer=40, seed=3, chunk_lines=16)
    full = [row_ids(f["dense"].numpy()) for f, _ in source.train_batches(8, epoch=2)]
    resumed = [row_ids(f["dense"].numpy())
               for f, _ in source.train_batches(8, epoch=2, skip_batches=4)]
    assert resumed == full[4:] and len(full) == len(resumed) + 4
    assert all(len(batch) == 8 for batch in full)  # full batches only


def test_pipeline_stays_parallel_under_op_determinism(tmp_path):
    """The launcher enables op determinism, under which tf.data turns a map holding any stateful
    op into a serial Map: every map after the blocks of lines (the features' transform, the
    window shuffle) must be a ParallelMap of stateless ops; and a bad line is still refused by
    name under it."""
    lines = numbered_lines(40)
    lines[30] = "bad"
    path = write(tmp_path / "train.txt", lines)
    vocabulary = str(tmp_path / "vocab.json")
    CriteoTSV.build_vocabulary(path, on_bad_line="skip").save(vocabulary)
    source = CriteoTSV(path, vocabulary=vocabulary, dense_transform="minmax", shuffle_buffer=16,
                       test_fraction=0.0, chunk_lines=8)
    graph = graph_pb2.GraphDef.FromString(
        source.train_batches(4)._as_serialized_graph().numpy())
    functions = {function.signature.name: function for function in graph.library.function}
    parallel = [node.attr["f"].func.name for node in graph.node
                if node.op == "ParallelMapDatasetV2"]
    assert len(parallel) >= 2, parallel  # the features' transform, the window shuffle
    for name in parallel:
        stateful = [node.op for node in functions[name].node_def
                    if op_def_registry.get(node.op) is not None
                    and op_def_registry.get(node.op).is_stateful]
        assert not stateful, (name, stateful)
    script = f"""if True:
        import tensorflow as tf
        tf.config.experimental.enable_op_determinism()
        from tfscale.data.criteo import CriteoTSV
        source = CriteoTSV({path!r}, vocabulary={vocabulary!r}, dense_transform="minmax",
                           shuffle_buffer=16, test_fraction=0.0, chunk_lines=8)
        try:
            for batch in source.train_batches(4):
                pass
        except tf.errors.InvalidArgumentError as error:
            print(error.message)
    """
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "-c", script], cwd=repo, capture_output=True,
                          text=True, timeout=120)
    assert f"{path} line 31: expected 40 tab-separated fields, found 1" in done.stdout, done.stderr


@pytest.mark.parametrize("on_bad_line", ["error", "skip"])
def test_steps_per_epoch_counts_the_full_batches_each_shard_reads(tmp_path, on_bad_line):
    lines = numbered_lines(103)
    if on_bad_line == "skip":
        lines[10] = lines[11] = "garbage"
    path = write(tmp_path / "train.txt", lines)
    source = CriteoTSV(path, test_fraction=0.2, on_bad_line=on_bad_line, chunk_lines=8)
    for num_shards in (1, 3):
        batches_per_shard = [len(collect(source.train_batches(
            4, shard_index=s, num_shards=num_shards))[0]) // 4 for s in range(num_shards)]
        assert source.train_steps_per_epoch(4, num_shards) == min(batches_per_shard)
