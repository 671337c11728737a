"""A hash table of non-negative int64 keys to int64 ids in numpy arrays (open addressing,
linear probing from groups of eight slots, each with a one-byte tag), built once and looked up
a whole array of keys at a time by the C kernels in tfscale/data/_kernels.c, without holding
the GIL: the vocabulary's lookup of the keys the readers compute in their threads
(vocabulary.VocabularyEncoder).

Ours because numpy has no hash table, a binary search (`np.searchsorted`) costs about 120 ns a
key on a vocabulary of 50K values (cache misses at every level), and pyarrow's `index_in`
rebuilds its table on every call. Keys are fingerprints already, so a key's low bits are its
slot and its high bits its tag; the table is at most half full.
"""

import numpy as np

import tfscale.data._kernels as _kernels
from tfscale.data import aligned

_EMPTY = np.int64(-1)  # no key is negative


class KeyTable:
    """int64 `keys` (>= 0) -> int64 `ids`; where a key repeats, its first id is kept.

    `slots`: int64 [size, 2] of (key, id), -1 as an empty slot's key, size a power of two at
    least twice the keys; `tags`: uint8 [size], 0 for an empty slot, else 0x80 | the key's bits
    56-62. A search compares a group's eight tags at once and reads only the slots whose tag
    matches (`tfscale/data/_kernels.c`): a key the table does not hold, most of a vocabulary's
    lookups, costs a read of the tags alone, 1/16 of the slots' memory."""

    def __init__(self, keys, ids):
        keys = np.ascontiguousarray(keys, np.int64)
        ids = np.ascontiguousarray(ids, np.int64)
        if keys.shape != ids.shape or keys.ndim != 1:
            raise ValueError(f"KeyTable takes keys and ids of one length, got {keys.shape} and "
                             f"{ids.shape}")
        if len(keys) and keys.min() < 0:
            raise ValueError("KeyTable takes non-negative keys")
        size = 1 << max(4, int(2 * len(keys) - 1).bit_length())  # at least twice the keys
        self.slots = aligned.empty((size, 2), np.int64)
        self.slots[:, 0] = _EMPTY
        self.tags = aligned.empty(size, np.uint8)  # a group's tags: one word of a cache line
        self.tags[:] = 0
        _kernels.insert(self.slots, self.tags, keys, ids)

    def lookup(self, keys, absent):
        """int64 ids [n] of int64 `keys` [n] (>= 0); `absent` for a key not in the table."""
        found = np.empty(len(keys), np.int64)
        _kernels.lookup(self.slots, self.tags, np.ascontiguousarray(keys, np.int64), int(absent),
                        found)
        return found

