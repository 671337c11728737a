"""Tests of the vocabulary pass (tfscale.data.vocabulary_pass, value_counts, vocabulary_ranks,
vocabulary_file): the same vocabulary as exact counting (a plain count of the lines, and the
reader's tf.data chunks) with and without a spill into the sketch, the reader's checks and line
numbers in any block, the ranks' shares, 2 ranks under horovodrun equal to one process, and the
Parquet file beside the JSON files of earlier versions."""

import collections
import json
import os
import shutil
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
import tensorflow as tf

from benchmarks.vocab_pass import make_file
from tests import grouped_launches
from tests.test_avazu import REST, avazu_line
from tests.test_avazu import write as write_avazu
from tests.test_criteo import criteo_line, write
from tfscale.data import fingerprint as fingerprint_lib
from tfscale.data import line_kernel, value_counts, vocabulary_pass
from tfscale.data.avazu import AvazuCSV
from tfscale.data.criteo import CATEGORICAL_NAMES, DENSE_NAMES, CriteoTSV
from tfscale.data.text_lines import FileSet, LineParser, LineSelection, parsed_chunks
from tfscale.data.value_counts import ValueCounts
from tfscale.data.vocabulary import Vocabulary, count_vocabulary
from tfscale.errors import UserError

HERE = os.path.dirname(os.path.abspath(__file__))
LINES = 6000


@pytest.fixture(scope="module")
def criteo_file(tmp_path_factory):
    """6,000 generated Criteo lines, long-tailed (about 14K distinct values)."""
    path = str(tmp_path_factory.mktemp("vocab") / "train.txt")
    make_file(path, LINES, seed=3)
    return path


def counted_by_hand(path, min_count):
    """The vocabulary by a plain count of the file's fields: {field: [(value, count)]} by
    falling count then value, and (min, max) per integer field, as float32 (the reader's)."""
    counts = [collections.Counter() for _ in CATEGORICAL_NAMES]
    ranges = [[np.inf, -np.inf] for _ in DENSE_NAMES]
    with open(path) as stream:
        for line in stream:
            fields = line.rstrip("\n").split("\t")
            for i, value in enumerate(fields[1:14]):
                if value:
                    ranges[i] = [min(ranges[i][0], int(value)), max(ranges[i][1], int(value))]
            for i, value in enumerate(fields[14:]):
                if value:
                    counts[i][value] += 1
    categorical = {name: sorted(((v, c) for v, c in count.items() if c >= min_count),
                                key=lambda entry: (-entry[1], entry[0]))
                   for name, count in zip(CATEGORICAL_NAMES, counts)}
    return categorical, {name: None if low > high else (float(np.float32(low)),
                                                        float(np.float32(high)))
                         for name, (low, high) in zip(DENSE_NAMES, ranges)}


def tf_data_vocabulary(path, min_count):
    """The vocabulary of the reader's own tf.data chunks (the engine the pass did not choose)."""
    fmt = CriteoTSV.FORMAT
    files = FileSet(fmt, path)
    raw = parsed_chunks(files, LineParser(fmt, files), LineSelection(), np.arange(1), 1024)
    return count_vocabulary(raw, format_name="criteo", categorical_names=CATEGORICAL_NAMES,
                            dense_names=DENSE_NAMES, min_count=min_count)


@pytest.mark.parametrize("min_count", [1, 2, 3])
def test_the_pass_counts_exactly_what_the_lines_hold(criteo_file, min_count):
    categorical, dense_ranges = counted_by_hand(criteo_file, min_count)
    vocabulary = CriteoTSV.build_vocabulary(criteo_file, min_count=min_count)
    assert vocabulary.counting["exact"] and vocabulary.rows == LINES
    assert vocabulary.categorical == categorical
    assert vocabulary.dense_ranges == dense_ranges
    assert sum(len(v) for v in categorical.values()) > 1000  # long-tailed: a real test
    reference = tf_data_vocabulary(criteo_file, min_count)
    assert reference.categorical == categorical and reference.distinct == vocabulary.distinct


