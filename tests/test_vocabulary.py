"""Tests of vocabularies: one-pass counting with min_count, lookup ids (missing, OOV, values),
min-max scaling, save/load and its errors, the build_vocab command line, the automatic
vocabulary's train/test split and what invalidates its cache."""

import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from tests.test_avazu import HEADER, avazu_line
from tests.test_criteo import collect, criteo_line, write
from tfscale.data.avazu import AvazuCSV
from tfscale.data.criteo import CATEGORICAL_NAMES as CATEGORICAL, CriteoTSV
from tfscale.data.text_lines import resolve_paths
from tfscale.data.vocabulary import Vocabulary
from tfscale.errors import UserError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EMPTY_CATS = [""] * 24


def vocabulary_lines():
    """C1: 'aa' x3, 'bb' x2, 'cc' x1; C2: 'zz' x2 and missing; I1 from -3 to 9, I2 never set."""
    rows = [("aa", "zz", 1), ("aa", "", -3), ("bb", "zz", 9), ("cc", "", None), ("bb", "", 4),
            ("aa", "", 0)]
    return [criteo_line(i % 2, [i1] + [None] * 12, [c1, c2] + EMPTY_CATS)
            for i, (c1, c2, i1) in enumerate(rows)]


@pytest.fixture
def train_file(tmp_path):
    return write(tmp_path / "train.txt", vocabulary_lines())


def test_build_counts_values_over_min_count(train_file):
    vocabulary = CriteoTSV.build_vocabulary(train_file, min_count=2)
    assert vocabulary.rows == 6 and vocabulary.format_name == "criteo"
    assert vocabulary.categorical["C1"] == [("aa", 3), ("bb", 2)]  # 'cc' is under min_count
    assert vocabulary.categorical["C2"] == [("zz", 2)]
    assert vocabulary.categorical["C3"] == []
    assert vocabulary.dense_ranges["I1"] == (-3.0, 9.0)
    assert vocabulary.dense_ranges["I2"] is None
    assert CriteoTSV.build_vocabulary(train_file).categorical["C1"][-1] == ("cc", 1)


def test_lookup_gives_missing_oov_and_value_rows(tmp_path, train_file):
    vocabulary = CriteoTSV.build_vocabulary(train_file, min_count=2)
    test = write(tmp_path / "test.txt", [
        criteo_line(1, [None] * 13, ["bb", "zz", "new"] + [""] * 23),
        criteo_line(0, [None] * 13, ["aa", "", ""] + [""] * 23),
        criteo_line(0, [None] * 13, ["cc", "yy", ""] + [""] * 23),
    ])
    source = CriteoTSV(train_file, test, vocabulary=vocabulary, hash_buckets=100)  # ignored
    assert source.schema.vocabulary_sizes[:3] == (4, 3, 2)
    _, categorical, _ = collect(source.test_batches(3))
    # row 0 = missing, 1 = out of vocabulary, then values by falling count.
    assert categorical[:, :3].tolist() == [[3, 2, 1], [2, 0, 0], [1, 1, 0]]


def test_min_max_scaling_uses_the_recorded_range(tmp_path, train_file):
    vocabulary = CriteoTSV.build_vocabulary(train_file)
    test = write(tmp_path / "test.txt", [
        criteo_line(1, [v, 5] + [None] * 11, ["aa"] * 26) for v in (-3, 3, 9, 21, None, -7)])
    source = CriteoTSV(train_file, test, vocabulary=vocabulary, dense_transform="minmax")
    dense, _, _ = collect(source.test_batches(6))
    np.testing.assert_allclose(dense[:, 0], [0.0, 0.5, 1.0, 1.0, 0.0, 0.0])  # clipped to [0, 1]
    assert dense[:, 1:].tolist() == [[0.0] * 12] * 6  # I2 has no range: 0


def test_min_max_needs_a_vocabulary(train_file):
    with pytest.raises(UserError, match="minmax'` needs a vocabulary"):
        CriteoTSV(train_file, dense_transform="minmax")


def test_save_load_roundtrip(tmp_path, train_file):
    built = CriteoTSV.build_vocabulary(train_file, min_count=1)
    path = str(tmp_path / "vocab" / "criteo.json")
    built.save(path)
    loaded = Vocabulary.load(path)
    assert loaded == built and loaded.path == path
    ids = [collect(CriteoTSV(train_file, train_file, vocabulary=v).test_batches(6))[1]
           for v in (built, path)]
    np.testing.assert_array_equal(ids[0], ids[1])


