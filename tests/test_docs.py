"""The documentation holds together: every relative link in README.md and docs/ leads to a file,
every option of their command lines (launchers, benchmarks, scripts, examples, tfscale.run) is
one the program defines, an enum's value one of its choices, README.md stays an entry point (at
most 120 lines of at most 100 characters), the documentation site builds with warnings as errors
(`mkdocs build --strict`: links, anchors, the API reference), the API reference covers every
public name, README.md's headline table and docs/concepts.md's compatibility tables are what
their scripts write from the results files and the library, and no page speaks of how it was
developed. No TensorFlow in this process (the programs' help texts and the compatibility script
run in their own)."""

import ast
import html
import importlib.util
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

from tests import flag_definitions
from tests.flag_definitions import PLACEHOLDER, option_problems

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MAX_README_LINES = 120
MAX_README_LINE_CHARS = 100
LAUNCHERS = ("train", "predict", "export", "build_vocab")

FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.M | re.S)
INLINE_CODE = re.compile(r"`[^`\n]*`")
# [text](target) and ![alt](target); the target ends at whitespace or the closing bracket
# (an optional "title" after a space is left out).
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+[\"'][^)]*)?\)")
# A reference-style link's definition: `[label]: target` at the start of a line.
DEFINITION = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?([^\s>]+)", re.M)
# A program a command line runs: `-m launch.X` / `launch/X.py`, the same for benchmarks, scripts
# and examples, `-m tfscale.run` or `tfscale-run`; the options after it up to the next program, a
# shell separator or (for tfscale.run) the script it runs are its own.
PROGRAM = re.compile(
    r"(?:(?<=[\s/'\"])|^)(?:-m\s+((?:launch|benchmarks)\.\w+|tfscale\.run)\b"
    r"|(?:\S*/)?((?:launch|benchmarks|scripts|examples)/\w+\.py)\b|(tfscale-run)\b)")
SEPARATOR = re.compile(r"\|\|?|&&|;")
OPTION = re.compile(r"(?<![\w-])(--?)([A-Za-z][\w-]*)(?:=[\"']?([^\s\"'`]*))?")


def markdown_files():
    return [README] + sorted((ROOT / "docs").rglob("*.md"))


def relative_links(text):
    """The link targets of `text` outside code, that are paths in this repository."""
    prose = INLINE_CODE.sub("", FENCE.sub("", text))
    for target in LINK.findall(prose) + DEFINITION.findall(prose):
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
                    "```\n[in a block](nope.md)\n```\n[1]: page.md\n[2]: lost.jsonl\n")
    assert [target for target, _ in broken_links(page)] == ["missing.md#part", "img/none.png",
                                                            "lost.jsonl"]


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path):
    broken = broken_links(path)
    assert not broken, f"{path.relative_to(ROOT)}: links to missing files: " + ", ".join(
        f"{target} ({resolved})" for target, resolved in broken)


def code_blocks(text):
    return [block.group(0) for block in FENCE.finditer(text)]


def program_name(match):
    """`launch.train` for `-m launch.train` and `launch/train.py`; `examples/x.py` and
    `scripts/x.py` stay paths; `tfscale.run` for `tfscale-run`."""
    module, path, console = match.groups()
    if module:
        return module
    if console:
        return "tfscale.run"
    if path.startswith(("launch/", "benchmarks/")):
        return path[:-len(".py")].replace("/", ".")
    return path


def command_lines(text):
    """The (backslash-joined) lines of `text`'s fenced code blocks, and its inline code spans,
    that name a program."""
    lines = [line for block in code_blocks(text)
             for line in block.replace("\\\n", " ").splitlines()]
    lines += [span.strip("`") for span in INLINE_CODE.findall(FENCE.sub("", text))]
    return [line for line in lines if PROGRAM.search(line)]


