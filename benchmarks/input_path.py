"""The input path: reading a Criteo-format file into batches of ids, against pyarrow's own
readers, stage by stage, and training from the file against the built-in data.

    python -m benchmarks.input_path --make_files=/tmp/inpath      # criteo.txt, criteo.parquet
    python -m benchmarks.input_path --dir=/tmp/inpath --part=readers --rounds=3 --note="..."
    python -m benchmarks.input_path --dir=/tmp/inpath --part=stages --note="..."
    python -m benchmarks.input_path --dir=/tmp/inpath --part=train --rounds=2 --note="..."

--make_files writes 1M Criteo-format lines with about 5M distinct categorical values
(benchmarks.criteo_file with flatter Zipf exponents) and the same rows as Parquet
(pyarrow's writer, its default row groups; integers int64, categorical values text, empty
fields null), their first 20,000 rows as test files of both kinds (training evaluates on them),
then the vocabulary (min count 10) the vocabulary cases look up.

Parts (each appends JSON lines to --results: the machine (lscpu model name and flags, cores),
date, command, load average and the other processes' CPU seconds of every run, --note):
  readers  in one process, alternating (the order reversed every other round): the TSV and
           Parquet readers' `train_batches(8192)` with hashing and with the vocabulary, every
           row checked; `pyarrow.parquet.read_table` and `pyarrow.csv.read_csv` (every column,
           pyarrow's threads: one per core) of the same file. Rows/s and CPU seconds.
  stages   where the time goes: passes over the file that stop after each stage (decode,
           checks, conversion, hand-over to TF (with the ids, where the readers encode in
           their threads), encoding, batching), for Parquet and text, hashing; each stage's
           cost is the difference to the pass before. Text blocks also through the C kernel
           alone (parse, checks and ids in one pass), and as the vocabulary pass reads and
           counts them (fingerprints, then counted at min count 10), one thread.
  train    `launch.train` (DeepFM, batch 8,192, one epoch) on the TSV file, on the Parquet
           file and on `--data=synthetic` with as many rows, alternating, in processes of their
           own; the epoch line's examples/s.
  vocabulary  the vocabulary pass (min count 10) and the TSV reader, alternating, each in a
           process of its own (benchmarks.vocab_pass's cases): rows/s after start-up, and the
           peak resident memory.
Readers, stages and the vocabulary part run with the C allocator as launch.train sets it
(--allocator_pad_mib, launch.train's --retain_freed_memory_mib: 64 MiB of freed memory kept by
each malloc heap; 0 leaves it as it is).
"""

import json
import os
import re
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from absl import app, flags  # noqa: E402

from benchmarks import allocator_flag  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_string("make_files", None, "Write the test files into this directory and stop.")
flags.DEFINE_integer("lines", 1_000_000, "Lines of --make_files.")
flags.DEFINE_string("dir", "/tmp/inpath", "The directory of --make_files' files.")
flags.DEFINE_enum("part", "readers", ["readers", "stages", "train", "vocabulary"],
                  "What to measure.")
flags.DEFINE_integer("rounds", 3, "Rounds of every case.")
flags.DEFINE_integer("batch_size", 8192, "Batch of the readers and of training.")
flags.DEFINE_string("results", "benchmarks/results/input_path.jsonl", "JSON lines file.")
flags.DEFINE_string("note", "", "What else ran on the machine (stored with each line).")
flags.DEFINE_string("old_tree", None,
                    "readers, stages: also measure the tree in this directory (e.g. `git archive` "
                    "of an earlier commit), each tree in a process of its own, alternating.")
flags.DEFINE_string("tree", "after", "The label of the tree measured (set with --old_tree).")
flags.DEFINE_bool("report", False, "Only print the tables of --results.")
flags.DEFINE_string("report_note", "", "--report: only the lines whose note holds this text.")

