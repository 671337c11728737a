"""A hash table of non-negative int64 keys to int64 ids in numpy arrays (open addressing, linear
probing), built once and looked up a whole array of keys at a time: the vocabulary's lookup of
the keys the readers compute in their threads (vocabulary.VocabularyEncoder).

Ours because numpy has no hash table, a binary search (`np.searchsorted`) costs about 120 ns a
key on a vocabulary of 50K values (cache misses at every level), and pyarrow's `index_in`
rebuilds its table on every call. Keys are fingerprints already, so a key's low bits are its
slot. Lookups probe every key still unresolved one slot further each round: about 2.5 slots a
missing key and 1.5 a found one at the table's load of at most one half.
"""

import numpy as np

_EMPTY = np.int64(-1)  # no key is negative


class KeyTable:
    """int64 `keys` (>= 0) -> int64 `ids`; where a key repeats, its first id is kept."""

    def __init__(self, keys, ids):
        keys, ids = np.asarray(keys, np.int64), np.asarray(ids, np.int64)
        if len(keys) and keys.min() < 0:
            raise ValueError("KeyTable takes non-negative keys")
        size = 1 << max(4, int(2 * len(keys) - 1).bit_length())  # at least twice the keys
        self._mask = np.int64(size - 1)
        self._keys = np.full(size, _EMPTY)
        self._ids = np.zeros(size, np.int64)
        self._insert(keys, ids)

    def _insert(self, keys, ids):
        """Each key in order into its first free slot from its home slot, unless it is there
        already; keys wanting the same free slot in a round: the first one takes it."""
        pending = np.arange(len(keys))
        slots = keys & self._mask
        while len(pending):
            held = self._keys[slots]
            waiting = held != keys[pending]  # not placed yet (an equal key: placed before it)
            free = waiting & (held == _EMPTY)
            first = np.zeros(len(pending), bool)
            _, firsts = np.unique(slots[free], return_index=True)  # the first key of each slot
            first[np.flatnonzero(free)[firsts]] = True
            self._keys[slots[first]] = keys[pending[first]]
            self._ids[slots[first]] = ids[pending[first]]
            later = waiting & ~first
            moved = later & ~free  # a free slot lost to an earlier key is tried again
            slots[moved] = (slots[moved] + 1) & self._mask
            pending, slots = pending[later], slots[later]

    def lookup(self, keys, missing):
        """int64 ids [n] of int64 `keys` [n] (>= 0); `missing` for a key not in the table."""
        slots = keys & self._mask
        held = self._keys[slots]
        found = np.where(held == keys, self._ids[slots], np.int64(missing))  # most keys end here
        pending = np.flatnonzero((held != keys) & (held != _EMPTY))
        slots = (slots[pending] + 1) & self._mask
        while len(pending):
            held = self._keys[slots]
            hit = held == keys[pending]
            found[pending[hit]] = self._ids[slots[hit]]
            going_on = ~hit & (held != _EMPTY)
            pending, slots = pending[going_on], (slots[going_on] + 1) & self._mask
        return found