@pytest.mark.parametrize("min_count", [2, 3, 5])
def test_a_spill_into_the_sketch_keeps_the_exact_vocabulary_while_the_sketch_has_room(
        criteo_file, monkeypatch, min_count):
    """1,000 exact values at most (the file has about 14K), then the sketch: 2**20 counters a
    row leave no collision among its values, so the vocabulary is the exact one."""
    monkeypatch.setattr(vocabulary_pass, "counting_limits",
                        lambda memory_mb, gate: (1000, 1 << 20))
    monkeypatch.setattr(vocabulary_pass, "BLOCK_BYTES", 64 << 10)  # many blocks
    vocabulary = CriteoTSV.build_vocabulary(criteo_file, min_count=min_count)
    assert not vocabulary.counting["exact"] and vocabulary.counting["sketched"] > 0
    assert vocabulary.categorical == counted_by_hand(criteo_file, min_count)[0]
    exact = CriteoTSV.build_vocabulary(criteo_file, min_count=1).distinct
    for name in CATEGORICAL_NAMES:  # estimated within 5% (KMV), exact for small fields
        assert abs(vocabulary.distinct[name] - exact[name]) <= max(0.05 * exact[name], 0)


def test_a_narrow_sketch_lets_rare_values_in_but_never_leaves_one_out(criteo_file, monkeypatch):
    monkeypatch.setattr(vocabulary_pass, "counting_limits", lambda memory_mb, gate: (1000, 1024))
    monkeypatch.setattr(vocabulary_pass, "BLOCK_BYTES", 64 << 10)
    vocabulary = CriteoTSV.build_vocabulary(criteo_file, min_count=3)
    exact = counted_by_hand(criteo_file, 3)[0]
    assert vocabulary.counting["error_bound"] > 0
    kept = 0
    for name in CATEGORICAL_NAMES:
        counted = dict(vocabulary.categorical[name])
        for value, count in exact[name]:  # over by at most the gate (3): what the sketch held
            assert count <= counted[value] <= count + 3
        kept += len(counted) - len(exact[name])
    assert kept > 0  # the price: rare values let in


def avazu_lines(count, seed):
    """Avazu lines whose categorical values vary (a rare one now and then), over 30 hours."""
    rng = np.random.default_rng(seed)
    fields = REST.split(",")
    lines = []
    for i in range(count):
        rest = [f"{value}{rng.zipf(1.5) % 50}" if rng.random() < 0.5 else value
                for value in fields]
        lines.append(avazu_line(i % 2, f"141021{i % 24:02d}", rest=",".join(rest)))
    return lines


@pytest.mark.parametrize("kind", ["criteo", "avazu"])
@pytest.mark.parametrize("min_count", [1, 3])
def test_the_line_kernel_counts_as_pyarrows_parse_does(tmp_path, monkeypatch, kind, min_count):
    """Every value of every field through the kernel's fingerprints and value spans (min count
    1 makes each an entry; Avazu's categorical columns lie apart, its hour checked and derived):
    the vocabulary of pyarrow's parse, in many blocks and with a spill."""
    if kind == "criteo":
        odd = ['a"b', "x y", "0x1f", "\\", "é", "v,w", " "]
        lines = [criteo_line(i % 2, [i % 7 or None] + [None] * 12,
                             [odd[i % len(odd)] if i % 5 == 0 else f"v{(i * k) % 97}"
                              for k in range(26)]) for i in range(700)]
        path, source = write(tmp_path / "train.txt", lines), CriteoTSV
    else:
        path, source = write_avazu(tmp_path / "train.csv", avazu_lines(700, 4)), AvazuCSV
    monkeypatch.setattr(vocabulary_pass, "BLOCK_BYTES", 16 << 10)
    monkeypatch.setattr(vocabulary_pass, "counting_limits", lambda memory_mb, gate: (300, 1 << 16))
    by_kernel = source.build_vocabulary(path, min_count=min_count, test_fraction=0.25)
    monkeypatch.setattr(line_kernel, "reads", lambda text_format, layout: False)
    by_pyarrow = source.build_vocabulary(path, min_count=min_count, test_fraction=0.25)
    assert by_kernel.categorical == by_pyarrow.categorical
    assert (by_kernel.distinct, by_kernel.dense_ranges, by_kernel.rows) == (
        by_pyarrow.distinct, by_pyarrow.dense_ranges, by_pyarrow.rows)
    # a block's occurrences of a value reach the sketch one at a time from the kernel, so fewer
    # are sketched once it enters; Arrow hands them over as one count
    sketched = [v.counting.pop("sketched") for v in (by_kernel, by_pyarrow)]
    assert by_kernel.counting == by_pyarrow.counting and sketched[0] <= sketched[1]
    assert by_kernel.counting["exact"] == (min_count == 1)
    assert sum(len(values) for values in by_kernel.categorical.values()) > 100