def program_commands(text):
    """(program, [(option, value or None)]) of each program run in `text`'s command lines
    (fenced, comments included, and inline): the --options after it (for tfscale.run also
    -options, up to the script it runs), each value as written after `=`."""
    commands = []
    for line in command_lines(text):
        matches = list(PROGRAM.finditer(line))
        for match, following in zip(matches, matches[1:] + [None]):
            program = program_name(match)
            span = line[match.end():following.start() if following else len(line)]
            span = SEPARATOR.split(span, 1)[0]
            if program == "tfscale.run":
                span = re.split(r"\S+\.py\b", span, 1)[0]
            options = [(name, value or None) for dashes, name, value in OPTION.findall(span)
                       if dashes == "--" or program == "tfscale.run"]
            commands.append((program, options))
    return commands


def launcher_commands(text):
    """(launcher, flags) of each command in `text` that runs one of LAUNCHERS."""
    return [(program[len("launch."):], [name for name, _ in options])
            for program, options in program_commands(text)
            if program in {f"launch.{launcher}" for launcher in LAUNCHERS}]


def concrete_programs(program):
    """The programs `program` stands for: every script of its directory for a placeholder
    (`examples/X.py`), else itself."""
    if program.endswith(".py") and PLACEHOLDER.match(pathlib.Path(program).stem):
        return [str(p.relative_to(ROOT)) for p in sorted((ROOT / program).parent.glob("*.py"))]
    return [program]


def program_exists(program):
    return (ROOT / (program if program.endswith(".py") else
                    program.replace(".", "/") + ".py")).is_file()


def documented_programs():
    """Every existing program a command line of README.md or docs/ gives options, and
    LAUNCHERS."""
    programs = {f"launch.{launcher}" for launcher in LAUNCHERS}
    for path in markdown_files():
        programs.update(concrete for program, options in program_commands(path.read_text(
            encoding="utf-8")) if options for concrete in concrete_programs(program))
    return tuple(sorted(filter(program_exists, programs)))


def test_the_flag_check_catches_an_unknown_flag():
    text = ("```\n.venv/bin/horovodrun -np 2 --gloo .venv/bin/python -m launch.train "
            "--batch_size=8 --nodedup_ids \\\n  --no_such_flag  # --nobatch_size\n```\n"
            "`python -m launch.train --in_inline_code` and `--alone_is_not_a_command`\n")
    assert launcher_commands(text) == [
        ("train", ["batch_size", "nodedup_ids", "no_such_flag", "nobatch_size"]),
        ("train", ["in_inline_code"])]
    definitions = flag_definitions.read(documented_programs())["launch.train"]
    options = [(name, None) for name in launcher_commands(text)[0][1]] + [("data", "tsv")]
    assert option_problems("launch.train", options, definitions) == [
        "launch.train: --no_such_flag is not defined", "launch.train: --nobatch_size is not "
        "defined", f"launch.train: --data=tsv: 'tsv' is not one of {definitions['flags']['data']}"]


def test_commands_are_split_by_program():
    text = ("```\npython -m tfscale.run -np 4 --network=host -m launch.train --data=avazu "
            "--seed=3 | tail -3\ntfscale-run -np 2 examples/own.py --workdir=DIR --port=9\n"
            "python -m benchmarks.table_scaling --ids=4 && tensorboard --logdir runs\n```\n")
    assert program_commands(text) == [
        ("tfscale.run", [("np", None), ("network", "host")]),
        ("launch.train", [("data", "avazu"), ("seed", "3")]),
        ("tfscale.run", [("np", None)]),
        ("examples/own.py", [("workdir", "DIR"), ("port", "9")]),
        ("benchmarks.table_scaling", [("ids", "4")])]
    definitions = {"flags": {"data": ["criteo", "avazu"], "seed": None, "dedup_ids": None},
                   "booleans": ["dedup_ids"]}
    assert option_problems("launch.train", [("data", "avazu"), ("data", "KIND"),
                                            ("nodedup_ids", None), ("data", "tsv"),
                                            ("nodata", None), ("size", "1")], definitions) == [
        "launch.train: --data=tsv: 'tsv' is not one of ['criteo', 'avazu']",
        "launch.train: --nodata is not defined", "launch.train: --size is not defined"]


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_command_lines_use_only_defined_flags(path):
    """Every option of a program a page's command line runs (launchers, benchmarks, scripts,
    examples, tfscale.run) is one its help lists, an enum's value one of its choices."""
    definitions = flag_definitions.read(documented_programs())
    problems = set()
    for program, options in program_commands(path.read_text(encoding="utf-8")):
        for concrete in concrete_programs(program) if options else []:
            if program_exists(concrete):
                problems.update(option_problems(concrete, options, definitions[concrete]))
            else:
                problems.add(f"{concrete}: no such program")
    problems = sorted(problems)
    assert not problems, f"{path.relative_to(ROOT)}: " + "; ".join(problems)


