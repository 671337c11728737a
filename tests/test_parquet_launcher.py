"""`launch.train` on Parquet files: told from text by their first bytes, trained on exactly as
the same rows as text lines (one process: the same batches, so the same final AUC to the last
digit), with --parquet_columns on files of other column names over two Horovod ranks (the
vocabulary counted from the rows, the trained model's test lines scored as served lines), and a
bad value ending in one paragraph naming file, row, row group and column in flag terms.

The runs are jobs of the grouped launches (tests/grouped_launches.py)."""

import pathlib
import re

import pyarrow as pa
import pyarrow.parquet as pq

from tests import grouped_launches
from tests.test_parquet import criteo_table

RUNS_DIR = "{dir}/parquet"
TRAIN_TEXT = f"{RUNS_DIR}/train.txt"
TRAIN_ROWS = f"{RUNS_DIR}/rows/train.snappy.parquet"
RENAMED = f"{RUNS_DIR}/renamed"
BAD_ROWS = f"{RUNS_DIR}/bad/part-0"  # no extension: told by its first bytes
MAPPING = ["label=click"] + [f"I{i}=int_{i}" for i in range(1, 14)]
TINY_RUN = ["--data=criteo", "--batch_size=64", "--dnn_units=16", "--epochs=1", "--logdir=none",
            "--vocabulary_min_count=2", "--hash_buckets=300", "--checkpoint_every_steps=0",
            "--learning_rate=0.01", "--embedding_learning_rate=0.05", "--warmup_epochs=0"]


def job(name, *flags, ranks=1):
    return grouped_launches.launcher_job(f"parquet-{name}", ranks, *TINY_RUN, *flags,
                                         f"--checkpoint_dir={RUNS_DIR}/{name}/checkpoints")


AS_TEXT = job("as-text", f"--train_path={TRAIN_TEXT}", "--categorical_encoding=hash")
AS_ROWS = job("as-rows", f"--train_path={TRAIN_ROWS}", "--categorical_encoding=hash")
MAPPED = job("mapped-2-ranks", f"--train_path={RENAMED}/*.parquet",
             f"--parquet_columns={','.join(MAPPING)}", ranks=2)
BAD = job("bad-value", f"--train_path={BAD_ROWS}")


@grouped_launches.prepare
def _files(directory):
    """The Criteo lines of the synthetic generator as text, as Parquet rows written by pyarrow
    (three row groups), renamed and written by pandas in two files, and with a bad value."""
    from tfscale.data.synthetic import SyntheticCTR

    text = pathlib.Path(TRAIN_TEXT.format(dir=directory))
    text.parent.mkdir(parents=True)
    SyntheticCTR(seed=5, train_rows=700, test_rows=10,
                 vocabulary_scale=0.002).write_criteo_tsv(str(text), 0, 700)
    table = criteo_table(text.read_text().splitlines())
    rows = pathlib.Path(TRAIN_ROWS.format(dir=directory))
    rows.parent.mkdir()
    pq.write_table(table, rows, row_group_size=256)
    renamed = pathlib.Path(RENAMED.format(dir=directory))
    renamed.mkdir()
    frame = table.rename_columns([pair.split("=")[1] for pair in MAPPING]
                                 + table.column_names[14:]).to_pandas()
    frame[:300].to_parquet(renamed / "part-0.parquet", row_group_size=100)
    frame[300:].to_parquet(renamed / "part-1.parquet", row_group_size=100)
    bad = pathlib.Path(BAD_ROWS.format(dir=directory))
    bad.parent.mkdir()
    values = table.column("I3").to_pylist()
    values[456] = 2.0**70
    pq.write_table(table.set_column(3, "I3", pa.array(values, pa.float64())), bad,
                   row_group_size=256)


def final_line(result):
    assert result.returncode == 0, result.output
    return re.search(r"final test AUC \S+, logloss \S+", result.stdout()).group(0)


def test_rows_train_as_their_lines(launched_jobs):
    rows = launched_jobs[AS_ROWS]
    assert final_line(rows) == final_line(launched_jobs[AS_TEXT])
    path = launched_jobs.path(TRAIN_ROWS)
    assert f"on CriteoParquet: train {path} (700 rows)" in rows.stdout()


def test_parquet_columns_over_two_ranks(launched_jobs):
    result = launched_jobs[MAPPED]
    final_line(result)
    out = result.stdout()
    assert "vocabulary: counting the categorical values of" in out
    assert "columns label=click, I1=int_1" in out
    checkpoints = launched_jobs.path(f"{RUNS_DIR}/mapped-2-ranks/checkpoints")
    assert (checkpoints / "trained_predictions.json").exists()


def test_a_bad_value_ends_in_one_paragraph_in_flag_terms(launched_jobs):
    result = launched_jobs[BAD]
    assert result.returncode == 2, result.output
    path = launched_jobs.path(BAD_ROWS)
    assert (f"{path} row 457 (row group 1): column 'I3' must be an integer in int64's range "
            "(-9223372036854775808 to 9223372036854775807), found 1.1805916207174113e+21; fix "
            "the file, or skip such rows with --on_bad_line=skip") in result.stderr()
    assert "Traceback" not in result.stderr()