def test_the_counting_threads_add_the_blocks_in_file_order(criteo_file, monkeypatch):
    """With a narrow sketch the counts depend on the order blocks are added in: blocks counted
    in threads, some slower than the next, count as one block after the other does."""
    monkeypatch.setattr(vocabulary_pass, "counting_limits", lambda memory_mb, gate: (1000, 1024))
    monkeypatch.setattr(vocabulary_pass, "BLOCK_BYTES", 64 << 10)
    monkeypatch.setattr(vocabulary_pass, "COUNTING_THREADS", 1)
    monkeypatch.setattr(vocabulary_pass, "BLOCKS_AHEAD", 0)
    one_by_one = CriteoTSV.build_vocabulary(criteo_file, min_count=3)
    monkeypatch.setattr(vocabulary_pass, "COUNTING_THREADS", 3)
    monkeypatch.setattr(vocabulary_pass, "BLOCKS_AHEAD", 4)
    block_counts, delays = vocabulary_pass._FileCounter._block_counts, iter(
        np.random.default_rng(5).choice([0, 0.05], 1000))

    def slower(self, *args):
        time.sleep(next(delays))
        return block_counts(self, *args)

    monkeypatch.setattr(vocabulary_pass._FileCounter, "_block_counts", slower)
    threaded = CriteoTSV.build_vocabulary(criteo_file, min_count=3)
    assert not threaded.counting["exact"]
    assert threaded.categorical == one_by_one.categorical
    assert threaded.distinct == one_by_one.distinct
    assert threaded.counting == one_by_one.counting and threaded.rows == LINES


def test_value_counts_fingerprints_mix_each_values_farmhash_with_its_field():
    """The fingerprints as documented, one value at a time, for values of 1 to 40 bytes, in a
    sliced array and a chunked one; the same value in two fields hashes apart."""
    mask = (1 << 64) - 1

    def mix(x):
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & mask
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & mask
        return x ^ (x >> 31)

    rng = np.random.default_rng(2)
    values = [rng.integers(0, 256, length, dtype=np.uint8).tobytes() for length in range(1, 41)]
    fields = rng.integers(0, 26, len(values))
    array = pa.array([b"x"] + values + [b"y"], pa.binary()).slice(1, len(values))
    got = value_counts.fingerprints(fields, array)
    want = value_counts.fingerprints(fields, pa.chunked_array([array[:7], array[7:]]))
    assert got.tolist() == want.tolist()
    farmhashes, _ = fingerprint_lib.fingerprints(array)
    assert got.tolist() == [mix(int(h) ^ mix((int(f) + 0x9E3779B97F4A7C15) & mask))
                            for f, h in zip(fields, farmhashes)]
    hash_range = (1 << 63) - 1  # TensorFlow's FarmHash, as to_hash_bucket_fast keeps it whole
    assert [int(h) % hash_range for h in farmhashes] == tf.strings.to_hash_bucket_fast(
        values, hash_range).numpy().tolist()
    same = pa.array([values[0]] * 2, pa.binary())
    assert len(set(value_counts.fingerprints(np.array([0, 1]), same).tolist())) == 2


def counted_one_by_one(batches, gate, max_values, width):
    """{(field, value): count} of (field, value, weight) batches as ValueCounts documents its
    counting, a value at a time in plain Python: exact entries until there are more than
    `max_values`, then the values under the gate into a count-min sketch of `width` counters a
    row (saturating at the gate), where a value enters when its estimate before it plus its
    weight reaches the gate; and the weights the sketch counted."""
    table, sketch, weights = {}, None, [0]

    def slots(field, value):
        key = int(value_counts.fingerprints(np.array([field]), pa.array([value], pa.binary()))[0])
        mask = (1 << 64) - 1
        return [int(value_counts.mix64(np.uint64((key + row + 1) & mask))) & (width - 1)
                for row in range(value_counts.SKETCH_DEPTH)]

    def sketched(entry, weight):
        weights[0] += weight
        at = slots(*entry)
        before = min(sketch[row][slot] for row, slot in enumerate(at))
        for row, slot in enumerate(at):
            sketch[row][slot] = min(sketch[row][slot] + min(weight, gate), gate)
        if before + weight >= gate:
            table[entry] = before + weight

    for batch in batches:
        for field, value, weight in batch:
            if sketch is None and len(table) > max_values:
                sketch = [[0] * width for _ in range(value_counts.SKETCH_DEPTH)]
                under = [(entry, count) for entry, count in table.items() if count < gate]
                for entry, _ in under:
                    del table[entry]
                for entry, count in under:
                    sketched(entry, count)
            entry = (field, value)
            if entry in table:
                table[entry] += weight
            elif sketch is None:
                table[entry] = weight
            else:
                sketched(entry, weight)
    return table, weights[0]


