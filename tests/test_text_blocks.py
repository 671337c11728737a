"""The text readers' blocks of lines (tfscale.data.text_blocks): blocks that the C kernel
(tfscale.data.line_kernel) reads, and blocks that pyarrow parses and Arrow's checks pass, give
the same rows as the reader's LineParser gives for the same lines; a block holding anything else
goes through the LineParser, which refuses a bad value naming file, line and column, skips it,
or reads a short line's missing fields, as before. The kernel takes exactly the clean lines."""

import numpy as np
import pytest
import tensorflow as tf

from tfscale.data import handover, line_kernel
from tfscale.data.avazu import AvazuCSV
from tfscale.data.criteo import CriteoTSV
from tfscale.data.line_kernel import LineKernel
from tfscale.data.preprocessing import HashingEncoder
from tfscale.data.text_blocks import TextBlocks
from tfscale.data.text_lines import FileSet, LineParser, LineSelection, parsed_chunks
from tfscale.data.schema import MISSING_ID
from tfscale.data.vocabulary import FIRST_VALUE_ID, OOV_ID
from tfscale.errors import user_error_from_tf
from tests.test_avazu import write as write_avazu

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


def rows(dataset, encoder):
    """(labels, dense, present, categorical ids, derived, bad lines) of raw columns (the
    LineParser's categorical strings encoded by `encoder`, as the blocks' were)."""
    raws = list(dataset.as_numpy_iterator())
    for raw in raws:
        if "categorical_ids" not in raw:
            raw["categorical_ids"] = encoder.encode(raw["categorical"]).numpy()
    keys = ("labels", "dense", "dense_present", "categorical_ids", "derived")
    return [np.concatenate([raw[key] for raw in raws]) for key in keys] + [
        sum(int(raw["bad_lines"]) for raw in raws)]


@pytest.fixture(params=["kernel", "pyarrow"])
def first_try(request, monkeypatch):
    """Which reads a clean block: the C kernel, or (the kernel switched off) pyarrow's parse."""
    if request.param == "pyarrow":
        monkeypatch.setattr(line_kernel, "reads", lambda text_format, layout: False)
    return request.param


@pytest.fixture
def kernel_reads(monkeypatch):
    """Whether the kernel read each block it was given, in order."""
    reads, element = [], LineKernel.element

    def recorded(kernel, block, keep):
        result = element(kernel, block, keep)
        reads.append(result is not None)
        return result

    monkeypatch.setattr(LineKernel, "element", recorded)
    return reads


def by_blocks(path, selection=LineSelection(), skip=False, block_bytes=2048, parsed=None,
              encoder=ENCODER, text_format=FORMAT):
    """The rows of TextBlocks of lines of `text_format`, categorical values encoded by
    `encoder`; `parsed` (a list) gets the blocks the LineParser parsed."""
    files = FileSet(text_format, path)
    blocks = TextBlocks(text_format, files, skip, "missing", block_bytes=block_bytes)
    if parsed is not None:
        through_the_parser = blocks._through_the_parser

        def recorded(file_index, block, numbers, keep, encoder):
            parsed.append(int(numbers[0]))
            return through_the_parser(file_index, block, numbers, keep, encoder)

        blocks._through_the_parser = recorded
    return rows(handover.raw_columns(lambda: blocks.elements(selection, np.arange(1), encoder),
                                     text_format), encoder)


def by_the_parser(path, selection=LineSelection(), skip=False, encoder=ENCODER,
                  text_format=FORMAT):
    files = FileSet(text_format, path)
    return rows(parsed_chunks(files, LineParser(text_format, files, skip, "missing"), selection,
                              np.arange(1), 64), encoder)


def assert_same(got, want):
    for got_column, want_column in zip(got, want):
        np.testing.assert_array_equal(got_column, want_column)


@pytest.mark.parametrize("selection", [LineSelection(), LineSelection(0.3, True, 1, 2)])
def test_blocks_read_what_the_line_parser_reads(tmp_path, selection, first_try, kernel_reads):
    path = write(tmp_path / "train.txt", lines(300))
    parsed = []
    assert_same(by_blocks(path, selection, parsed=parsed), by_the_parser(path, selection))
    assert parsed == []  # every block took a fast path (integers as text in pyarrow's first)
    assert kernel_reads == ([True] * len(kernel_reads) if first_try == "kernel" else [])
    assert len(kernel_reads) > 10 or first_try == "pyarrow"


def test_the_kernel_gives_the_vocabularys_ids(tmp_path, kernel_reads):
    path = write(tmp_path / "train.txt", lines(300))
    encoder = CriteoTSV.build_vocabulary(path, min_count=2).encoder(FORMAT.categorical_names)
    got = by_blocks(path, encoder=encoder)
    assert_same(got, by_the_parser(path, encoder=encoder))  # TensorFlow's search of the keys
    assert all(kernel_reads) and len(kernel_reads) > 10
    assert {OOV_ID, MISSING_ID, FIRST_VALUE_ID} <= set(np.unique(got[3]))


def test_lines_without_labels_read_as_the_line_parser_reads_them(tmp_path, first_try):
    path = write(tmp_path / "test.txt", [line.split("\t", 1)[1] for line in lines(300)])
    got = by_blocks(path)
    assert_same(got, by_the_parser(path))
    assert not got[0].any()


