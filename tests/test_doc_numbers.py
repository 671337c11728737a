"""Every measured figure in README.md and the guide pages (docs/*.md; not docs/results/, whose
pages are the write-ups, nor docs/reference/, generated from docstrings) is one that a results
file holds: the raw files in benchmarks/results/ or a results page in docs/results/.

A figure is a number in prose (code blocks, inline code and link targets left out) with a
decimal part (0.7833, 2.09) or a unit: a ratio (1.12x), a percentage, a size (1.34 GB, 12 MB) or
a time (213 ms, 15.2 s, 8 min). Integers without a unit are counts, batch sizes and flag values,
facts of the code, and are not figures. Also not figures, by rule: a ratio of 1 (a baseline
against itself), a version or a name's number (after a product's name: TensorFlow 2.21, CUDA
12.4, Criteo 1TB), an arXiv id, a
value given to a setting (after "=") or a default (before "by default"), a power of ten in
scientific notation (1e-5), a product (5,036 x 8: a ratio is written 1.12x), and a
paper's published numbers (in a sentence or section that names the paper or says "published").
The few remaining facts of the code with a unit are in ALLOWED, each with its reason.

A figure is backed when a results file holds the same number with the same unit, or, for a ratio
or a number with decimals, the same digits without it (a table says its unit in its header); a
unitless decimal also when a raw value of six or more decimals rounds to it.

The machines are described once, on docs/results/README.md, as benchmarks/results/provenance.json
records them, and every results page names its own in a line linking there. No TensorFlow."""

import json
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
RESULTS_DIRS = (ROOT / "benchmarks" / "results", ROOT / "docs" / "results")
RESULTS_SUFFIXES = {".jsonl", ".json", ".md", ".csv", ".txt"}

FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.M | re.S)
INLINE_CODE = re.compile(r"`(?:[^`\n]|\n(?![ \t]*\n))*`")
LINK_TARGET = re.compile(r"\]\([^)\s]*(?:\s+\"[^\"]*\")?\)")
DEFINITION = re.compile(r"^ {0,3}\[[^\]]+\]:.*$", re.M)
COMMENT = re.compile(r"<!--.*?-->", re.S)
# README's headline table is written from the results files by scripts/headline_table.py and
# checked against them by tests/test_docs.py.
HEADLINE = re.compile(r"<!-- headline table.*?<!-- end of headline table -->", re.S)

UNIT = r"x|%|[KMGT]i?B|ms|µs|s|seconds?|min|minutes?|h|hours?"
FIGURE = re.compile(
    r"(?<![\w.,/#+])(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?(?![\d.,]\d|[eE][+\-]?\d)"
    r"(?:\s?(" + UNIT + r")(?![\w]))?")
VERSIONED = re.compile(
    r"(?:Python|TensorFlow|TF|Keras|CUDA|cuDNN|NCCL|Ubuntu|PyTorch|Horovod|pyarrow|NumPy|numpy"
    r"|gcc|GCC|cmake|CMake|version|v|arXiv|glibc|Debian|Linux|MkDocs|Gloo|OpenMPI|MPI|Criteo)\s*$")