@pytest.mark.parametrize("by_keys", [False, True])
def test_value_counts_count_as_documented_a_value_at_a_time(monkeypatch, by_keys):
    """The C kernel's counts against the plain model above, with a narrow sketch (collisions),
    the table's room doubling and the rooms for KMV candidates and new entries filling many
    times: blocks of distinct values with counts (`add`), or of rows of fingerprints
    (`add_keys`)."""
    monkeypatch.setattr(value_counts, "_FIRST_ENTRIES", 8)
    monkeypatch.setattr(value_counts, "_CANDIDATE_ROOM", 4)
    monkeypatch.setattr(value_counts, "_ORIGIN_ROOM", 3)
    rng = np.random.default_rng(9)
    fields_count, gate, max_values, width = 3, 4, 30, 64
    counts = ValueCounts(fields_count, gate=gate, max_values=max_values, sketch_width=width)
    batches, seen = [], [set() for _ in range(fields_count)]
    for _ in range(40):
        rows = rng.zipf(1.3, (25, fields_count)) % 400
        values = [[b"v%d" % v if v else b"" for v in row] for row in rows]
        if by_keys:
            flat = pa.array([v for row in values for v in row], pa.binary())
            fields = np.tile(np.arange(fields_count), len(rows))
            present = pc.binary_length(flat).to_numpy() > 0
            keys = np.where(present, value_counts.fingerprints(fields, flat), 0)
            counts.add_keys(keys.reshape(len(rows), fields_count),
                            lambda origins, flat=flat: flat.take(pa.array(origins)))
            batches.append([(f, v, 1) for row in values for f, v in enumerate(row) if v])
        else:
            found = collections.Counter((f, v) for row in values for f, v in enumerate(row) if v)
            batch = sorted((f, v, c) for (f, v), c in found.items())
            counts.add(np.array([b[0] for b in batch]), pa.array([b[1] for b in batch],
                                                                 pa.binary()),
                       np.array([b[2] for b in batch]))
            batches.append(batch)
        for row in values:
            for f, v in enumerate(row):
                if v:
                    seen[f].add(v)
    table = counts.table()
    got = dict(zip(zip(table["field"].to_pylist(), table["value"].to_pylist()),
                   table["count"].to_pylist()))
    assert counts.spilled and len(got) > max_values  # the table grew past its first room
    assert (got, counts.sketched) == counted_one_by_one(batches, gate, max_values, width)
    assert counts.distinct().tolist() == [len(s) for s in seen]  # under KMV_SIZE: exact


def test_value_counts_spill_keeps_counts_of_values_past_the_gate():
    counts = ValueCounts(2, gate=3, max_values=4, sketch_width=1 << 16)
    block = ([0, 0, 0, 1, 1], [b"a", b"b", b"c", b"a", b"d"], [5, 1, 1, 2, 1])
    counts.add(block[0], pa.array(block[1], pa.binary()), block[2])
    counts.add(block[0], pa.array(block[1], pa.binary()), block[2])  # merged, then spilled
    counts.add([0, 1], pa.array([b"e", b"d"], pa.binary()), [1, 1])
    table = counts.table()
    got = sorted(zip(table["field"].to_pylist(), table["value"].to_pylist(),
                     table["count"].to_pylist()))
    assert counts.spilled
    assert got == [(0, b"a", 10), (1, b"a", 4), (1, b"d", 3)]  # d entered through the sketch
    assert counts.distinct().tolist() == [4, 2]