def test_readme_runs_every_launcher():
    commands = launcher_commands(README.read_text(encoding="utf-8"))
    assert {launcher for launcher, _ in commands} == set(LAUNCHERS), commands


def test_readme_is_an_entry_point():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_README_LINES, (
        f"README.md has {len(lines)} lines (at most {MAX_README_LINES})")
    long = [number for number, line in enumerate(lines, 1) if len(line) > MAX_README_LINE_CHARS]
    assert not long, (f"README.md lines over {MAX_README_LINE_CHARS} characters: {long}")
    text = "\n".join(lines)
    for command in ("make train", "make test"):
        assert f"\n{command} " in text, f"README.md no longer shows `{command}`"


# ----------------------------------------------------------------------------- the site


def python_env():
    return dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]),
        NO_MKDOCS_2_WARNING="1", TF_CPP_MIN_LOG_LEVEL="3")


def test_the_site_builds_with_warnings_as_errors(tmp_path):
    """`mkdocs build --strict` (what `make docs` runs): a broken link or anchor in docs/, a
    link out of docs/ to a file that is not there (scripts/docs_hooks.py), a page missing
    from the navigation or an API reference entry that does not resolve fails it."""
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, env=python_env(), capture_output=True, text=True, timeout=600)
    problems = [line for line in result.stderr.splitlines()
                if line.startswith(("WARNING", "ERROR")) and "Location 'file:" not in line]
    assert result.returncode == 0, "mkdocs build --strict failed:\n" + "\n".join(
        problems or result.stderr.splitlines()[-30:])
    reference = tmp_path / "site" / "reference"
    assert (reference / "optimizers" / "index.html").exists()
    # The reference renders docstrings: they too speak of the product only.
    for page in reference.rglob("*.html"):
        text = re.sub(r"<[^>]+>", " ", re.sub(r"<script.*?</script>", "", page.read_text(
            encoding="utf-8"), flags=re.S))
        found = development_log_wording(html.unescape(text))
        assert not found, f"{page.relative_to(tmp_path)} speaks of its development: {found}"


