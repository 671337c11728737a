"""README.md's headline table, written from the raw results in benchmarks/results/.

Every number in the table is read from a results file (a line of a markdown table, a record of a
.jsonl file) named in HEADLINE below; benchmarks/results/provenance.json says on which machine,
on which date and by which command each file was recorded. `python scripts/headline_table.py`
prints the table; `--write` puts it into README.md between the two markers; `--check` exits 1
when README.md's table differs from what the files give (tests/test_docs.py runs it).
No TensorFlow is imported."""

import argparse
import json
import pathlib
import statistics
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
README = ROOT / "README.md"
BEGIN = "<!-- headline table: written by scripts/headline_table.py from benchmarks/results -->"
END = "<!-- end of headline table -->"


def cell(name, line, column):
    """Cell `column` (0-based, after the leading `|`) of line `line` (1-based) of markdown file
    `name`, a row of a table."""
    row = (RESULTS / name).read_text(encoding="utf-8").splitlines()[line - 1]
    cells = [part.strip() for part in row.strip().strip("|").split("|")]
    return cells[column]


def number(name, line, column):
    """The number in a cell, without bold, thousands commas, a sign or a unit of x or %."""
    return float(cell(name, line, column).strip("*").replace(",", "").rstrip("x%").lstrip("+"))


def record(name, line, **expected):
    """Record `line` (1-based) of .jsonl file `name`; a ValueError unless its fields hold the
    `expected` values (so a line that moved is not read for another run)."""
    run = json.loads((RESULTS / name).read_text(encoding="utf-8").splitlines()[line - 1])
    wrong = {key: run.get(key) for key, value in expected.items() if run.get(key) != value}
    if wrong:
        raise ValueError(f"{name} line {line}: {wrong}, expected {expected}")
    return run


def best_epoch_auc(name, lines):
    """The mean over the runs on `lines` of the test AUC at each run's best validation epoch."""
    aucs = []
    for line in lines:
        run = record(name, line)
        aucs.append(run["epochs"][run["best_epoch"] - 1]["test_auc"])
    return statistics.mean(aucs)


def auc_from_log(name, line):
    """The test AUC of a launcher's `final test AUC 0.7412, ...` line."""
    text = (RESULTS / name).read_text(encoding="utf-8").splitlines()[line - 1]
    return float(text.split("final test AUC", 1)[1].split(",")[0])


def peak_rss_gb(name, lines, **expected):
    """The largest peak RSS, in GB, of the .jsonl records on `lines` (each holding `expected`)."""
    return max(record(name, line, **expected)["peak_rss_bytes"] for line in lines) / 1e9


# Lines 17-20 and 9-12: the four ranks of a dynamic table of 135M and of 3.4M ids.
DYNAMIC_135M = peak_rss_gb("dynamic_memory.jsonl", range(17, 21), tables="dynamic",
                           capacity=135000000, ranks=4)
DYNAMIC_3_4M = peak_rss_gb("dynamic_memory.jsonl", range(9, 13), tables="dynamic",
                           capacity=3400000, ranks=4)
FULL_SIZE = {"scale": 1.0, "optimizer": "adam", "batch_size": 8192}
TUNED = "cowclip_tuned_runs.jsonl"  # lines 5, 19: batch 1,024, no rule, seeds 0 and 1
BASE_1K = best_epoch_auc(TUNED, [5, 19])

