"""tfscale.data.allocator.retain_freed_memory: glibc then keeps the pad of freed memory at the top
of a heap (mallinfo2's releasable `keepcost`), which it gives back to the system without it; bad
pads are refused naming the argument."""

import subprocess
import sys

import pytest

from tfscale.data import allocator

# A fresh process (its allocator untouched by TensorFlow): the module loaded by its path, the
# pad set or not, then 2 MB malloc'd in blocks under the mmap threshold and freed by the main
# thread (the heap grows for them), and glibc's releasable top of the heap printed.
_PROBE = """
import ctypes, importlib.util, sys
spec = importlib.util.spec_from_file_location("allocator", sys.argv[1])
allocator = importlib.util.module_from_spec(spec)
spec.loader.exec_module(allocator)
if sys.argv[2] != "0":
    assert allocator.retain_freed_memory(int(sys.argv[2]))
class Info(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
libc.mallinfo2.restype = Info
for block in [libc.malloc(100 << 10) for _ in range(20)]:
    libc.free(block)
print(libc.mallinfo2().keepcost)
"""


def _releasable_after_a_free(pad_bytes):
    result = subprocess.run([sys.executable, "-c", _PROBE, allocator.__file__, str(pad_bytes)],
                            capture_output=True, text=True, check=True)
    return int(result.stdout)


@pytest.mark.skipif(allocator._glibc_mallopt() is None, reason="glibc's allocator only")
def test_the_heap_keeps_the_pad_of_freed_memory():
    pad = 32 << 20
    assert _releasable_after_a_free(pad) >= pad
    assert _releasable_after_a_free(0) < pad // 8  # glibc's default: trimmed back


@pytest.mark.parametrize("pad", [-1, 1.5, 1 << 31])
def test_a_bad_pad_is_refused_naming_it(pad):
    with pytest.raises(ValueError, match="pad_bytes"):
        allocator.retain_freed_memory(pad)