def module_assignment(module_path, name):
    """The literal value assigned to `name` at the top level of the module file `module_path`
    (read, not imported), or None."""
    tree = ast.parse(module_path.read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return ast.literal_eval(node.value)
    return None


def exported_names(module_path):
    """The names in `__all__` of the module file `module_path` (read, not imported)."""
    return list(module_assignment(module_path, "__all__") or [])


PACKAGE = ROOT / "tfscale"


def public_namespaces():
    """{public namespace: its source file}. Public are: `tfscale`, each of its packages
    (tfscale/*/__init__.py), and each module `tfscale` exports under a name of its own
    (`tfscale.callbacks` is tfscale/training/callbacks.py); a namespace's public names are its
    `__all__`."""
    namespaces = {"tfscale": PACKAGE / "__init__.py"}
    namespaces.update({f"tfscale.{init.parent.name}": init
                       for init in sorted(PACKAGE.glob("*/__init__.py"))})
    lazy = module_assignment(PACKAGE / "__init__.py", "_PUBLIC") or {}
    for name, (module, attribute) in sorted(lazy.items()):
        if attribute is None and f"tfscale.{name}" not in namespaces:
            namespaces[f"tfscale.{name}"] = ROOT / (module.replace(".", "/") + ".py")
    return namespaces


# The page of the API reference that renders a namespace's names: docs/reference/<last part of
# its name>.md, but for these.
PAGES = {"tfscale": "tfscale", "tfscale.initializers": "tfscale"}


def reference_page(namespace):
    return ROOT / "docs" / "reference" / f"{PAGES.get(namespace, namespace.split('.')[-1])}.md"


def public_names(namespace):
    return exported_names(public_namespaces()[namespace])


def test_every_package_declares_its_public_names():
    """Every package declares `__all__` (`[]` for one with nothing public), what its __init__
    binds (imports, definitions, constants) without a leading underscore is in it, and
    `tfscale`'s is what it imports on first use: a public name cannot be left out of the
    reference by being left out of `__all__`."""
    left_out = []
    for namespace, path in public_namespaces().items():
        assert module_assignment(path, "__all__") is not None, (
            f"{path.relative_to(ROOT)} declares no `__all__`")
        declared = set(exported_names(path))
        if namespace == "tfscale":
            assert declared == set(module_assignment(path, "_PUBLIC")), namespace
            continue
        if path.name != "__init__.py":
            continue  # a module: `__all__` picks its public names from its helpers
        bound = set()
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.ImportFrom):
                bound.update(alias.asname or alias.name for alias in node.names)
            elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                bound.add(node.name)
            elif isinstance(node, ast.Assign):
                bound.update(t.id for t in node.targets if isinstance(t, ast.Name))
        left_out += [f"{namespace}.{name}" for name in sorted(bound - declared)
                     if not name.startswith("_")]
    assert not left_out, "names packages bind but leave out of `__all__`: " + ", ".join(left_out)


def classes_users_construct():
    """{class name: [where]} of the tfscale classes that README.md, docs/ (code blocks and
    inline code) and examples/ construct (`Name(`), subclass or import."""
    classes = set()
    for path in PACKAGE.rglob("*.py"):
        classes.update(node.name for node in ast.parse(path.read_text(encoding="utf-8")).body
                       if isinstance(node, ast.ClassDef) and not node.name.startswith("_"))
    texts = {}
    for path in markdown_files():
        text = path.read_text(encoding="utf-8")
        texts[path] = "\n".join(code_blocks(text) + INLINE_CODE.findall(FENCE.sub("", text)))
    texts.update({path: path.read_text(encoding="utf-8")
                  for path in sorted((ROOT / "examples").glob("*.py"))})
    used = {}
    for path, code in texts.items():
        for name in classes:
            if re.search(rf"(?<![\w]){name}\(|\bclass \w+\({name}\)|^\s*from tfscale[\w.]* import "
                         rf"[^\n]*\b{name}\b", code, re.M):
                used.setdefault(name, []).append(str(path.relative_to(ROOT)))
    return used


def test_the_classes_the_docs_construct_are_public():
    public = {name for namespace in public_namespaces() for name in public_names(namespace)}
    private = {name: where for name, where in classes_users_construct().items()
               if name not in public}
    assert not private, ("classes the docs or examples construct that no public namespace "
                         f"exports (add them to their package's `__all__`): {private}")


def test_the_api_reference_covers_every_public_name():
    namespaces = public_namespaces()
    missing = []
    for namespace in namespaces:
        if not public_names(namespace):
            continue  # a package with nothing public
        page = reference_page(namespace)
        text = page.read_text(encoding="utf-8") if page.exists() else ""
        if not text:
            missing.append(f"{namespace} (no page {page.relative_to(ROOT)})")
            continue
        for name in public_names(namespace):
            if f"{namespace}.{name}" in namespaces:
                continue  # a namespace of its own: its page, checked above
            if not re.search(rf"^::: {re.escape(namespace)}\.{re.escape(name)}\s*$", text, re.M):
                missing.append(f"{namespace}.{name} ({page.relative_to(ROOT)})")
    assert not missing, "public names the API reference does not render: " + ", ".join(missing)


