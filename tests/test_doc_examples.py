"""Every python block of README.md and docs/ runs as written: one job
(tests/multiworker/doc_examples.py) runs each page's blocks in order, in a namespace and an
empty directory of their own, and each page's test here reads its outcome; a block that raises
fails its page's test, naming the page and the block's line. A block marked as a fragment
(`<!-- fragment: why -->` right before its fence) is only compiled: the marker gives its
reason, and there are at most MAX_FRAGMENTS of them."""

import json
import pathlib

import pytest

from tests import grouped_launches
from tests.multiworker import doc_examples

ROOT = pathlib.Path(__file__).resolve().parent.parent
MAX_FRAGMENTS = 2


def pages_with_python():
    """README.md and every page of docs/ that holds a ```python block, as paths from ROOT."""
    pages = [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))
    return [str(page.relative_to(ROOT)) for page in pages
            if doc_examples.python_blocks(page.read_text(encoding="utf-8"))]


PAGES = pages_with_python()
RESULTS = "{dir}/doc_examples.json"
DOC_EXAMPLES = grouped_launches.job("doc-examples", 1, "tests.multiworker.doc_examples", RESULTS,
                                    *(str(ROOT / page) for page in PAGES), timeout=600)


@pytest.fixture(scope="module")
def page_results(launched_jobs):
    """{page (from ROOT): the runner's result} of every page it got to."""
    result = launched_jobs[DOC_EXAMPLES]
    path = launched_jobs.path(RESULTS)
    assert path.exists(), f"the doc examples' job wrote no results:\n{result.output[-5000:]}"
    results = json.loads(path.read_text())
    return {str(pathlib.Path(r["page"]).relative_to(ROOT)): r for r in results}


@pytest.mark.parametrize("page", PAGES)
def test_the_python_blocks_run(page, page_results, launched_jobs):
    assert page in page_results, (
        f"{page}: the doc examples' job ended before it (a page before it hung or crashed the "
        f"process):\n{launched_jobs[DOC_EXAMPLES].output[-5000:]}")
    outcome = page_results[page]
    if outcome["error"]:
        line, trace = outcome["error"]
        where = f"the block at line {line}" if line else "its blocks"
        pytest.fail(f"{page}: {where} failed:\n{trace}", pytrace=False)


def test_fragments_are_rare_and_say_why():
    fragments = [(page, line, reason) for page in PAGES
                 for line, _, reason in doc_examples.python_blocks(
                     (ROOT / page).read_text(encoding="utf-8")) if reason is not None]
    unexplained = [f"{page}:{line}" for page, line, reason in fragments if not reason]
    assert not unexplained, f"fragment markers without a reason: {unexplained}"
    assert len(fragments) <= MAX_FRAGMENTS, (
        f"{len(fragments)} blocks are fragments (at most {MAX_FRAGMENTS}): make them run: "
        f"{[f'{page}:{line}' for page, line, _ in fragments]}")


PAGE = """# A page

<!-- fragment: a skeleton to fill in -->
```python
def step(x):
    ...
```

Text.

```python
value = 2
```

- In a list:

  ```python
  value = value * 3
  raise RuntimeError(f"value {value}")
  ```

```python
never_run = True
```
"""


def test_a_failing_block_is_named_by_page_and_line(tmp_path, monkeypatch):
    blocks = doc_examples.python_blocks(PAGE)
    assert [(line, reason) for line, _, reason in blocks] == [
        (5, "a skeleton to fill in"), (12, None), (18, None), (23, None)]
    monkeypatch.chdir(tmp_path)
    line, trace = doc_examples.run_page("docs/page.md", blocks)
    assert line == 18
    assert 'File "docs/page.md", line 19' in trace and "RuntimeError: value 6" in trace


def test_a_fragment_is_compiled(tmp_path, monkeypatch):
    blocks = doc_examples.python_blocks("<!-- fragment: why -->\n```python\nx = (\n```\n")
    monkeypatch.chdir(tmp_path)
    line, trace = doc_examples.run_page("page.md", blocks)
    assert line == 3 and "SyntaxError" in trace
