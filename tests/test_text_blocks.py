"""The text readers' blocks of lines (tfscale.data.text_blocks): blocks that pyarrow parses and
Arrow's checks pass give the same rows as the reader's LineParser gives for the same lines; a
block holding anything else goes through the LineParser, which refuses a bad value naming file,
line and column, skips it, or reads a short line's missing fields, as before."""

import numpy as np
import pytest
import tensorflow as tf

from tfscale.data import handover
from tfscale.data.criteo import CriteoTSV
from tfscale.data.preprocessing import HashingEncoder
from tfscale.data.text_blocks import TextBlocks
from tfscale.data.text_lines import FileSet, LineParser, LineSelection, parsed_chunks
from tfscale.errors import user_error_from_tf

FORMAT = CriteoTSV.FORMAT
ENCODER = HashingEncoder([1 << 40] * len(FORMAT.categorical_names))  # ids as good as values
EDGES = ["+5", "007", "-0", "", "9223372036854775807", "-9223372036854775808", "-3"]


def lines(count, seed=0):
    """Criteo lines with integers at the reader's edges, missing values and long text."""
    rng = np.random.default_rng(seed)
    out = []
    for row in range(count):
        integers = [str(row)] + [EDGES[(row + k) % len(EDGES)] for k in range(12)]
        texts = [f"{rng.integers(50):08x}" if rng.random() > 0.2 else "" for _ in range(25)]
        texts.append("a much longer value, with spaces and ünïcödé" if row < 20 else "z")
        out.append("\t".join([str(row % 2)] + integers + texts))
    return out


def write(path, text_lines):
    path.write_text("\n".join(text_lines) + "\n", encoding="utf-8")
    return str(path)


def rows(dataset):
    """(labels, dense, present, categorical ids, derived, bad lines) of raw columns (the
    LineParser's categorical strings encoded by ENCODER, as the blocks' were)."""
    raws = list(dataset.as_numpy_iterator())
    for raw in raws:
        if "categorical_ids" not in raw:
            raw["categorical_ids"] = ENCODER.encode(raw["categorical"]).numpy()
    keys = ("labels", "dense", "dense_present", "categorical_ids", "derived")
    return [np.concatenate([raw[key] for raw in raws]) for key in keys] + [
        sum(int(raw["bad_lines"]) for raw in raws)]


def by_blocks(path, selection=LineSelection(), skip=False, block_bytes=2048, parsed=None):
    """The rows of TextBlocks; `parsed` (a list) gets the blocks the LineParser parsed."""
    files = FileSet(FORMAT, path)
    blocks = TextBlocks(FORMAT, files, skip, "missing", block_bytes=block_bytes)
    if parsed is not None:
        through_the_parser = blocks._through_the_parser

        def recorded(file_index, block, numbers, keep, encoder):
            parsed.append(int(numbers[0]))
            return through_the_parser(file_index, block, numbers, keep, encoder)

        blocks._through_the_parser = recorded
    return rows(handover.raw_columns(lambda: blocks.elements(selection, np.arange(1), ENCODER),
                                     FORMAT))


def by_the_parser(path, selection=LineSelection(), skip=False):
    files = FileSet(FORMAT, path)
    return rows(parsed_chunks(files, LineParser(FORMAT, files, skip, "missing"), selection,
                              np.arange(1), 64))


def assert_same(got, want):
    for got_column, want_column in zip(got, want):
        np.testing.assert_array_equal(got_column, want_column)


@pytest.mark.parametrize("selection", [LineSelection(), LineSelection(0.3, True, 1, 2)])
def test_blocks_read_what_the_line_parser_reads(tmp_path, selection):
    path = write(tmp_path / "train.txt", lines(300))
    parsed = []
    assert_same(by_blocks(path, selection, parsed=parsed), by_the_parser(path, selection))
    assert parsed == []  # every block took the fast path (integers as text in the first ones)


def test_a_block_with_a_short_or_bad_line_goes_through_the_line_parser(tmp_path):
    text = lines(300)
    text[40] = "\t".join(text[40].split("\t")[:20])  # short: its missing fields read as missing
    text[250] = text[250].replace("\t", "\t0x10\t", 1)  # a bad line: skipped and counted
    path = write(tmp_path / "train.txt", text)
    parsed = []
    got = by_blocks(path, skip=True, parsed=parsed)
    assert_same(got, by_the_parser(path, skip=True))
    assert got[-1] == 1 and len(got[0]) == 299
    assert len(parsed) == 2 and parsed[0] <= 41 and parsed[1] <= 251  # only those two blocks


@pytest.mark.parametrize("line, problem", [
    (lambda line: "2" + line[1:], "label must be 0 or 1, found '2'"),
    (lambda line: line.replace("\t", "\t 5\t", 1)[:-2], "I1 must be an integer, found ' 5'"),
    (lambda line: line.replace("\t", "\t0x5\t", 1)[:-2], "I1 must be an integer, found '0x5'"),
    (lambda line: line.replace("\t", "\t1.5\t", 1)[:-2], "I1 must be an integer, found '1.5'"),
    (lambda line: line.replace("\t", "\t99999999999999999999\t", 1)[:-2],
     "I1 must be an integer in int64's range (-9223372036854775808 to 9223372036854775807), "
     "found '99999999999999999999'"),
])
def test_a_bad_value_in_a_later_block_is_refused_naming_file_line_and_column(
        tmp_path, line, problem):
    text = lines(300)
    text[200] = line(text[200])
    text[200] = "\t".join(text[200].split("\t")[:40])  # the same field count
    path = write(tmp_path / "train.txt", text)
    with pytest.raises(tf.errors.InvalidArgumentError) as caught:
        by_blocks(path)
    assert str(user_error_from_tf(caught.value)) == f"{path} line 201: {problem}"