def reference_example(package, name):
    """Whether the API reference page shows an example of its own right after `::: package.name`
    (for names whose docstrings live in files this page does not own)."""
    for page in (ROOT / "docs" / "reference").glob("*.md"):
        text = page.read_text(encoding="utf-8")
        match = re.search(rf"^::: {re.escape(package)}\.{re.escape(name)}\s*$(.*?)(?=^:::|\Z)",
                          text, re.M | re.S)
        if match and "```python" in match.group(1):
            return True
    return False


def test_every_public_name_has_a_docstring_and_an_example():
    """What the reference renders for each public name is its docstring (griffe reads the
    source; nothing is imported), with an `Example:` section (or, on the reference page, an
    example right after it)."""
    griffe = pytest.importorskip("griffe")
    loaded = griffe.load("tfscale", search_paths=[str(ROOT)], resolve_aliases=True,
                         resolve_external=False)
    bare, without_example = [], []
    for package in public_namespaces():
        module = loaded if package == "tfscale" else loaded[package[len("tfscale."):]]
        for name in public_names(package):
            member = module[name]
            target = member.final_target if member.is_alias else member
            if target.kind.value in ("attribute", "module"):
                continue  # constants (described by their comment) and packages (their pages)
            docstring = target.docstring.value.strip() if target.docstring else ""
            if not docstring:
                bare.append(f"{package}.{name}")
            elif "Example" not in docstring and not reference_example(package, name):
                without_example.append(f"{package}.{name}")
    assert not bare, "public names without a docstring: " + ", ".join(bare)
    assert not without_example, "public names without an example: " + ", ".join(without_example)


def test_the_index_lists_every_page():
    """docs/README.md (the site's home page) links every other page of docs/, and the results
    pages through their own index, docs/results/README.md."""
    linked = set()
    for index in (ROOT / "docs" / "README.md", ROOT / "docs" / "results" / "README.md"):
        linked |= {(index.parent / target.split("#")[0]).resolve()
                   for target in relative_links(index.read_text(encoding="utf-8"))}
    pages = [p for p in (ROOT / "docs").rglob("*.md")
             if p.name != "README.md" or p.parent != ROOT / "docs"]
    missing = [str(p.relative_to(ROOT)) for p in pages
               if p.resolve() not in linked and p.parent.name != "reference"]
    assert not missing, "pages docs/README.md does not link: " + ", ".join(sorted(missing))


# ----------------------------------------------------------------------------- numbers


