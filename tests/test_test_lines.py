"""DelimitedTextSource.test_lines (the lines a run records as its test lines): with the training
files split by hash, the lines it returns are the test split's, in order: the first n rows of
`test_batches` and none of `train_batches`, in one file and across files, and below a header
line (Avazu), where the split numbers lines from 1 counting the header."""

import numpy as np
import pytest

from tests.test_avazu import avazu_line
from tests.test_avazu import collect as collect_avazu
from tests.test_avazu import write as write_avazu
from tests.test_criteo import collect, numbered_lines, row_ids, write
from tfscale.data.avazu import AvazuCSV
from tfscale.data.criteo import CriteoTSV


@pytest.mark.parametrize("files", [1, 2])
def test_criteo_test_lines_are_the_first_lines_of_the_test_split(tmp_path, files):
    """Each line's I1 is its row index, so a line and a batch row are told apart by it."""
    lines = numbered_lines(400)
    if files == 1:
        paths = write(tmp_path / "train.txt", lines)
    else:
        write(tmp_path / "part-0.txt", lines[:150])
        write(tmp_path / "part-1.txt", lines[150:])
        paths = str(tmp_path / "part-*.txt")
    source = CriteoTSV(paths, test_fraction=0.25, chunk_lines=64)
    test_rows = row_ids(collect(source.test_batches(7))[0])
    train_rows = row_ids(collect(source.train_batches(1))[0])
    assert 60 < len(test_rows) < 140

    first = source.test_lines(30)
    assert first == [lines[i] for i in test_rows[:30]]
    assert not {int(line.split("\t")[1]) for line in first} & set(train_rows)
    assert source.test_lines(1000) == [lines[i] for i in test_rows]  # the whole split


def test_avazu_test_lines_below_a_header_are_the_first_lines_of_the_test_split(tmp_path):
    """A row is told apart by its (day, hour); the lines returned are read back as a test file
    of their own."""
    lines = [avazu_line(i % 2, f"1410{21 + i // 24:02d}{i % 24:02d}") for i in range(96)]
    source = AvazuCSV(write_avazu(tmp_path / "train.csv", lines), test_fraction=0.3,
                      chunk_lines=16)

    def hours(dataset):
        categorical = collect_avazu(dataset)[1]
        return list(zip(categorical[:, -1].tolist(), categorical[:, -2].tolist()))

    test_rows = hours(source.test_batches(100))
    train_rows = hours(source.train_batches(1))
    assert len(set(test_rows + train_rows)) == 96 and len(test_rows) > 15

    first = source.test_lines(15)
    assert len(first) == 15 and set(first) <= set(lines)
    returned = write_avazu(tmp_path / "returned.csv", first)
    read_back = hours(AvazuCSV(returned, returned).test_batches(100))
    assert read_back == test_rows[:15]
    assert not set(read_back) & set(train_rows)
    assert np.all([line in lines for line in source.test_lines(1000)])
    assert len(source.test_lines(1000)) == len(test_rows)
