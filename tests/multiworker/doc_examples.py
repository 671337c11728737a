"""The python blocks of the documentation's pages, run as a reader would copy them: a job of
tests/multiworker/jobs.py, `main(results_path, *pages)`, so that TensorFlow starts once for every
page (tests/test_doc_examples.py reads the results).

The blocks of a page run in order in one namespace of their own (a later block may use an
earlier one's names), in an empty directory of their own, in a fresh Keras session, within
PAGE_SECONDS. A block marked as a fragment (`<!-- fragment: why -->` on the line before its
fence) is compiled, not run. A block's code is compiled under the page's path with the page's
line numbers, so a traceback names the page and the line. RESULTS_PATH gets, after each page,
the JSON list of {"page", "blocks", "fragments", "seconds", "error"} (error: None, or the
failing block's first line and its traceback)."""

import contextlib
import json
import os
import re
import signal
import tempfile
import textwrap
import time
import traceback

PAGE_SECONDS = 60
# ```python at any indentation (a block in a list item) up to the closing fence at the same one.
BLOCK = re.compile(r"^([ \t]*)```python[ \t]*\n(.*?)^\1```[ \t]*$", re.M | re.S)
FRAGMENT = re.compile(r"<!--\s*fragment:(.*?)-->\s*$")


def python_blocks(text):
    """[(first code line, code, fragment reason or None)] of the ```python blocks of `text`
    (markdown); the reason is that of a `<!-- fragment: reason -->` on the line before the
    fence (an empty reason stays "")."""
    blocks = []
    for match in BLOCK.finditer(text):
        fence_line = text.count("\n", 0, match.start()) + 1
        before = text[:match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = FRAGMENT.search(before)
        code = textwrap.dedent(match.group(2))
        blocks.append((fence_line + 1, code, marker.group(1).strip() if marker else None))
    return blocks


def run_page(path, blocks):
    """Runs `blocks` (python_blocks of page `path`) in one namespace in the current directory.
    Returns None, or (first line of the failing block, its traceback)."""
    namespace = {"__name__": "__main__"}
    for line, code, fragment in blocks:
        try:
            # Blank lines before the code: tracebacks give the page's own line numbers.
            compiled = compile("\n" * (line - 1) + code, path, "exec")
            if fragment is None:
                exec(compiled, namespace)  # noqa: S102 (the documentation's own code)
        except BaseException:  # noqa: B036 (any failure of a block is the page's result)
            return line, traceback.format_exc()
    return None


class PageTimeout(Exception):
    pass


@contextlib.contextmanager
def time_limit(seconds):
    """Raises PageTimeout in the main thread when the body runs longer than `seconds`."""
    def expired(signum, frame):
        raise PageTimeout(f"the page ran longer than {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def main(results_path, *pages):
    import keras

    results = []
    start_dir = os.getcwd()
    for page in pages:
        with open(page, encoding="utf-8") as f:
            blocks = python_blocks(f.read())
        keras.backend.clear_session()  # names counted afresh, the float32 dtype policy
        started = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="doc-page-") as directory:
            os.chdir(directory)
            try:
                with time_limit(PAGE_SECONDS):
                    error = run_page(page, blocks)
            except PageTimeout:
                error = (None, traceback.format_exc())
            finally:
                os.chdir(start_dir)
        results.append({"page": page, "blocks": len(blocks),
                        "fragments": sum(fragment is not None for *_, fragment in blocks),
                        "seconds": round(time.monotonic() - started, 1),
                        "error": error})
        print(f"{page}: {'failed' if error else 'ran'} in {results[-1]['seconds']} s", flush=True)
        with open(results_path, "w") as f:
            json.dump(results, f, indent=1)
    return 0