# ----------------------------------------------------------------------------- the reader's checks

def lines_with(bad_line, count=400, at=300):
    lines = [criteo_line(i % 2, [i] + [None] * 12, [f"v{i % 9}", f"w{i % 4}"] + [""] * 24)
             for i in range(count)]
    lines[at - 1] = bad_line
    return lines


@pytest.mark.parametrize("bad, problem", [
    ("1\t2", "expected 40 tab-separated fields, found 2"),
    (criteo_line(1, [" 5"] + [None] * 12, ["a"] * 26), "I1 must be an integer, found ' 5'"),
    (criteo_line(1, ["0x1f"] + [None] * 12, ["a"] * 26), "I1 must be an integer, found '0x1f'"),
    (criteo_line(2, [1] + [None] * 12, ["a"] * 26), "label must be 0 or 1, found '2'"),
])
def test_a_bad_line_in_a_later_block_is_named_by_file_and_line(tmp_path, monkeypatch, bad,
                                                               problem):
    monkeypatch.setattr(vocabulary_pass, "BLOCK_BYTES", 2048)
    path = write(tmp_path / "bad.txt", lines_with(bad))
    with pytest.raises(UserError, match=f"^{path} line 300: {problem}"):
        CriteoTSV.build_vocabulary(path, on_short_line="error")
    skipped = CriteoTSV.build_vocabulary(path, on_bad_line="skip", on_short_line="error")
    assert skipped.bad_lines_skipped == 1 and skipped.rows == 399


def test_blocks_the_fast_path_refuses_are_counted_as_the_reader_counts_them(tmp_path,
                                                                           monkeypatch):
    """Short lines (read as missing), "+5" (an integer pyarrow refuses), CRLF line ends."""
    monkeypatch.setattr(vocabulary_pass, "BLOCK_BYTES", 1024)
    lines = lines_with("1\t7\t\t\t\t\t\t\t\t\t\t\t\t\tv1", at=50)
    lines[120] = criteo_line(1, ["+5"] + [None] * 12, ["v2"] + [""] * 25)
    plain = write(tmp_path / "plain.txt", lines)
    crlf = tmp_path / "crlf.txt"
    crlf.write_bytes(open(plain, "rb").read().replace(b"\n", b"\r\n"))
    reference = tf_data_vocabulary(plain, 1)
    for path in (plain, str(crlf)):
        vocabulary = CriteoTSV.build_vocabulary(path)
        assert vocabulary.categorical == reference.categorical
        assert vocabulary.dense_ranges == reference.dense_ranges
        assert vocabulary.rows == 400


def test_the_ranks_shares_cover_every_line_once(criteo_file):
    with open(criteo_file, "rb") as stream:
        text = stream.read()
    for size in (1, 2, 3, 7):
        pieces = [vocabulary_pass.rank_pieces([criteo_file], rank, size) for rank in range(size)]
        joined = b"".join(block for rank in pieces for piece in rank
                          for _, _, block in vocabulary_pass.blocks(piece, 0))
        assert joined == text
        assert all(p.start == 0 or text[p.start - 1:p.start] == b"\n"
                   for rank in pieces for p in rank)


def test_the_train_side_of_a_split_is_counted_in_every_block(tmp_path, monkeypatch):
    monkeypatch.setattr(vocabulary_pass, "BLOCK_BYTES", 4096)
    path = write(tmp_path / "train.txt", lines_with(criteo_line(0, [1] * 13, ["x"] * 26)))
    split = CriteoTSV.build_vocabulary(path, test_fraction=0.3)
    fmt = CriteoTSV.FORMAT
    files = FileSet(fmt, path)
    raw = parsed_chunks(files, LineParser(fmt, files), LineSelection(0.3), np.arange(1), 1024)
    reference = count_vocabulary(raw, format_name="criteo", categorical_names=CATEGORICAL_NAMES,
                                 dense_names=DENSE_NAMES, min_count=1)
    assert split.rows == reference.rows < 400
    assert split.categorical == reference.categorical


# ----------------------------------------------------------------------------- the file