TEXT, PARQUET, VOCABULARY = "criteo.txt", "criteo.parquet", "criteo.vocab"
TEST_TEXT, TEST_PARQUET = "criteo_test.txt", "criteo_test.parquet"  # the first 20,000 rows
TEST_ROWS = 20_000
FLATTER = 0.7  # Zipf exponents e -> 1 + (e - 1) * FLATTER: about 5M distinct values in 1M lines
HASH_BUCKETS = 1_000_000


def make_files(directory, lines):
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    from benchmarks.criteo_file import ZIPF_EXPONENTS, make_file
    from tfscale.data import CriteoTSV

    os.makedirs(directory, exist_ok=True)
    text = os.path.join(directory, TEXT)
    make_file(text, lines, exponents=tuple(1 + (e - 1) * FLATTER for e in ZIPF_EXPONENTS))
    names = _column_names()
    types = {name: pa.int64() for name in names[:14]}
    types.update({name: pa.string() for name in names[14:]})
    table = pacsv.read_csv(text, pacsv.ReadOptions(column_names=names),
                           pacsv.ParseOptions(delimiter="\t", quote_char=False),
                           pacsv.ConvertOptions(column_types=types, strings_can_be_null=True))
    pq.write_table(table, os.path.join(directory, PARQUET))
    pq.write_table(table.slice(0, TEST_ROWS), os.path.join(directory, TEST_PARQUET))
    with open(text, "rb") as source, open(os.path.join(directory, TEST_TEXT), "wb") as test:
        test.writelines(line for _, line in zip(range(TEST_ROWS), source))
    vocabulary = CriteoTSV.build_vocabulary(text, min_count=10)
    vocabulary.save(os.path.join(directory, VOCABULARY))
    print(f"{lines:,} lines, {sum(vocabulary.distinct.values()):,} distinct values, "
          f"{sum(len(v) for v in vocabulary.categorical.values()):,} seen 10 times or more")


def _column_names():
    from tfscale.data.criteo import CATEGORICAL_NAMES, DENSE_NAMES

    return ["label", *DENSE_NAMES, *CATEGORICAL_NAMES]


# ----------------------------------------------------------------------------- readers

def _path(name):
    return os.path.join(FLAGS.dir, name)


def _source_rows(source_class, path, encoding):
    options = ({"hash_buckets": HASH_BUCKETS} if encoding == "hash"
               else {"vocabulary": _path(VOCABULARY)})
    source = source_class(path, test_fraction=None, **options)
    return sum(len(labels) for _, labels in
               source.train_batches(FLAGS.batch_size).as_numpy_iterator())


def reader_cases():
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    from tfscale.data import CriteoParquet, CriteoTSV

    def read_csv():
        names = _column_names()
        return pacsv.read_csv(
            _path(TEXT), pacsv.ReadOptions(column_names=names),
            pacsv.ParseOptions(delimiter="\t", quote_char=False),
            pacsv.ConvertOptions(column_types={n: pa.binary() for n in names[14:]})).num_rows

    return {
        "parquet_hash": lambda: _source_rows(CriteoParquet, _path(PARQUET), "hash"),
        "pyarrow_read_table": lambda: pq.read_table(_path(PARQUET)).num_rows,
        "parquet_vocabulary": lambda: _source_rows(CriteoParquet, _path(PARQUET), "vocabulary"),
        "tsv_hash": lambda: _source_rows(CriteoTSV, _path(TEXT), "hash"),
        "pyarrow_read_csv": read_csv,
        "tsv_vocabulary": lambda: _source_rows(CriteoTSV, _path(TEXT), "vocabulary"),
    }


def timed(function):
    """(rows, wall seconds, this process's CPU seconds, other processes' CPU seconds, this
    process's {system CPU seconds, minor page faults})."""
    import resource

    from benchmarks.timing import OtherProcessesCPU

    others = OtherProcessesCPU()
    before = resource.getrusage(resource.RUSAGE_SELF)
    cpu, begun = time.process_time(), time.perf_counter()
    rows = function()
    wall, cpu = time.perf_counter() - begun, time.process_time() - cpu
    after = resource.getrusage(resource.RUSAGE_SELF)
    kernel = {"system_cpu_seconds": after.ru_stime - before.ru_stime,
              "minor_page_faults": after.ru_minflt - before.ru_minflt}
    return rows, wall, cpu, others.seconds(), kernel