def test_loading_a_missing_or_corrupt_vocabulary_is_a_user_error(tmp_path, train_file):
    with pytest.raises(UserError, match="nothere.json: no such vocabulary file"):
        Vocabulary.load(str(tmp_path / "nothere.json"))
    corrupt = tmp_path / "corrupt.json"
    corrupt.write_text('{"kind": "tfscale vocabulary", "cat')
    with pytest.raises(UserError, match="corrupt.json: not a readable vocabulary file"):
        Vocabulary.load(str(corrupt))
    wrong = tmp_path / "wrong.json"
    wrong.write_text('{"kind": "tfscale vocabulary", "version": 1, "format": "criteo"}')
    with pytest.raises(UserError, match="wrong.json: not a valid vocabulary file"):
        CriteoTSV(train_file, vocabulary=str(wrong))


def test_a_vocabulary_of_another_format_is_refused(tmp_path, train_file):
    path = str(tmp_path / "criteo.json")
    CriteoTSV.build_vocabulary(train_file).save(path)
    avazu = tmp_path / "train.csv"
    avazu.write_text("hour,click,C1\n14102100,1,5\n")
    with pytest.raises(UserError, match="header lacks"):
        AvazuCSV(str(avazu), vocabulary=path)
    avazu.write_text(HEADER + "\n" + avazu_line(1, "14102100") + "\n")
    with pytest.raises(UserError, match="criteo.json: a vocabulary of criteo data, not avazu"):
        AvazuCSV(str(avazu), vocabulary=path)