# (what, tfscale's number, against, results file); each value computed from the file.
HEADLINE = [
    ("AUC at batch 64K, Adam, sqrt scaling (2 seeds)",
     f"{best_epoch_auc(TUNED, [12, 21]):.4f}", f"{BASE_1K:.4f} at 1K", TUNED),
    ("AUC at batch 64K, CowClip's rule (2 seeds)",
     f"{best_epoch_auc(TUNED, [14, 23]):.4f}", f"{BASE_1K:.4f} at 1K", TUNED),
    ("CAME state, small transformer",
     f"{number('came.md', 13, 2):.3f}x", "Adam 1x", "came.md"),
    # Lines 31 and 55: CAME at its best rate against Adam at its best, batch 4 and 32 (2 seeds).
    ("CAME val. loss, 3K steps, batch 4 / 32, tuned",
     f"{cell('came_sweep.md', 31, 3)} / {cell('came_sweep.md', 55, 3)}", "best Adam",
     "came_sweep.md"),
    # Line 10: CAME by row (RowSparseCAME) at batch 8,192, ratios to Adam by row in the same run.
    ("CAME, DeepFM 8K: state, step",
     f"{number('came_deepfm.md', 10, 4):.3f}x, {number('came_deepfm.md', 10, 2):.2f}x",
     "Adam 1x, 1x", "came_deepfm.md"),
    # Lines 71, 83 (CAME) and 67, 80 (Adam): the best rate's test AUC at batch 8,192 and 32,768.
    ("CAME, DeepFM AUC, 8K / 32K, tuned",
     f"{number('came_sweep.md', 71, 2):.4f} / {number('came_sweep.md', 83, 2):.4f}",
     f"Adam {number('came_sweep.md', 67, 2):.4f} / {number('came_sweep.md', 80, 2):.4f}",
     "came_sweep.md"),
    ("gTop-k, 4M floats, density 0.001, P 2-8",
     f"{min(number('gtopk_collective.md', line, 7) for line in (14, 32, 50)):.0f}-"
     f"{max(number('gtopk_collective.md', line, 7) for line in (14, 32, 50)):.0f}x",
     "dense allreduce 1x", "gtopk_collective.md"),
    ("gTop-k, DeepFM, 4 ranks, density 0.01: AUC",
     f"{auc_from_log('gtopk_convergence.md', 21):.4f}",
     f"allgather {auc_from_log('gtopk_convergence.md', 27):.4f}", "gtopk_convergence.md"),
    ("De-duplicated lookups, P 4: bytes, step",
     f"{cell('hybrid_steps.md', 44, 10)}x, {cell('hybrid_steps.md', 44, 6)}x",
     "plain 1x", "hybrid_steps.md"),
    ("Row-sharded, P 4: tables + Adam per rank",
     f"{cell('sharding_memory.md', 15, 5)} GB", f"{cell('sharding_memory.md', 9, 5)} GB replicated",
     "sharding_memory.md"),
    ("Row-sharded, P 4: bytes per rank",
     f"{cell('sharding_steps.md', 48, 11)}x ({cell('sharding_steps.md', 49, 11)}x bf16)",
     "replicated 1x", "sharding_steps.md"),
    # Lines 23-24: the default (rows caught up) against the dense update; lines 11-12 are an
    # earlier update that left absent rows behind (lazy).
    ("Adam step, 33.8M ids: by row (default)",
     f"{record('table_scaling.jsonl', 23, **FULL_SIZE, embedding_update='row')['median_step_ms']:,.0f} ms",
     f"dense update {record('table_scaling.jsonl', 24, **FULL_SIZE, embedding_update='dense')['median_step_ms']:,.0f} ms",
     "table_scaling.jsonl"),
    ("Dynamic table, 135M ids, P 4: memory per rank", f"{DYNAMIC_135M:.2f} GB",
     f"{DYNAMIC_3_4M:.2f} GB at 3.4M ids", "dynamic_memory.jsonl"),
]


def provenance():
    return json.loads((RESULTS / "provenance.json").read_text(encoding="utf-8"))


def table():
    """The headline table and its notes on the runs and machines, as README.md lines."""
    known = provenance()
    machines, files = known["machines"], known["files"]
    lines = ["| result | tfscale | baseline | run |", "|---|---|---|---|"]
    cited = []
    for what, ours, against, name in HEADLINE:
        entry = files[name]  # a KeyError: the file has no provenance
        if name not in cited:
            cited.append(name)
        lines.append(f"| {what} | {ours} | {against} "
                     f"| [{cited.index(name) + 1}], {machines[entry['machine']]['label']} |")
    lines += ["", f"Machine, date and command of [1]-[{len(cited)}]: "
              "[provenance.json](benchmarks/results/provenance.json);",
              "the machines: [docs/results/](docs/results/README.md#machines).", ""]
    for index, name in enumerate(cited, 1):
        lines.append(f"[{index}]: benchmarks/results/{name}")
    return lines


def readme_table(text):
    """The lines between the markers of README.md's `text`."""
    lines = text.splitlines()
    start, end = lines.index(BEGIN), lines.index(END)
    return lines[start + 1:end]


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="rewrite README.md's table")
    parser.add_argument("--check", action="store_true", help="exit 1 if README.md differs")
    args = parser.parse_args(argv)
    lines = table()
    if args.write:
        text = README.read_text(encoding="utf-8").splitlines()
        start, end = text.index(BEGIN), text.index(END)
        README.write_text("\n".join(text[:start + 1] + lines + text[end:]) + "\n",
                          encoding="utf-8")
    elif args.check:
        if readme_table(README.read_text(encoding="utf-8")) != lines:
            print("README.md's headline table differs from benchmarks/results; run "
                  "python scripts/headline_table.py --write")
            return 1
    else:
        print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
