"""Numpy arrays that start on a 64-byte boundary: one cache line (the key table's groups of tags),
and the alignment at which TensorFlow can take a numpy array's buffer as a tensor's without
copying it (numpy's own large arrays start 16 bytes past one)."""

import numpy as np

ALIGNMENT = 64  # bytes


def empty(shape, dtype):
    """An uninitialised C-ordered array of `shape` and `dtype` starting on the boundary."""
    dtype = np.dtype(dtype)
    size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    memory = np.empty(size + ALIGNMENT, np.uint8)
    skip = -memory.ctypes.data % ALIGNMENT
    return memory[skip:skip + size].view(dtype).reshape(shape)
