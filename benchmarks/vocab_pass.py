"""The vocabulary pass against the reader and pyarrow's CSV parser, on one Criteo-format file:

    python -m benchmarks.vocab_pass --make_file=/tmp/criteo2m.txt --lines=2000000
    python -m benchmarks.vocab_pass --path=/tmp/criteo2m.txt --min_count=10 --rounds=2 \\
        --old_tree=/tmp/parent --note="what else ran"
    python -m benchmarks.vocab_pass --report

--make_file writes a realistic test file: label, 13 integer fields (Zipf-drawn, 20% missing, I2
negative at times) and 26 categorical fields of 8 hex digits whose values are Zipf-drawn with
exponents from 1.05 to 4 (some fields of a few dozen values, six of about a million), 3% missing
(40% in C19-C26); 2M lines hold about 7.4M distinct values.

Each round runs every case in a process of its own, one after another (the order alternates
between rounds), each reporting its rows per second of the pass alone (after imports) and its
peak resident memory (VmHWM; every rank's under horovodrun):
  reader       CriteoTSV with hashing, every row of the file read as training batches;
  pyarrow_csv  pyarrow.csv.read_csv of the whole file, all columns as bytes (the ceiling);
  pass         launch's vocabulary pass (tfscale.data.vocabulary_pass) in one process;
  pass_2       the same under `horovodrun -np 2 -H localhost:2 --gloo`;
  tfdata       the reader's tf.data chunks (LineParser, tf.unique_with_counts) counted into the
               same bounded counts: the engine the pass did not choose;
  old          the pass of the tree at --old_tree (another checkout, `git archive`), if given.
Each case's process sets the C allocator as launch.train does (--allocator_pad_mib, 64 by
default; 0 leaves it as it is). One JSON line per case and round is appended to --results with
the machine (lscpu model name and flags, cores), the date, the command and the 1-minute load
average before and after."""

import contextlib
import json
import os
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from absl import app, flags  # noqa: E402

from benchmarks import allocator_flag, old_tree  # noqa: E402
from benchmarks.criteo_file import make_file  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_string("make_file", None, "Write the test file here and stop.")
flags.DEFINE_integer("lines", 2_000_000, "Lines of --make_file.")
flags.DEFINE_string("path", None, "The Criteo-format file to count.")
flags.DEFINE_integer("min_count", 10, "The vocabulary's min count.")
flags.DEFINE_integer("memory_mb", None, "The pass's --memory_mb (default: the pass's default).")
flags.DEFINE_integer("rounds", 2, "Rounds of every case.")
flags.DEFINE_list("cases", ["reader", "pyarrow_csv", "pass", "pass_2", "tfdata", "old"],
                  "Cases to run.")
flags.DEFINE_string("old_tree", None, "A tree of the previous commit: its pass is `old`.")
flags.DEFINE_string("results", "benchmarks/results/vocab_pass.jsonl", "JSON lines file.")
flags.DEFINE_string("note", "", "What else ran on the machine (stored with each line).")
flags.DEFINE_bool("report", False, "Only print the table of --results.")
flags.DEFINE_string("case", None, "Run one case in this process (the script sets it).")

# ----------------------------------------------------------------------------- one case

def peak_rss_mb():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM")) / 1024


def run_case(case):
    """Runs `case` on FLAGS.path in this process; prints its JSON result line."""
    from tfscale import distributed

    allocator_flag.apply()
    distributed.init()
    started = time.monotonic()
    rows, kept = globals()[f"_{case}"]()
    seconds = time.monotonic() - started
    print(json.dumps({"case": case, "rank": distributed.rank(), "rows": rows, "kept": kept,
                      "seconds": round(seconds, 3), "peak_rss_mb": round(peak_rss_mb())}),
          flush=True)


def _reader():
    from tfscale.data import CriteoTSV

    source = CriteoTSV(FLAGS.path, test_fraction=None, hash_buckets=1_000_000)
    rows = 0
    for _, labels in source.train_batches(65536).as_numpy_iterator():
        rows += len(labels)
    return rows, None


def _pyarrow_csv():
    import pyarrow as pa
    import pyarrow.csv as pacsv

    names = ["label"] + [f"I{i}" for i in range(1, 14)] + [f"C{i}" for i in range(1, 27)]
    table = pacsv.read_csv(FLAGS.path, pacsv.ReadOptions(column_names=names),
                           pacsv.ParseOptions(delimiter="\t", quote_char=False),
                           pacsv.ConvertOptions(column_types={n: pa.binary() for n in names}))
    return table.num_rows, None


def _pass():
    from tfscale.data import CriteoTSV

    vocabulary = CriteoTSV.build_vocabulary(FLAGS.path, min_count=FLAGS.min_count,
                                            memory_mb=FLAGS.memory_mb)
    return vocabulary.rows, sum(len(v) for v in vocabulary.categorical.values())


_pass_2 = _pass


def _old():
    from tfscale.data import CriteoTSV  # the --old_tree's

    vocabulary = CriteoTSV.build_vocabulary(FLAGS.path, min_count=FLAGS.min_count)
    return vocabulary.rows, sum(len(v) for v in vocabulary.categorical.values())