def run_build_vocab(*args):
    return subprocess.run([sys.executable, "-m", "launch.build_vocab", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def test_build_vocab_command_line(tmp_path, train_file):
    output = str(tmp_path / "out" / "criteo.vocab")
    done = run_build_vocab("--format=criteo", f"--input={train_file}", "--min_count=2",
                           f"--output={output}")
    assert done.returncode == 0, done.stderr
    assert f"wrote {output}: 6 rows counted" in done.stdout
    assert Vocabulary.load(output).categorical["C1"] == [("aa", 3), ("bb", 2)]


def test_build_vocab_errors_cleanly_on_a_missing_file(tmp_path):
    missing = str(tmp_path / "missing.txt")
    done = run_build_vocab("--format=criteo", f"--input={missing}",
                           f"--output={tmp_path / 'v.json'}")
    assert done.returncode == 2
    assert f"error: {missing}: no such file" in done.stderr
    assert "Traceback" not in done.stderr
    assert not os.path.exists(tmp_path / "v.json")


def test_building_from_a_malformed_file_names_the_line(tmp_path):
    bad = write(tmp_path / "bad.txt", vocabulary_lines()[:2] + ["1\t2"] + vocabulary_lines())
    with pytest.raises(UserError) as caught:
        CriteoTSV.build_vocabulary(bad, on_short_line="error")
    assert str(caught.value) == (
        f"{bad} line 3: expected 40 tab-separated fields, found 2 (a line missing only trailing "
        "fields reads them as missing with `on_short_line='missing'`)")
    assert CriteoTSV.build_vocabulary(bad).rows == 9  # read as missing values by default
    skipping = CriteoTSV.build_vocabulary(bad, on_bad_line="skip", on_short_line="error")
    assert skipping.bad_lines_skipped == 1 and skipping.rows == 8


def _counting_cache(monkeypatch):
    """cached_vocabulary with CriteoTSV, and the list of countings it has done."""
    from tfscale.data.vocabulary_cache import cached_vocabulary

    counted = []
    build = CriteoTSV.build_vocabulary.__func__

    def counting(cls, *args, **kwargs):
        counted.append(kwargs)
        return build(cls, *args, **kwargs)

    monkeypatch.setattr(CriteoTSV, "build_vocabulary", classmethod(counting))
    return (lambda path, **settings: cached_vocabulary(
        CriteoTSV, str(path), **{"min_count": 1, "print_fn": lambda line: None, **settings})), \
        counted


def test_automatic_vocabulary_is_counted_once_reused_and_recounted_when_the_file_changes(
        tmp_path, monkeypatch):
    cached_vocabulary, counted = _counting_cache(monkeypatch)
    path = write(tmp_path / "train.txt", vocabulary_lines())
    messages = []
    first = cached_vocabulary(path, min_count=1, test_fraction=0.25, print_fn=messages.append)
    assert len(counted) == 1 and "counting the categorical values" in messages[0]
    cache_files = [p for p in os.listdir(tmp_path) if ".tfscale-vocab-" in p]
    assert len(cache_files) == 1
    # A glob over the data's directory names the data, not the cache beside it.
    assert resolve_paths(str(tmp_path / "*")) == [str(path)]
    second = cached_vocabulary(path, min_count=1, test_fraction=0.25, print_fn=messages.append)
    assert len(counted) == 1 and "the files are unchanged" in messages[-1]
    assert second.categorical == first.categorical and second.rows == first.rows
    assert first.rows < len(vocabulary_lines())  # the training lines only, not the test split
    # Another min count is another cache; a changed file is counted again.
    cached_vocabulary(path, min_count=2, test_fraction=0.25, print_fn=messages.append)
    assert len(counted) == 2
    write(tmp_path / "train.txt", vocabulary_lines() + vocabulary_lines()[:3])
    third = cached_vocabulary(path, min_count=1, test_fraction=0.25,
                              print_fn=messages.append)
    assert len(counted) == 3 and "the files changed since it was cached" in messages[-2]
    assert third.rows > first.rows


def _split_lines(count=60):
    """Lines whose C2 value is unique to each and C1 one of 7, I1 the line's index."""
    return [criteo_line(i % 2, [i] + [None] * 12, [f"v{i % 7}", f"w{i}"] + EMPTY_CATS)
            for i in range(count)]


def test_the_split_vocabulary_is_the_one_of_the_training_lines_alone(tmp_path):
    """Counting the held-out lines too, or every line, would add their values and rows."""
    from tfscale.data.text_lines import in_test_split

    lines = _split_lines()
    in_test = in_test_split(tf.constant(0, tf.int64),  # line numbers are 1-based
                            tf.range(1, len(lines) + 1, dtype=tf.int64), 0.3).numpy()
    assert 0 < in_test.sum() < len(lines)
    split = CriteoTSV.build_vocabulary([str(write(tmp_path / "all.txt", lines))], min_count=1,
                                       test_fraction=0.3)
    alone = CriteoTSV.build_vocabulary(
        [str(write(tmp_path / "train.txt", [l for l, t in zip(lines, in_test) if not t]))],
        min_count=1)
    assert split.rows == alone.rows == int((~in_test).sum())
    assert split.categorical == alone.categorical and split.distinct == alone.distinct
    assert split.dense_ranges == alone.dense_ranges


def test_the_cache_is_recounted_when_only_the_size_or_only_the_mtime_changes(tmp_path,
                                                                           monkeypatch):
    vocabulary, counted = _counting_cache(monkeypatch)
    path = write(tmp_path / "train.txt", _split_lines())
    vocabulary(path)
    assert len(counted) == 1
    status = os.stat(path)
    os.utime(path, ns=(status.st_atime_ns, status.st_mtime_ns + 10 ** 9))  # same bytes
    vocabulary(path)
    assert len(counted) == 2
    status = os.stat(path)
    write(path, _split_lines(61))  # more bytes, then the modification time put back
    os.utime(path, ns=(status.st_atime_ns, status.st_mtime_ns))
    assert os.stat(path).st_mtime_ns == status.st_mtime_ns
    assert vocabulary(path).rows == 61 and len(counted) == 3


@pytest.mark.parametrize("setting, value", [
    ("test_fraction", 0.3), ("min_count", 2), ("on_bad_line", "skip"),
    ("on_short_line", "error")])
def test_every_counting_setting_has_its_own_cache(tmp_path, monkeypatch, setting, value):
    vocabulary, counted = _counting_cache(monkeypatch)
    path = write(tmp_path / "train.txt", _split_lines())
    base = {"test_fraction": 0.1}
    vocabulary(path, **base)
    vocabulary(path, **{**base, setting: value})
    assert len(counted) == 2 and counted[1][setting] == value
    vocabulary(path, **base)  # the first is still cached
    assert len(counted) == 2


def test_fitted_hash_buckets_are_no_larger_than_the_field_needs(tmp_path):
    from tfscale.data.vocabulary_cache import fitted_hash_buckets

    vocabulary = CriteoTSV.build_vocabulary(write(tmp_path / "train.txt", vocabulary_lines()))
    buckets = fitted_hash_buckets(vocabulary, CATEGORICAL, 1000)
    assert buckets[:3] == (6, 2, 1)  # C1: 3 values, C2: 1, C3: never set (one bucket at least)
    assert max(buckets) < 1000
    assert fitted_hash_buckets(vocabulary, CATEGORICAL, 1) == (1,) * len(CATEGORICAL)