def test_vocabulary_files_are_parquet_and_json_ones_still_read(tmp_path, criteo_file):
    old = Vocabulary.load(os.path.join(HERE, "data", "vocabulary_v1.json"))
    assert old.categorical["C1"] == [("aa", 3), ("bb", 2), ("cc", 1)]
    assert old.dense_ranges["I1"] == (-3.0, 9.0) and old.distinct["C2"] == 1
    vocabulary = CriteoTSV.build_vocabulary(criteo_file)
    path = tmp_path / "criteo.vocab"
    vocabulary.save(path)
    assert open(path, "rb").read(4) == b"PAR1"
    assert Vocabulary.load(path) == vocabulary
    as_json = json.dumps({name: entries for name, entries in vocabulary.categorical.items()})
    assert os.path.getsize(path) < len(as_json) / 2
    assert not os.path.exists(f"{path}.tmp")
    shutil.copy(os.path.join(HERE, "data", "vocabulary_v1.json"), tmp_path / "v1.json")
    old.save(tmp_path / "v1.json")  # rewritten as Parquet in place
    assert Vocabulary.load(tmp_path / "v1.json").categorical == old.categorical


def test_a_truncated_parquet_vocabulary_is_a_user_error(tmp_path, criteo_file):
    path = tmp_path / "criteo.vocab"
    CriteoTSV.build_vocabulary(criteo_file).save(path)
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(UserError, match="criteo.vocab: not a readable vocabulary file"):
        Vocabulary.load(path)


# ----------------------------------------------------------------------------- 2 ranks

RANKS_FILE = "{dir}/vocabulary-ranks/train.txt"
BAD_FILE = "{dir}/vocabulary-ranks/bad.txt"
EXACT = grouped_launches.job("vocabulary-2-ranks", 2, "tests.multiworker.vocabulary_ranks",
                             RANKS_FILE, 3, 64, "{dir}/vocabulary-ranks/exact")
SPILLED = grouped_launches.job("vocabulary-2-ranks-spilled", 2,
                               "tests.multiworker.vocabulary_ranks", RANKS_FILE, 3, 16,
                               "{dir}/vocabulary-ranks/spilled")
STOPPED = grouped_launches.job("vocabulary-2-ranks-bad-line", 2,
                               "tests.multiworker.vocabulary_ranks", BAD_FILE, 1, 64,
                               "{dir}/vocabulary-ranks/bad")


@grouped_launches.prepare
def write_rank_inputs(directory):
    """40,000 generated lines (about 60K distinct values: 16 MB of counts spill); a file whose
    line 350 of 400 (in the second rank's half) is malformed."""
    os.makedirs(directory / "vocabulary-ranks", exist_ok=True)
    make_file(str(directory / "vocabulary-ranks" / "train.txt"), 40_000, seed=5)
    write(directory / "vocabulary-ranks" / "bad.txt",
          lines_with(criteo_line(1, [1] * 13, ["a"] * 27), at=350))


@pytest.mark.parametrize("job, label", [(EXACT, "exact"), (SPILLED, "spilled")])
def test_two_ranks_count_the_vocabulary_of_one_process(launched_jobs, job, label):
    result = launched_jobs[job]
    assert result.returncode == 0, result.output[-3000:]
    path = str(launched_jobs.path(RANKS_FILE))
    one = CriteoTSV.build_vocabulary(path, min_count=3, memory_mb=1024)  # exact
    ranks = [Vocabulary.load(launched_jobs.path(f"{{dir}}/vocabulary-ranks/{label}.rank{r}"))
             for r in (0, 1)]
    for vocabulary in ranks:
        assert vocabulary.counting["ranks"] == 2
        assert vocabulary.counting["exact"] == (label == "exact")
        assert vocabulary.categorical == one.categorical
        assert vocabulary.dense_ranges == one.dense_ranges and vocabulary.rows == one.rows == 40_000
    assert one.counting["exact"]
    if label == "exact":
        assert ranks[0].distinct == one.distinct


def test_a_bad_line_in_one_ranks_share_stops_both_with_its_file_and_line(launched_jobs):
    result = launched_jobs[STOPPED]
    assert result.returncode == 0, result.output[-3000:]
    path = launched_jobs.path(BAD_FILE)
    messages = [launched_jobs.path(f"{{dir}}/vocabulary-ranks/bad.rank{r}.error").read_text()
                for r in (0, 1)]
    assert messages[1] == f"{path} line 350: expected 40 tab-separated fields, found 41"
    assert messages[0] == f"rank 1: {messages[1]}"