def run_alternating(cases, rounds, part):
    """Every case of `cases` (name -> function giving rows) `rounds` times, alternating; one
    JSON line per run."""
    import tensorflow as tf

    tf.config.experimental.enable_op_determinism()  # as launch.train runs
    allocator_flag.apply()
    names = list(cases)
    for name in names:  # warm-up: imports, tracing, the file cache
        cases[name]()
    for round_index in range(rounds):
        for name in names if round_index % 2 == 0 else names[::-1]:
            load = os.getloadavg()[0]
            rows, wall, cpu, others, kernel = timed(cases[name])
            record({"part": part, "case": name, "round": round_index, "rows": rows,
                    "seconds": wall, "rows_per_second": rows / wall, "cpu_seconds": cpu,
                    "other_processes_cpu_seconds": others, "load_average_1min_before": load,
                    "load_average_1min_after": os.getloadavg()[0],
                    "allocator_pad_mib": FLAGS.allocator_pad_mib, **kernel})


# ----------------------------------------------------------------------------- stages

def stage_cases():
    """name -> function giving rows, for passes stopping after each stage (module doc). The
    stages every tree has (so that --old_tree measures the same passes) and, in a tree with
    text blocks, theirs."""
    import inspect

    import numpy as np
    import tensorflow as tf

    from tfscale.data import CriteoParquet, CriteoTSV
    from tfscale.data.parquet import Side
    from tfscale.data.parquet_columns import check_rows
    from tfscale.data.text_lines import LineParser, LineSelection, parsed_chunks, split_fields

    parquet = CriteoParquet(_path(PARQUET), test_fraction=None, hash_buckets=HASH_BUCKETS)
    text = CriteoTSV(_path(TEXT), test_fraction=None, hash_buckets=HASH_BUCKETS)
    reader, side = parquet._train, Side()
    ranges = reader.files.ranges()
    chunk_rows = 65536

    def count(dataset):
        """Rows of a dataset of raw columns, (features, labels) or tensors of rows."""
        def rows(element):
            labels = (element["labels"] if isinstance(element, dict) else
                      element[1] if isinstance(element, tuple) else element)
            return int(tf.shape(labels)[0])

        return sum(rows(element) for element in dataset)

    def decoded_blocks(row_range):
        """The Arrow tables of a range's blocks, as the tree's reader decodes them: block by
        block, or (a tree reading whole row groups) the row group sliced."""
        if "block_rows" in inspect.signature(reader.files.read).parameters:
            return [table for _, table in reader.files.read(row_range, chunk_rows)]
        table = reader.files.read(row_range)
        return [table.slice(begin, chunk_rows) for begin in range(0, table.num_rows, chunk_rows)]

    def parquet_1_decode():
        return sum(block.num_rows for r in ranges for block in decoded_blocks(r))

    def parquet_2_checks():
        return sum(len(check_rows(block, reader.files.column_map, True).labels)
                   for r in ranges for block in decoded_blocks(r))

    def parquet_3_raw_columns():
        return count(reader.raw_blocks(side, ranges, *_encoder_if_taken(reader.raw_blocks,
                                                                         parquet)))

    def parquet_4_encoded():
        return count(parquet._rows(reader, side, ranges))

    def parquet_5_batches():
        return count(parquet.train_batches(FLAGS.batch_size))

    files = text._train
    chunk = 4096

    def line_chunks(finish):
        return files.chunks(np.arange(1), chunk).map(finish, num_parallel_calls=tf.data.AUTOTUNE)

    def lines_1_decode():
        return count(line_chunks(lambda file_index, first, lines: lines))

    def lines_2_split():
        return count(line_chunks(lambda file_index, first, lines: split_fields(
            lines, "\t", files.layout.num_fields)[0]))

    parser = LineParser(text.FORMAT, files)

    def lines_3_checked():
        return count(parsed_chunks(files, parser, LineSelection(), np.arange(1), chunk))

    def text_4_encoded():
        return count(text._rows(files, LineSelection(), np.arange(1)))

    def text_5_batches():
        return count(text.train_batches(FLAGS.batch_size))

    cases = {name: function for name, function in locals().items()
             if name.startswith(("parquet_", "lines_", "text_")) and callable(function)}
    try:
        from tfscale.data import handover
        from tfscale.data.text_blocks import TextBlocks
        from tfscale.data.vocabulary_pass import Piece, blocks
    except ImportError:  # a tree whose text readers parse lines with tf.data only
        return cases
    text_blocks = TextBlocks(text.FORMAT, files, False, "missing")

    def text_blocks_of(work):  # blocks() yields the block last, its line count before it
        return sum(work(item[-1]) for item in blocks(Piece(0, files.paths[0], 0, None), 0))

    def blocks_1_decode():
        return text_blocks_of(lambda block: text_blocks._parsed(block).num_rows)

    def blocks_2_checks():
        return text_blocks_of(lambda block: len(check_rows(
            text_blocks._parsed(block), text_blocks._column_map, True).labels))

    def blocks_3_raw_columns():
        encoder = _encoder_if_taken(text_blocks.elements, text)
        return count(handover.raw_columns(
            lambda: text_blocks.elements(LineSelection(), np.arange(1), *encoder), text.FORMAT))

    cases.update(blocks_1_decode=blocks_1_decode, blocks_2_checks=blocks_2_checks,
                 blocks_3_raw_columns=blocks_3_raw_columns)
    try:
        from tfscale.data.line_kernel import LineKernel
    except ImportError:  # a tree whose text readers parse every block with pyarrow
        return cases
    encoder = text.preprocessing.encoder  # a tree's kernel takes its rule, or the encoder
    kernel = LineKernel(text.FORMAT, files.layout, encoder.kernel_rule() if "rule" in
                        inspect.signature(LineKernel).parameters else encoder)

    def all_lines(block):
        return np.ones(block.count(b"\n") + (0 if block.endswith(b"\n") else 1), bool)

    def kernel_1_encoded():
        return text_blocks_of(lambda block: len(kernel.element(block, all_lines(block))["labels"]))

    cases.update(kernel_1_encoded=kernel_1_encoded)
    try:
        from tfscale.data.value_counts import ValueCounts, fingerprint_rule
    except ImportError:  # a tree whose vocabulary pass parses blocks with pyarrow
        return cases
    from tfscale.data.vocabulary_pass import DEFAULT_MEMORY_MB, counting_limits

    fields = len(text.FORMAT.categorical_names)
    counting_kernel = LineKernel(text.FORMAT, files.layout, fingerprint_rule(fields))

    def vocabulary_1_read():
        return text_blocks_of(
            lambda block: len(counting_kernel.rows(block, all_lines(block)).labels))

    def vocabulary_2_counted():
        max_values, width = counting_limits(DEFAULT_MEMORY_MB, 10)
        counts = ValueCounts(fields, gate=10, max_values=max_values, sketch_width=width)

        def counted(block):
            rows = counting_kernel.rows(block, all_lines(block))
            counts.add_keys(rows.ids.view(np.uint64),
                            lambda origins: counting_kernel.values_at(block, rows, origins))
            return len(rows.labels)

        return text_blocks_of(counted)

    cases.update(vocabulary_1_read=vocabulary_1_read, vocabulary_2_counted=vocabulary_2_counted)
    return cases


