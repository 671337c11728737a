"""The process's C allocator, set so that the readers' memory is reused instead of returned to
the system and faulted in again (`retain_freed_memory`).

Every block a reader reads, parses and hands to TensorFlow is a few megabytes allocated and freed
by glibc's malloc in tf.data's threads. By default glibc gives a thread's freed memory back to
the system as soon as a few megabytes of it lie free at the top of the thread's heap, and the
next block faults those pages in again and zeroes them: on a 2-core machine a quarter of the
text reader's CPU time went to the kernel's page faults (docs/results/input_path.md). pyarrow's
own buffers do not pay this: its allocator keeps freed pages. glibc's M_TOP_PAD (`mallopt`)
keeps that much freed memory at the top of every heap. Ours because the alternatives are the
user's to make, not a library's: a different malloc (tcmalloc or jemalloc) by LD_PRELOAD, or
MALLOC_TOP_PAD_ in the environment before Python starts.
"""

import ctypes
import ctypes.util

DEFAULT_PAD_BYTES = 64 << 20  # launch.train's: the readers' blocks fit (docs/results/input_path.md)
_M_TOP_PAD = -2  # glibc's malloc.h


def retain_freed_memory(pad_bytes=DEFAULT_PAD_BYTES):
    """Keeps up to `pad_bytes` of freed memory at the top of each of this process's malloc heaps
    (glibc's M_TOP_PAD), so that the readers reuse it instead of faulting it in again. It sets
    the whole process's allocator, for the rest of its life: each heap (one per thread that
    allocated, up to 8 a core) may then hold `pad_bytes` it does not use. Returns False, having
    changed nothing, where the C library is not glibc; True once set (`launch.train` sets 64 MiB:
    its `--retain_freed_memory_mib`).

    Example:
        ```python
        tfscale.data.retain_freed_memory()  # first thing in a script that reads files
        source = tfscale.data.CriteoTSV("train.txt", hash_buckets=1_000_000)
        ```
    """
    if int(pad_bytes) != pad_bytes or not 0 <= pad_bytes < 1 << 31:
        raise ValueError(f"retain_freed_memory takes 0 <= pad_bytes < 2**31, got {pad_bytes!r}")
    mallopt = _glibc_mallopt()
    if mallopt is None:
        return False
    if not mallopt(_M_TOP_PAD, int(pad_bytes)):
        raise OSError(f"glibc's mallopt refused M_TOP_PAD = {pad_bytes}")
    return True


def _glibc_mallopt():
    """glibc's `mallopt`, or None where the C library is another."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        libc.gnu_get_libc_version  # noqa: B018 (glibc's own symbol: musl and macOS lack it)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return None
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return mallopt
