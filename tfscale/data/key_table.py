"""A hash table of non-negative int64 keys to int64 ids in two numpy arrays (open addressing,
linear probing), built once and looked up a whole array of keys at a time by the C kernel in
tfscale/data/_kernels.c, without holding the GIL: the vocabulary's lookup of the keys the
readers compute in their threads (vocabulary.VocabularyEncoder).

Ours because numpy has no hash table, a binary search (`np.searchsorted`) costs about 120 ns a
key on a vocabulary of 50K values (cache misses at every level), and pyarrow's `index_in`
rebuilds its table on every call. Keys are fingerprints already, so a key's low bits are its
slot; the table is at most half full.
"""

import numpy as np

from tfscale.data import _kernels

_EMPTY = np.int64(-1)  # no key is negative


class KeyTable:
    """int64 `keys` (>= 0) -> int64 `ids`; where a key repeats, its first id is kept."""

    def __init__(self, keys, ids):
        keys = np.ascontiguousarray(keys, np.int64)
        ids = np.ascontiguousarray(ids, np.int64)
        if keys.shape != ids.shape or keys.ndim != 1:
            raise ValueError(f"KeyTable takes keys and ids of one length, got {keys.shape} and "
                             f"{ids.shape}")
        if len(keys) and keys.min() < 0:
            raise ValueError("KeyTable takes non-negative keys")
        size = 1 << max(4, int(2 * len(keys) - 1).bit_length())  # at least twice the keys
        self.slots = (np.full(size, _EMPTY), np.zeros(size, np.int64))  # (keys, ids) of slots
        _kernels.insert(*self.slots, keys, ids)

    def lookup(self, keys, missing):
        """int64 ids [n] of int64 `keys` [n] (>= 0); `missing` for a key not in the table."""
        found = np.empty(len(keys), np.int64)
        _kernels.lookup(*self.slots, np.ascontiguousarray(keys, np.int64), int(missing), found)
        return found
