"""The documentation holds together: every relative link in README.md and docs/ leads to a file,
every launcher flag in README.md's example commands exists, and README.md stays an entry point
of at most 250 lines. No TensorFlow in this process (the launchers' --helpfull runs in their own)."""

import functools
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MAX_README_LINES = 250
LAUNCHERS = ("train", "predict", "export", "build_vocab")

FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.M | re.S)
INLINE_CODE = re.compile(r"`[^`\n]*`")
# [text](target) and ![alt](target); the target ends at whitespace or the closing bracket
# (an optional "title" after a space is left out).
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+[\"'][^)]*)?\)")
LAUNCH = re.compile(r"(?:^|[\s/'\"])-m\s+launch\.(" + "|".join(LAUNCHERS) + r")\b")
FLAG = re.compile(r"(?<![\w-])--([A-Za-z][\w-]*)")
DEFINED = re.compile(r"^\s*--(\[no\])?([\w-]+):", re.M)


def markdown_files():
    return [README] + sorted((ROOT / "docs").rglob("*.md"))


def relative_links(text):
    """The link targets of `text` outside code, that are paths in this repository."""
    prose = INLINE_CODE.sub("", FENCE.sub("", text))
    for target in LINK.findall(prose):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("#"):
            continue  # http(s), mailto, ...; an anchor in the same page
        yield target


def broken_links(path):
    """(target, resolved path) of each relative link in markdown file `path` that leads
    nowhere."""
    broken = []
    for target in relative_links(path.read_text(encoding="utf-8")):
        file_part = target.split("#", 1)[0].split("?", 1)[0]
        resolved = (path.parent / file_part).resolve()
        if not resolved.exists():
            broken.append((target, resolved))
    return broken


def test_the_link_check_catches_a_broken_link(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("[ok](page.md) [gone](missing.md#part) ![plot](img/none.png) "
                    "[web](https://example.com/x.md) [here](#anchor) `[code](nope.md)`\n"
                    "```\n[in a block](nope.md)\n```\n")
    assert [target for target, _ in broken_links(page)] == ["missing.md#part", "img/none.png"]


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path):
    broken = broken_links(path)
    assert not broken, f"{path.relative_to(ROOT)}: links to missing files: " + ", ".join(
        f"{target} ({resolved})" for target, resolved in broken)


def code_blocks(text):
    return [block.group(0) for block in FENCE.finditer(text)]


def launcher_commands(text):
    """(launcher, flags) of each command in `text`'s fenced code blocks that runs a launcher:
    the --flags after `-m launch.<name>` on its (backslash-joined) line, comments included."""
    commands = []
    for block in code_blocks(text):
        for line in block.replace("\\\n", " ").splitlines():
            match = LAUNCH.search(line)
            if match:
                commands.append((match.group(1), FLAG.findall(line[match.end():])))
    return commands


@functools.lru_cache(maxsize=None)
def defined_flags(launcher):
    """({flag name}, {boolean flag name}) that `python -m launch.<launcher> --helpfull` lists."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    result = subprocess.run([sys.executable, "-m", f"launch.{launcher}", "--helpfull"], cwd=ROOT,
                            env=env, capture_output=True, text=True, timeout=600)
    found = DEFINED.findall(result.stdout)
    assert found, (f"launch.{launcher} --helpfull listed no flags (exit status "
                   f"{result.returncode}):\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}")
    return {name for _, name in found}, {name for no, name in found if no}


def unknown_flags(launcher, flags):
    names, booleans = defined_flags(launcher)
    return [flag for flag in flags
            if flag not in names and not (flag.startswith("no") and flag[2:] in booleans)]


def test_the_flag_check_catches_an_unknown_flag():
    text = ("```\n.venv/bin/horovodrun -np 2 --gloo .venv/bin/python -m launch.train "
            "--batch_size=8 --nodedup_ids \\\n  --no_such_flag  # --nobatch_size\n```\n"
            "`python -m launch.train --inline_code_is_not_checked`\n")
    (command,) = launcher_commands(text)
    assert command == ("train", ["batch_size", "nodedup_ids", "no_such_flag", "nobatch_size"])
    assert unknown_flags(*command) == ["no_such_flag", "nobatch_size"]


def test_readme_commands_use_only_defined_flags():
    commands = launcher_commands(README.read_text(encoding="utf-8"))
    assert {launcher for launcher, _ in commands} == set(LAUNCHERS), commands
    unknown = {f"launch.{launcher}: --{flag}" for launcher, flags in commands
               for flag in unknown_flags(launcher, flags)}
    assert not unknown, f"README.md uses flags no launcher defines: {sorted(unknown)}"


def test_readme_is_an_entry_point():
    lines = len(README.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines (at most {MAX_README_LINES})"