def _encoder_if_taken(method, source):
    """(source's encoder,) when the readers' `method` takes one (they encode in their threads),
    else () (a tree whose readers hand strings to TensorFlow)."""
    import inspect

    return ((source.preprocessing.encoder,)
            if "encoder" in inspect.signature(method).parameters else ())


# ----------------------------------------------------------------------------- training

EPOCH_LINE = re.compile(r"trained (\d+) steps in ([\d.]+) s \(([\d,]+) examples/s\)")


def train_case(name):
    """The epoch line's (examples/s, steps, seconds) of launch.train on `name`'s data."""
    common = [sys.executable, "-m", "launch.train", f"--batch_size={FLAGS.batch_size}",
              "--epochs=1", "--logdir=none", "--checkpoint_dir=none", "--log_every_steps=1000"]
    if name == "synthetic":
        args = ["--data=synthetic", f"--train_rows={FLAGS.lines}", f"--test_rows={TEST_ROWS}"]
    else:
        train, test = (TEXT, TEST_TEXT) if name == "tsv" else (PARQUET, TEST_PARQUET)
        args = ["--data=criteo", f"--train_path={_path(train)}", f"--test_path={_path(test)}",
                f"--vocabulary={_path(VOCABULARY)}"]
    done = subprocess.run(common + args, capture_output=True, text=True)
    found = EPOCH_LINE.search(done.stdout)
    if done.returncode or not found:
        raise RuntimeError(f"{name}: {done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return float(found.group(3).replace(",", "")), int(found.group(1)), float(found.group(2))


def run_training(rounds):
    from benchmarks.timing import OtherProcessesCPU

    names = ["synthetic", "tsv", "synthetic", "parquet"]
    for round_index in range(rounds):
        for name in names if round_index % 2 == 0 else names[::-1]:
            load, others = os.getloadavg()[0], OtherProcessesCPU()
            rate, steps, seconds = train_case(name)
            record({"part": "train", "case": name, "round": round_index,
                    "examples_per_second": rate, "steps": steps, "epoch_seconds": seconds,
                    "other_processes_cpu_seconds": others.seconds(),
                    "load_average_1min_before": load,
                    "load_average_1min_after": os.getloadavg()[0]})


def run_vocabulary(rounds):
    """benchmarks.vocab_pass's `reader` and `pass` cases on the TSV file, alternating."""
    from benchmarks.timing import OtherProcessesCPU

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    script = os.path.join(root, "benchmarks", "vocab_pass.py")
    given = os.environ.get("PYTHONPATH")  # run_trees': --old_tree's tfscale first for "before"
    python_path = f"{given}:{root}" if given else root
    for round_index in range(rounds):
        for case in ("reader", "pass") if round_index % 2 == 0 else ("pass", "reader"):
            load, others = os.getloadavg()[0], OtherProcessesCPU()
            done = subprocess.run([sys.executable, script, f"--case={case}",
                                   f"--path={_path(TEXT)}", "--min_count=10",
                                   f"--allocator_pad_mib={FLAGS.allocator_pad_mib}"],
                                  cwd=root,
                                  env=dict(os.environ, PYTHONPATH=python_path),
                                  capture_output=True, text=True)
            found = [json.loads(line[line.index("{"):]) for line in done.stdout.splitlines()
                     if '"case"' in line]
            if done.returncode or not found:
                raise RuntimeError(f"{case}: {done.stdout[-2000:]}\n{done.stderr[-2000:]}")
            result = found[0]
            record({"part": "vocabulary", "case": case, "round": round_index,
                    "rows": result["rows"], "seconds": result["seconds"],
                    "rows_per_second": result["rows"] / result["seconds"],
                    "peak_rss_mb": result["peak_rss_mb"], "kept": result["kept"],
                    "allocator_pad_mib": FLAGS.allocator_pad_mib,
                    "other_processes_cpu_seconds": others.seconds(),
                    "load_average_1min_before": load,
                    "load_average_1min_after": os.getloadavg()[0]})


# ----------------------------------------------------------------------------- results

def machine():
    listed = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    fields = dict(line.split(":", 1) for line in listed.splitlines() if ":" in line)
    return {"cpu": fields.get("Model name", "").strip(), "cores": os.cpu_count(),
            "cpu_flags": fields.get("Flags", "").strip()}


def record(line):
    line = dict(line, benchmark="input_path", date=time.strftime("%Y-%m-%d"),
                command="python -m benchmarks.input_path " + " ".join(sys.argv[1:]),
                machine=machine(), file_lines=FLAGS.lines, batch_size=FLAGS.batch_size,
                tree=FLAGS.tree, note=FLAGS.note)
    with open(FLAGS.results, "a") as stream:
        stream.write(json.dumps(line) + "\n")
    shown = {k: (round(v) if isinstance(v, float) and v > 100 else v) for k, v in line.items()
             if k in ("tree", "case", "round", "rows_per_second", "cpu_seconds", "peak_rss_mb",
                      "examples_per_second", "load_average_1min_before")}
    print(json.dumps(shown), flush=True)


def run_trees(part, rounds):
    """`part` of this tree ("after") and of --old_tree ("before"), each round in a process of
    its own per tree, the order alternating. "before" imports --old_tree's `tfscale` and this
    tree's benchmarks (benchmarks.old_tree)."""
    from benchmarks import old_tree

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with old_tree.python_path(FLAGS.old_tree, root) as before:
        trees = [("after", root), ("before", before)]
        for round_index in range(rounds):
            for label, path in trees if round_index % 2 == 0 else trees[::-1]:
                command = [sys.executable, os.path.abspath(__file__), f"--part={part}",
                           "--rounds=1", f"--tree={label}", f"--dir={FLAGS.dir}",
                           f"--results={FLAGS.results}", f"--batch_size={FLAGS.batch_size}",
                           f"--note={FLAGS.note}",
                           f"--allocator_pad_mib={FLAGS.allocator_pad_mib}"]
                subprocess.run(command, check=True, cwd=root,
                               env=dict(os.environ, PYTHONPATH=path))


def _median(values):
    import statistics

    return statistics.median(values) if values else float("nan")


def _rounds(lines):
    """The rounds of `lines` (in file order) as dicts case -> line: a round ends where a case
    comes again or the tree changes (one process runs each case once a round)."""
    rounds, current = [], {}
    for line in lines:
        if line["case"] in current or (current and
                                       next(iter(current.values()))["tree"] != line["tree"]):
            rounds.append(current)
            current = {}
        current[line["case"]] = line
    return rounds + ([current] if current else [])


def report(path):
    """Markdown tables of the results file `path` (every date in it)."""
    lines = [json.loads(line) for line in open(path)]
    lines = [line for line in lines if not line["note"].startswith("discarded")
             and FLAGS.report_note in line["note"]]
    by = {}
    for line in lines:
        by.setdefault((line["part"], line["tree"], line["case"]), []).append(line)
    if any(part == "readers" for part, _, _ in by):
        print("| tree | case | runs | rows/s (median) | CPU s (median) | rows per CPU s | "
              "cores at 5M rows/s |\n|---|---|---:|---:|---:|---:|---:|")
        for (part, tree, case), runs in sorted(by.items()):
            if part != "readers":
                continue
            per_cpu = _median([r["rows"] / r["cpu_seconds"] for r in runs])
            print(f"| {tree} | {case} | {len(runs)} | "
                  f"{_median([r['rows_per_second'] for r in runs]):,.0f} | "
                  f"{_median([r['cpu_seconds'] for r in runs]):.2f} | {per_cpu:,.0f} | "
                  f"{5e6 / per_cpu:.1f} |")
        print("\nRatios of rows/s in the same process and round (median, range):\n")
        print("| tree | ratio | median | range |\n|---|---|---:|---:|")
        pairs = [("parquet_hash", "pyarrow_read_table"),
                 ("parquet_vocabulary", "pyarrow_read_table"),
                 ("tsv_hash", "pyarrow_read_csv"), ("tsv_vocabulary", "pyarrow_read_csv")]
        rounds = _rounds([line for line in lines if line["part"] == "readers"])
        for tree in sorted({line["tree"] for line in lines if line["part"] == "readers"}):
            for ours, theirs in pairs:
                ratios = [pick[ours]["rows_per_second"] / pick[theirs]["rows_per_second"]
                          for pick in rounds if pick[ours]["tree"] == tree
                          and ours in pick and theirs in pick]
                if ratios:
                    print(f"| {tree} | {ours} / {theirs} | {_median(ratios):.2f} | "
                          f"{min(ratios):.2f}-{max(ratios):.2f} |")
    if any(part == "stages" for part, _, _ in by):
        print("\nStages (CPU seconds of a pass over the file stopping after the stage, median):\n")
        print("| case | " + " | ".join(sorted({t for p, t, _ in by if p == "stages"})) +
              " |\n|---|---:|---:|")
        cases = sorted({c for p, _, c in by if p == "stages"})
        for case in cases:
            cells = [by.get(("stages", tree, case)) for tree in
                     sorted({t for p, t, _ in by if p == "stages"})]
            print(f"| {case} | " + " | ".join(
                "" if runs is None else f"{_median([r['cpu_seconds'] for r in runs]):.2f} "
                f"({_median([r['rows_per_second'] for r in runs]):,.0f} rows/s)"
                for runs in cells) + " |")
    vocabulary = [line for line in lines if line["part"] == "vocabulary"]
    if vocabulary:
        print("\n| run | tree | reader rows/s | pass rows/s | pass / reader | "
              "peak MiB reader, pass |\n|---|---|---:|---:|---:|---:|")
        for index, pick in enumerate(_rounds(vocabulary)):
            reader, counted = pick["reader"], pick["pass"]
            print(f"| {index + 1} | {reader['tree']} | {reader['rows_per_second']:,.0f} | "
                  f"{counted['rows_per_second']:,.0f} | "
                  f"{counted['rows_per_second'] / reader['rows_per_second']:.2f} | "
                  f"{reader['peak_rss_mb']:,}, {counted['peak_rss_mb']:,} |")
    train = [line for line in lines if line["part"] == "train"]
    if train:
        print("\n| run | case | examples/s | x the synthetic runs beside it | epoch s | "
              "load before |\n|---|---|---:|---:|---:|---:|")
        for index, line in enumerate(train):
            beside = [other["examples_per_second"] for other in train[max(0, index - 1):index + 2]
                      if other["case"] == "synthetic" and other is not line]
            ratio = ("" if line["case"] == "synthetic" or not beside else
                     f"{line['examples_per_second'] / (sum(beside) / len(beside)):.2f}")
            print(f"| {index + 1} | {line['case']} | {line['examples_per_second']:,.0f} | "
                  f"{ratio} | {line['epoch_seconds']:.1f} | "
                  f"{line['load_average_1min_before']:.1f} |")
        medians = {case: _median([line["examples_per_second"] for line in train
                                  if line["case"] == case]) for case in ("synthetic", "tsv",
                                                                         "parquet")}
        print("\nMedians: " + ", ".join(f"{case} {rate:,.0f}" for case, rate in medians.items())
              + f"; tsv {medians['tsv'] / medians['synthetic']:.2f}x and parquet "
              f"{medians['parquet'] / medians['synthetic']:.2f}x the synthetic data's")


def main(argv):
    del argv
    if FLAGS.report:
        report(FLAGS.results)
    elif FLAGS.old_tree and FLAGS.part != "train":
        run_trees(FLAGS.part, FLAGS.rounds)
    elif FLAGS.make_files:
        make_files(FLAGS.make_files, FLAGS.lines)
    elif FLAGS.part == "readers":
        run_alternating(reader_cases(), FLAGS.rounds, "readers")
    elif FLAGS.part == "stages":
        run_alternating(stage_cases(), FLAGS.rounds, "stages")
    elif FLAGS.part == "vocabulary":
        run_vocabulary(FLAGS.rounds)
    else:
        run_training(FLAGS.rounds)


if __name__ == "__main__":
    app.run(main)