def load_script(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_headline_table_is_what_the_results_files_give():
    headline = load_script("headline_table")
    readme = headline.readme_table(README.read_text(encoding="utf-8"))
    assert readme == headline.table(), (
        "README.md's headline table differs from benchmarks/results; run "
        "python scripts/headline_table.py --write")


def test_every_headline_results_file_records_machine_date_and_command():
    headline = load_script("headline_table")
    known = json.loads((ROOT / "benchmarks" / "results" / "provenance.json").read_text())
    for _, _, _, name in headline.HEADLINE:
        assert (ROOT / "benchmarks" / "results" / name).is_file(), name
        entry = known["files"][name]
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", entry["date"]), (name, entry)
        assert entry["command"].strip(), name
        machine = known["machines"][entry["machine"]]
        for field in ("label", "cpu", "cpu_flags", "cores"):
            assert machine[field].strip(), (name, field)


def test_the_compatibility_tables_are_what_the_library_declares():
    result = subprocess.run([sys.executable, "scripts/compatibility_table.py", "--check"],
                            cwd=ROOT, env=python_env(), capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]


# ----------------------------------------------------------------------------- wording

# How the product was developed is not the product: issue numbers, branch and commit names,
# the sessions and people who worked on it. ("round" alone is the butterfly's and the
# benchmarks' word; "this round" and "previous round" are the development log's.)
DEVELOPMENT_LOG = re.compile(
    r"\bissue #?\d+|(?<![\w&/])#\d+\b|\bmain's\b|\bthis branch\b|\bworktree of main\b"
    r"|(?<![\w-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b(?!\.\.\.)"
    r"|\b(?:this|last|next|earlier|previous) session\b|\b(?:this|previous) round\b"
    r"|\bfiled\b|\bhelpers?\b|\bengineer's\b|\bagents?'\b|\bagents?\b",
    re.I)
# Nor is the project's log: goals and targets met or missed, what was fixed or found since,
# what a script was written for, the code before or after a change. Results say what was
# measured against what; limits say what the product does not do.
PROJECT_LOG = re.compile(
    r"\bgoals?\b|\b(?:un)?met targets?\b"
    r"|\btargets?\b[^.;\n]{0,60}?\b(?:(?:not )?met|reached|missed)\b|:\s*\**(?:not )?met\b"
    r"|\b(?:fixed|found) since\b|\bwritten for (?:the )?issue\b|\bthe issue(?:'s)?\b"
    r"|\b(?:before|after) (?:the|this) change\b|\bthe previous (?:version|commit|default)\b"
    r"|\bwhen this was written\b|\bthe old default\b|\bnot done yet\b",
    re.I)
# In the pages a target is always the project's (a batch to scale to is "the batch"); in
# docstrings the word is also a link's, a loss's or a thread's.
TARGET = re.compile(r"\btargets?\b", re.I)
DOCSTRING_SOURCES = ("tfscale", "launch", "benchmarks", "models", "scripts")


def development_log_wording(text, pages=False):
    """The development and project log's words in `text` (outside code blocks); with `pages`,
    also "target"."""
    prose = FENCE.sub("", text)
    patterns = (DEVELOPMENT_LOG, PROJECT_LOG) + ((TARGET,) if pages else ())
    return sorted({match.group(0) for pattern in patterns for match in pattern.finditer(prose)})


def test_the_wording_check_catches_development_log_wording():
    assert development_log_wording(
        "Fixed in issue 48 (#48) at 5dc73fd, main's code, this session, filed by a helper. "
        "After the last round of the butterfly; sha256 6c3952fb3b8f8bbf...; 2026-11-21.") == [
        "#48", "5dc73fd", "filed", "helper", "issue 48", "main's", "this session"]


def test_the_wording_check_catches_project_log_wording():
    text = ("- **Target 1.2x at 1K: met** (1.24x). The goal holds; unmet targets: none. "
            "Fixed since, as the issue asked; 2x faster than before the change and the previous "
            "version. Not done yet.\n- **Row-sparse faster than dense: not met.**\n"
            "Measured 1.12x against PyTorch; the target batch; met less load.\n")
    assert development_log_wording(text) == [
        ": met", ": not met", "Fixed since", "Not done yet", "before the change", "goal",
        "the issue", "the previous version", "unmet targets"]
    assert set(development_log_wording(text, pages=True)) - set(development_log_wording(text)) == {
        "Target", "target", "targets"}


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_development_log_wording(path):
    found = development_log_wording(path.read_text(encoding="utf-8"), pages=True)
    assert not found, f"{path.relative_to(ROOT)} speaks of its development: {found}"


def docstrings(path):
    """(line, docstring) of the module, each class and each function of Python file `path`
    (parsed, not imported)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            docstring = ast.get_docstring(node, clean=False)
            if docstring:
                yield getattr(node, "lineno", 1), docstring


def test_the_docstring_check_reads_every_docstring(tmp_path):
    source = tmp_path / "bench.py"
    source.write_text('"""Two measurements for issue 17."""\n\n\nclass A:\n    """Goal: 2x."""\n'
                      '\n    def f(self):\n        """Before the change."""\n'
                      '        x = "the goal"\n')
    assert [(line, development_log_wording(text)) for line, text in docstrings(source)] == [
        (1, ["issue 17"]), (4, ["Goal"]), (7, ["Before the change"])]


def test_no_development_log_wording_in_docstrings():
    found = [f"{path.relative_to(ROOT)}:{line}: {words}"
             for directory in DOCSTRING_SOURCES for path in sorted((ROOT / directory).rglob("*.py"))
             for line, text in docstrings(path) if (words := development_log_wording(text))]
    assert not found, "docstrings that speak of the development: " + "; ".join(found)
