"""A hash table of non-negative int64 keys to int64 ids in one numpy array (open addressing,
linear probing from groups of four slots), built once and looked up a whole array of keys at a
time by the C kernels in tfscale/data/_kernels.c, without holding the GIL: the vocabulary's
lookup of the keys the readers compute in their threads (vocabulary.VocabularyEncoder).

Ours because numpy has no hash table, a binary search (`np.searchsorted`) costs about 120 ns a
key on a vocabulary of 50K values (cache misses at every level), and pyarrow's `index_in`
rebuilds its table on every call. Keys are fingerprints already, so a key's low bits are its
slot; the table is at most half full.
"""

import numpy as np

import tfscale.data._kernels as _kernels

_EMPTY = np.int64(-1)  # no key is negative


class KeyTable:
    """int64 `keys` (>= 0) -> int64 `ids`; where a key repeats, its first id is kept.

    `slots`: int64 [size, 2] of (key, id), -1 as an empty slot's key, size a power of two at
    least twice the keys; keys are placed and found in groups of four slots (a 64-byte cache
    line, `tfscale/data/_kernels.c`)."""

    def __init__(self, keys, ids):
        keys = np.ascontiguousarray(keys, np.int64)
        ids = np.ascontiguousarray(ids, np.int64)
        if keys.shape != ids.shape or keys.ndim != 1:
            raise ValueError(f"KeyTable takes keys and ids of one length, got {keys.shape} and "
                             f"{ids.shape}")
        if len(keys) and keys.min() < 0:
            raise ValueError("KeyTable takes non-negative keys")
        size = 1 << max(4, int(2 * len(keys) - 1).bit_length())  # at least twice the keys
        self.slots = _cache_aligned(size)
        self.slots[:, 0] = _EMPTY
        _kernels.insert(self.slots, keys, ids)

    def lookup(self, keys, absent):
        """int64 ids [n] of int64 `keys` [n] (>= 0); `absent` for a key not in the table."""
        found = np.empty(len(keys), np.int64)
        _kernels.lookup(self.slots, np.ascontiguousarray(keys, np.int64), int(absent), found)
        return found


def _cache_aligned(size):
    """An int64 [size, 2] array starting on a 64-byte boundary: a group of four slots is one
    cache line."""
    memory = np.empty(2 * size + 8, np.int64)
    skip = (-memory.ctypes.data % 64) // 8
    return memory[skip:skip + 2 * size].reshape(size, 2)