def _tfdata():
    import numpy as np

    from tfscale.data import CriteoTSV
    from tfscale.data.text_lines import FileSet, LineParser, LineSelection, parsed_chunks
    from tfscale.data.vocabulary import count_vocabulary

    fmt = CriteoTSV.FORMAT
    files = FileSet(fmt, FLAGS.path)
    raw = parsed_chunks(files, LineParser(fmt, files), LineSelection(), np.arange(1), 16384)
    vocabulary = count_vocabulary(raw, format_name=fmt.name,
                                  categorical_names=fmt.categorical_names,
                                  dense_names=fmt.dense_names, min_count=FLAGS.min_count)
    return vocabulary.rows, sum(len(v) for v in vocabulary.categorical.values())


# ----------------------------------------------------------------------------- rounds

def case_command(case):
    """The command line of `case`: this script by its path (run_in_process puts --old_tree's
    `tfscale` first on the path of `old`)."""
    python = sys.executable
    args = [os.path.abspath(__file__), f"--case={case}", f"--path={FLAGS.path}",
            f"--min_count={FLAGS.min_count}", f"--allocator_pad_mib={FLAGS.allocator_pad_mib}"]
    if FLAGS.memory_mb:
        args.append(f"--memory_mb={FLAGS.memory_mb}")
    if case == "pass_2":
        horovodrun = os.path.join(os.path.dirname(python), "horovodrun")
        return [horovodrun, "-np", "2", "-H", "localhost:2", "--gloo", python] + args
    return [python] + args


def run_in_process(case):
    """The JSON lines of `case` run in processes of its own (one per rank), and the seconds
    from the launch to the end of the last."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    paths = (old_tree.python_path(FLAGS.old_tree, root) if case == "old"
             else contextlib.nullcontext(root))
    with paths as path:
        started = time.monotonic()
        done = subprocess.run(case_command(case), cwd=root, env=dict(os.environ, PYTHONPATH=path),
                              capture_output=True, text=True)
        wall = time.monotonic() - started
    found = [json.loads(line[line.index("{"):]) for line in done.stdout.splitlines()
             if '"case"' in line]
    if done.returncode or not found:
        raise RuntimeError(f"{case} failed ({done.returncode}):\n{done.stdout[-3000:]}\n"
                           f"{done.stderr[-3000:]}")
    return found, wall


def machine():
    listed = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    fields = dict(line.split(":", 1) for line in listed.splitlines() if ":" in line)
    return {"cpu": fields.get("Model name", "").strip(), "cores": os.cpu_count(),
            "cpu_flags": fields.get("Flags", "").strip()}


def loadavg():
    with open("/proc/loadavg") as stream:
        return float(stream.read().split()[0])


def run_rounds():
    about = machine()
    for round_index in range(FLAGS.rounds):
        cases = [c for c in FLAGS.cases if c != "old" or FLAGS.old_tree]
        for case in cases if round_index % 2 == 0 else reversed(cases):
            load_before = loadavg()
            ranks, wall = run_in_process(case)
            seconds = max(r["seconds"] for r in ranks)
            rows = sum(r["rows"] for r in ranks) if case == "pyarrow_csv" else ranks[0]["rows"]
            line = {"case": case, "round": round_index, "ranks": len(ranks), "rows": rows,
                    "kept": ranks[0]["kept"], "seconds": seconds,
                    "rows_per_s": round(rows / seconds), "process_seconds": round(wall, 1),
                    "peak_rss_mb": [r["peak_rss_mb"] for r in ranks],
                    "min_count": FLAGS.min_count, "memory_mb": FLAGS.memory_mb,
                    "file": FLAGS.path, "file_mb": round(os.path.getsize(FLAGS.path) / 1e6),
                    "loadavg_1min_before_after": [load_before, loadavg()],
                    "date": time.strftime("%Y-%m-%d %H:%M"), "machine": about,
                    "command": " ".join(sys.argv), "note": FLAGS.note}
            print(json.dumps({k: line[k] for k in ("case", "round", "rows_per_s", "seconds",
                                                   "peak_rss_mb", "kept",
                                                   "loadavg_1min_before_after")}), flush=True)
            with open(FLAGS.results, "a") as results:
                results.write(json.dumps(line) + "\n")


def report(path):
    """Per min count and case: runs, median rows/s, the median of each round's ratio to that
    round's reader (with the range) and the largest peak memory of any rank."""
    import statistics

    with open(path) as stream:
        lines = [json.loads(line) for line in stream if line.strip()]
    readers = {(r["min_count"], r["date"][:10], r["round"], r["command"]): r["rows_per_s"]
               for r in lines if r["case"] == "reader"}
    groups = {}
    for line in lines:
        groups.setdefault((line["min_count"], line["case"]), []).append(line)
    print("| min count | case | runs | rows/s (median) | x reader (median, range) | "
          "peak RSS MB (max) | values kept |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for (min_count, case), runs in sorted(groups.items()):
        ratios = [r["rows_per_s"] / readers[key] for r in runs
                  if (key := (min_count, r["date"][:10], r["round"], r["command"])) in readers]
        rate = statistics.median(r["rows_per_s"] for r in runs)
        ratio = (f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})"
                 if ratios else "")
        peak = max(max(r["peak_rss_mb"]) for r in runs)
        kept = runs[-1]["kept"]
        print(f"| {min_count} | {case} | {len(runs)} | {rate:,.0f} | {ratio} | {peak:,} | "
              f"{'' if kept is None else f'{kept:,}'} |")


def main(argv):
    del argv
    if FLAGS.make_file:
        make_file(FLAGS.make_file, FLAGS.lines)
    elif FLAGS.case:
        run_case(FLAGS.case)
    elif FLAGS.report:
        report(FLAGS.results)
    else:
        run_rounds()


if __name__ == "__main__":
    app.run(main)
