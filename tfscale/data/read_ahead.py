"""Work on the items of a stream done ahead in threads and delivered in order: how the Parquet
reader checks and converts blocks of rows while TensorFlow encodes the ones before them.

Arrow's kernels and numpy release the GIL, so a few threads keep both cores busy; the order of
the results, and the first error, are those of the items."""

import collections
import concurrent.futures
import os


def default_workers():
    """Threads that work ahead: the cores, at most 4."""
    return max(1, min(4, os.cpu_count() or 1))


def ordered_ahead(function, items, workers=None, ahead=None):
    """Yields `function(item)` for each of `items` in order, up to `ahead` of them (default
    twice `workers`) computed ahead by `workers` threads (default `default_workers()`). An
    exception of `function` is raised when its item's turn comes; the work still pending is
    then cancelled, as it is when the consumer stops early."""
    workers = workers or default_workers()
    ahead = ahead or 2 * workers
    pool = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="tfscale_ahead")
    pending = collections.deque()
    try:
        for item in items:
            pending.append(pool.submit(function, item))
            if len(pending) > ahead:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        for future in pending:
            future.cancel()
        pool.shutdown(wait=True, cancel_futures=True)
