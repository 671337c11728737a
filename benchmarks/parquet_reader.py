"""Rows/s of the Parquet reader against the TSV reader on the same rows, with pyarrow's own read
of the file as the ceiling, in one process.

    python -m benchmarks.parquet_reader [--rows=400000] [--repeats=5] [--note="what else ran"]

Writes `--rows` rows of the synthetic Criteo-like data as Criteo TSV and converts them to
Parquet with pyarrow (integers int64 and categorical values text, empty fields null; pyarrow's
default row groups). Then, with op determinism on as launch.train turns it on, alternately (the
order reversed every other repeat): `CriteoTSV` and `CriteoParquet` read every row through
`train_batches` (hashed ids, log1p integers, every row checked), and `pyarrow.parquet.read_table`
reads the file. Appends one JSON line to `--results` (the rows/s of every run, their medians,
the machine with its CPU flags, the date, the command, the load average and the other
processes' CPU seconds during each run, and the busiest other processes at the start) and
prints a markdown table."""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pyarrow as pa  # noqa: E402
import pyarrow.csv as pa_csv  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import tensorflow as tf  # noqa: E402
from absl import app, flags  # noqa: E402

from benchmarks.timing import OtherProcessesCPU, cpu_flags, machine_description  # noqa: E402
from tfscale.data.criteo import CATEGORICAL_NAMES, DENSE_NAMES, CriteoParquet, CriteoTSV  # noqa
from tfscale.data.synthetic import SyntheticCTR  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_integer("rows", 400_000, "Rows written as TSV and as Parquet.", lower_bound=1)
flags.DEFINE_integer("repeats", 5, "Runs of each reader (medians reported).", lower_bound=1)
flags.DEFINE_integer("batch_size", 65536, "Batch of the readers' train_batches.", lower_bound=1)
flags.DEFINE_integer("hash_buckets", 1_000_000, "Hash buckets per categorical field.")
flags.DEFINE_string("results", "benchmarks/results/parquet_reader.jsonl", "JSON lines file.")
flags.DEFINE_string("note", "", "What else ran on the machine (stored with the results).")

READERS = ("tsv", "parquet", "pyarrow_read_table")


def write_files(directory, rows):
    """(TSV path, Parquet path) of the same `rows` synthetic rows."""
    text = os.path.join(directory, "train.txt")
    SyntheticCTR(seed=1, train_rows=rows, test_rows=1).write_criteo_tsv(text, 0, rows)
    names = ["label", *DENSE_NAMES, *CATEGORICAL_NAMES]
    types = {name: pa.int64() for name in names[:14]}
    types.update({name: pa.string() for name in CATEGORICAL_NAMES})
    table = pa_csv.read_csv(text, read_options=pa_csv.ReadOptions(column_names=names),
                            parse_options=pa_csv.ParseOptions(delimiter="\t"),
                            convert_options=pa_csv.ConvertOptions(
                                column_types=types, strings_can_be_null=True))
    parquet = os.path.join(directory, "train.parquet")
    pq.write_table(table, parquet)
    return text, parquet


def rows_read(reader, text, parquet):
    """Rows one pass of `reader` delivered."""
    if reader == "pyarrow_read_table":
        return pq.read_table(parquet).num_rows
    source_class, path = (CriteoTSV, text) if reader == "tsv" else (CriteoParquet, parquet)
    source = source_class(path, test_fraction=0.0, hash_buckets=FLAGS.hash_buckets)
    return sum(int(labels.shape[0]) for _, labels in source.train_batches(FLAGS.batch_size))


def busiest_processes(count=6):
    """Up to `count` other processes using at least 1% of a core now, as "%CPU elapsed
    command" (the command cut to 100 characters)."""
    listed = subprocess.run(["ps", "-eo", "pid=,pcpu=,etime=,args=", "--sort=-pcpu"],
                            capture_output=True, text=True).stdout.splitlines()
    busy = []
    for line in listed:
        pid, cpu, elapsed, command = line.split(None, 3)
        if pid != str(os.getpid()) and float(cpu) >= 1.0 and not command.startswith("["):
            busy.append(f"{cpu} {elapsed} {command[:100]}")
    return busy[:count]


def main(argv):
    del argv
    tf.config.experimental.enable_op_determinism()  # as launch.train runs
    started_at = busiest_processes()
    load_start = os.getloadavg()
    runs = []
    with tempfile.TemporaryDirectory() as directory:
        text, parquet = write_files(directory, FLAGS.rows)
        metadata = pq.ParquetFile(parquet).metadata
        sizes = {"tsv_bytes": os.path.getsize(text), "parquet_bytes": os.path.getsize(parquet),
                 "row_groups": metadata.num_row_groups}
        rows_read("parquet", text, parquet)  # warm-up: imports, tracing, the file cache
        rows_read("tsv", text, parquet)
        for repeat in range(FLAGS.repeats):
            for reader in READERS if repeat % 2 == 0 else READERS[::-1]:
                others = OtherProcessesCPU()
                begun = time.perf_counter()
                rows = rows_read(reader, text, parquet)
                seconds = time.perf_counter() - begun
                runs.append({"reader": reader, "repeat": repeat, "rows": rows,
                             "seconds": seconds, "rows_per_second": rows / seconds,
                             "other_processes_cpu_seconds": others.seconds(),
                             "load_average_1min": os.getloadavg()[0]})
                print(f"{reader}: {rows / seconds:,.0f} rows/s", flush=True)
    medians = {reader: statistics.median(r["rows_per_second"] for r in runs
                                         if r["reader"] == reader) for reader in READERS}
    record = {
        "benchmark": "parquet_reader", "date": time.strftime("%Y-%m-%d"),
        "command": "python -m benchmarks.parquet_reader " + " ".join(sys.argv[1:]),
        "machine": machine_description(), "cpu_flags": cpu_flags(), "cores": os.cpu_count(),
        "rows": FLAGS.rows, "batch_size": FLAGS.batch_size, "hash_buckets": FLAGS.hash_buckets,
        **sizes, "median_rows_per_second": medians, "runs": runs,
        "load_average_start": load_start, "load_average_end": os.getloadavg(),
        "busiest_other_processes_at_start": started_at, "note": FLAGS.note,
    }
    with open(FLAGS.results, "a") as stream:
        stream.write(json.dumps(record) + "\n")
    print(f"\n{record['machine']}; CPU flags {record['cpu_flags']}; {FLAGS.rows:,} rows, "
          f"Parquet {sizes['parquet_bytes'] / 1e6:.1f} MB in {sizes['row_groups']} row groups, "
          f"TSV {sizes['tsv_bytes'] / 1e6:.1f} MB\n")
    print("| reader | median rows/s | x TSV |\n|---|---:|---:|")
    for reader in READERS:
        print(f"| {reader} | {medians[reader]:,.0f} | {medians[reader] / medians['tsv']:.2f}x |")


if __name__ == "__main__":
    app.run(main)