SETTING = re.compile(r"(?:=|≈)\s*$")
DEFAULT = re.compile(r"\s*\)?\s*by default\b")
CITES_A_PAPER = re.compile(
    r"\bpapers?\b|\bpublished\b|\bthe authors\b|\bofficial README\b|\barXiv\b", re.I)
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z(\[*])|\n(?=\s*[|#-])|\n\s*\n")

# (page, figure as written): why it is a fact of the code, not a measurement.
ALLOWED = {
    ("docs/architecture.md", "300 s"): "tfscale.distributed.COLLECTIVE_TIMEOUT_SECONDS",
    ("docs/engines.md", "300 s"): "tfscale.distributed.COLLECTIVE_TIMEOUT_SECONDS",
    ("docs/multihost.md", "300 s"): "tfscale.distributed.COLLECTIVE_TIMEOUT_SECONDS",
    ("docs/data.md", "8 MB"): "tfscale.data.text_blocks.BLOCK_BYTES",
    ("docs/data.md", "512 KiB"): "tfscale.data.parquet.SMALL_DICTIONARY_PAGE",
    ("docs/data.md", "1 MB"): "the Parquet writers' default dictionary page limit",
    ("docs/launching.md", "10 seconds"): "tfscale.run_ranks.STOP_GRACE_SECONDS",
    ("docs/came.md", "11x"): "arithmetic of the update: its first step without bias correction",
    ("docs/came.md", "0.1x"): "arithmetic of the update: its first 1-D step",
    ("docs/data.md", "98%"): "the count-min sketch's bound with its 4 rows: 1 - exp(-4)",
    ("docs/data.md", "1.6%"): "the error of 4,096 smallest fingerprints: 1 / sqrt(4,096 - 2)",
}


def guide_pages():
    return [ROOT / "README.md"] + sorted(p for p in (ROOT / "docs").glob("*.md"))


def prose(text):
    """`text` without code, link targets, comments and README's generated headline table."""
    for pattern in (HEADLINE, COMMENT, FENCE, INLINE_CODE, DEFINITION):
        text = pattern.sub(" ", text)
    return LINK_TARGET.sub("]", text)


def sections(text):
    """(heading, body) of each part of `text` under a heading of its own."""
    parts = re.split(r"^(#{1,6} .*)$", text, flags=re.M)
    yield "", parts[0]
    for index in range(1, len(parts), 2):
        yield parts[index], parts[index + 1]


def figures(text):
    """(number, unit) and the figure as written, of each figure in markdown `text` (module
    docstring: what is a figure)."""
    found = []
    for heading, body in sections(prose(text)):
        if CITES_A_PAPER.search(heading):
            continue
        for sentence in SENTENCE_END.split(body):
            if CITES_A_PAPER.search(sentence):
                continue
            for match in FIGURE.finditer(sentence):
                whole, decimals, unit = match.group(1), match.group(2) or "", match.group(3) or ""
                if not decimals and not unit:
                    continue
                before, after = sentence[:match.start()], sentence[match.end():]
                if VERSIONED.search(before) or SETTING.search(before) or DEFAULT.match(after):
                    continue
                if unit == "x" and not match.group(0).endswith(whole + decimals + "x"):
                    unit = ""  # 5,036 x 8: a product, not a ratio
                    if not decimals:
                        continue
                number = whole.replace(",", "") + decimals
                if unit == "x" and float(number) == 1:
                    continue
                found.append(((number, unit), match.group(0).strip()))
    return found


RESULT_NUMBER = re.compile(
    r"(?<![\w.])(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?(?:[eE][+\-]?\d+)?(?:\s?(" + UNIT + r")(?!\w))?")


def held(texts):
    """{(number, unit)} the results files' `texts` hold, a table's numbers with its column's
    unit; raw values with six or more decimals also as their roundings to 1-4 decimals,
    unitless."""
    numbers = set()
    for text in texts:
        for match in RESULT_NUMBER.finditer(text):
            whole, decimals, unit = match.group(1), match.group(2) or "", match.group(3) or ""
            if re.search(r"[eE][+\-]?\d", match.group(0)):
                continue  # 1e-5: a setting
            number = whole.replace(",", "") + decimals
            numbers.add((number, unit))
            numbers.add((number, ""))
            if len(decimals) > 5:
                for places in range(1, 5):
                    numbers.add((f"{float(number):.{places}f}", ""))
        numbers |= table_numbers(text)
    return numbers


# A markdown table's column whose header names its unit in brackets: "median step (ms)".
HEADER_UNIT = re.compile(r"\((" + UNIT + r")\)")
TABLE_RULE = re.compile(r"^\s*\|[\s:|-]*-[\s:|-]*\|\s*$")


def cells(line):
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def table_numbers(text):
    """{(number, unit)} of the numbers in markdown tables' columns whose header names a unit."""
    numbers = set()
    lines = text.splitlines()
    for index, line in enumerate(lines[:-1]):
        if not (line.lstrip().startswith("|") and TABLE_RULE.match(lines[index + 1])):
            continue
        units = [match.group(1) if (match := HEADER_UNIT.search(header)) else None
                 for header in cells(line)]
        for row in lines[index + 2:]:
            if not row.lstrip().startswith("|"):
                break
            for unit, cell in zip(units, cells(row)):
                for match in RESULT_NUMBER.finditer(cell if unit else ""):
                    numbers.add((match.group(1).replace(",", "") + (match.group(2) or ""), unit))
    return numbers


def results_texts():
    return [path.read_text(encoding="utf-8", errors="replace")
            for directory in RESULTS_DIRS for path in sorted(directory.rglob("*"))
            if path.suffix in RESULTS_SUFFIXES]


def unbacked(text, numbers, page=None):
    """The figures of markdown `text` that `numbers` (held by results files) do not hold."""
    return [written for (number, unit), written in figures(text)
            if (number, unit) not in numbers and (page, written) not in ALLOWED
            and not ((unit == "x" or "." in number) and (number, "") in numbers)]


def test_the_number_check_catches_an_unbacked_figure():
    numbers = held(["| run | 0.78334219 | 1.12x | 213 ms | 1,385 ms | 4.46 GB |",
                    "| 1.58 | 12.5 | 95 |\n\n| batch | step (ms) | peak (MB) |\n|---|--:|--:|\n"
                    "| 8,192 | 178 | 9,294 |\n"])
    text = ("The step is 1.12x and 1.13x Adam's, 213 ms (1,385 ms dense); AUC 0.7833 or 0.7835; "
            "tables 4.46 GB, 4.46 MB; 17% more, batch 65,536, 1x, Python 3.11, lr=0.0025, 1e-5; "
            "1.58x, 12.5 s, 12.6 s, 95 ms; 30 s by default, 5,036 x 8; 178 ms, 9,294 MB, "
            "8,192 ms; 1.58-2.4x.\n"
            "`0.9999` in code; [page](results/2.5x.md)\n```\n7.7x\n```\n"
            "The paper reports 80.96% at 64K.\n\n## Published results\n80.90% at 128K.\n")
    assert unbacked(text, numbers) == ["1.13x", "0.7835", "17%", "12.6 s", "95 ms", "8,192 ms",
                                       "2.4x"]


def test_allowed_figures_are_on_their_pages():
    stale = [entry for entry in ALLOWED
             if entry[1] not in [written for _, written in figures(
                 (ROOT / entry[0]).read_text(encoding="utf-8"))]]
    assert not stale, f"ALLOWED entries no page holds any more: {stale}"


@pytest.fixture(scope="module")
def results_numbers():
    return held(results_texts())


@pytest.mark.parametrize("path", guide_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_figure_is_in_a_results_file(path, results_numbers):
    page = str(path.relative_to(ROOT))
    found = unbacked(path.read_text(encoding="utf-8"), results_numbers, page)
    assert not found, (f"{page}: figures no file in benchmarks/results/ or docs/results/ holds "
                       f"(cite the results page, correct or remove them): {found}")


# ----------------------------------------------------------------------------- machines

RESULTS_INDEX = ROOT / "docs" / "results" / "README.md"
MACHINE_LINE = re.compile(r"^Machine: (.+)$", re.M)


def machine_table(index_text):
    """{label: (CPU, CPU flags)} of the table under the results index's "Machines" heading."""
    section = index_text.split("## Machines", 1)[1].split("\n## ", 1)[0]
    rows = [cells(line) for line in section.splitlines() if line.startswith("|")][2:]
    return {row[0]: (row[1], row[2]) for row in rows}


def test_the_results_index_describes_the_machines_of_provenance_json():
    """The machines are described once, on the results index, as provenance.json records them
    (the headline table's runs name them by label)."""
    table = machine_table(RESULTS_INDEX.read_text(encoding="utf-8"))
    known = json.loads((ROOT / "benchmarks" / "results" / "provenance.json").read_text())
    for machine in known["machines"].values():
        assert machine["label"] in table, f"{machine['label']}: not on {RESULTS_INDEX.name}"
        cpu, flags = table[machine["label"]]
        assert cpu == machine["cpu"] and flags.startswith(machine["cpu_flags"]), (machine, cpu,
                                                                                  flags)


@pytest.mark.parametrize("path", sorted(p for p in RESULTS_INDEX.parent.glob("*.md")
                                        if p != RESULTS_INDEX), ids=lambda p: p.name)
def test_every_results_page_names_its_machine(path):
    labels = machine_table(RESULTS_INDEX.read_text(encoding="utf-8"))
    line = MACHINE_LINE.search(path.read_text(encoding="utf-8"))
    assert line and any(f"[{label}](README.md#machines)" in line.group(1) for label in labels), (
        f"{path.name}: no line 'Machine: [label](README.md#machines)' with a label of "
        f"{sorted(labels)}")