AVAZU = AvazuCSV.FORMAT
AVAZU_ENCODER = HashingEncoder([1 << 40] * len(AVAZU.categorical_names))


def avazu_lines(count):
    """Avazu lines (id, click, hour, 21 categorical values), some hours and values missing."""
    rng = np.random.default_rng(1)
    lines = []
    for row in range(count):
        hour = "" if row % 7 == 0 else f"1410{21 + row % 9}{row % 24:02d}"
        values = [f"{rng.integers(30):x}" if rng.random() > 0.1 else "" for _ in range(21)]
        lines.append(",".join([str(row), str(row % 2), hour] + values))
    return lines


def test_avazu_lines_read_by_the_kernel_as_the_line_parser_reads_them(tmp_path, kernel_reads):
    path = write_avazu(tmp_path / "train.csv", avazu_lines(300))
    selection = LineSelection(0.3, False)
    got = by_blocks(path, selection, encoder=AVAZU_ENCODER, text_format=AVAZU)
    assert_same(got, by_the_parser(path, selection, encoder=AVAZU_ENCODER, text_format=AVAZU))
    assert all(kernel_reads) and len(kernel_reads) > 5
    assert got[4].any() and not got[4].all()  # the hour's derived ids, missing hours 0


def test_an_avazu_block_failing_the_hour_check_goes_on_to_the_line_parser(tmp_path,
                                                                          kernel_reads):
    text = avazu_lines(300)
    text[150] = text[150].replace(text[150].split(",")[2], "14132100", 1)  # month 13
    path = write_avazu(tmp_path / "train.csv", text)
    parsed = []
    got = by_blocks(path, skip=True, parsed=parsed, encoder=AVAZU_ENCODER, text_format=AVAZU)
    assert_same(got, by_the_parser(path, skip=True, encoder=AVAZU_ENCODER, text_format=AVAZU))
    assert got[-1] == 1 and len(parsed) == 1 and kernel_reads.count(False) == 1


def test_a_block_with_a_short_or_bad_line_goes_through_the_line_parser(tmp_path, first_try):
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
        tmp_path, line, problem, first_try):
    text = lines(300)
    text[200] = line(text[200])
    text[200] = "\t".join(text[200].split("\t")[:40])  # the same field count
    path = write(tmp_path / "train.txt", text)
    with pytest.raises(tf.errors.InvalidArgumentError) as caught:
        by_blocks(path)
    assert str(user_error_from_tf(caught.value)) == f"{path} line 201: {problem}"


CLEAN = lines(3)


def kernel_element(text, keep=None):
    """The kernel's element of the block of `text` (lines of Criteo's layout with labels), or
    None."""
    files_layout = FORMAT.layout("block", [CLEAN[0]])
    block = text.encode()
    count = block.count(b"\n") + (0 if block.endswith(b"\n") else 1)
    keep = np.ones(count, bool) if keep is None else np.asarray(keep)
    return LineKernel(FORMAT, files_layout, ENCODER.kernel_rule()).element(block, keep)


@pytest.mark.parametrize("change", [
    lambda text: text.replace("\n", "\n\n", 1),  # an empty line
    lambda text: text.replace("\n", "\tx\n", 1),  # a field too many
    lambda text: text.replace("\t", "", 1),  # a field too few
    lambda text: text.replace("\n", "\r\n", 1),  # a carriage return, which the reader drops
    lambda text: "2" + text[1:],  # a label other than 0 or 1
    lambda text: "0\t1.5" + text[text.index("\t", 2):],
    lambda text: "0\t 5" + text[text.index("\t", 2):],
    lambda text: "0\t0x5" + text[text.index("\t", 2):],
    lambda text: "0\t+" + text[text.index("\t", 2):],
    lambda text: "0\t--5" + text[text.index("\t", 2):],
    lambda text: "0\t9223372036854775808" + text[text.index("\t", 2):],
    lambda text: "0\t-9223372036854775809" + text[text.index("\t", 2):],
    lambda text: "0\t99999999999999999999" + text[text.index("\t", 2):],
])
def test_the_kernel_refuses_every_line_that_is_not_clean(change):
    text = "\n".join(CLEAN) + "\n"
    assert kernel_element(text) is not None
    assert kernel_element(change(text)) is None


def test_the_kernel_reads_integers_at_the_patterns_edges_and_passes_over_lines_not_kept():
    integers = ["+0", "-0", "000000000000000000000000042", "9223372036854775807",
                "-9223372036854775808", "-000009223372036854775808", "", "+12", "7", "-1",
                "0", "1", "2"]
    line = "\t".join(["1"] + integers + CLEAN[0].split("\t")[14:])
    text = "\n".join([line, "not\ta\tline", line])  # the last line without its line end
    element = kernel_element(text, keep=[True, False, True])
    want = [0, 0, 42, 2**63 - 1, -2**63, -2**63, 0, 12, 7, -1, 0, 1, 2]
    np.testing.assert_array_equal(element["dense"], np.array([want] * 2, np.float32))
    np.testing.assert_array_equal(element["dense_present"][0], [value != "" for value in integers])
    np.testing.assert_array_equal(element["labels"], [1, 1])
    np.testing.assert_array_equal(
        element["categorical_ids"][0],
        ENCODER.encode(tf.constant([CLEAN[0].split("\t")[14:]])).numpy()[0])
