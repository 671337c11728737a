"""The PYTHONPATH of a benchmark process that measures another tree's code: that tree's `tfscale`
first (a temporary directory holding only a link to it), this tree's benchmarks and the rest
after, so the benchmarks' own modules are always this tree's."""

import contextlib
import os
import tempfile


@contextlib.contextmanager
def python_path(old_tree, root):
    """Yields the PYTHONPATH giving `old_tree`'s tfscale, then `root`'s modules; the link
    directory is removed on leaving."""
    with tempfile.TemporaryDirectory(prefix="benchmark_old_tree_") as directory:
        os.symlink(os.path.join(os.path.abspath(old_tree), "tfscale"),
                   os.path.join(directory, "tfscale"))
        yield f"{directory}:{root}"
