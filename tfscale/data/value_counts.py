"""Counting categorical values in bounded memory: exact counts while the distinct values fit, a
count-min sketch for the rare ones after that.

Owns `ValueCounts`, the state of one counting pass over (field, value) fingerprints, and the
64-bit fingerprints of values it (and the merge over ranks) hashes with.

How the memory stays bounded: every (field, value) is an entry of a hash table keyed by its
fingerprint (its count, its field, its value's bytes) until the table holds more than
`max_values` entries. Then it spills once: the values seen fewer than `gate` times go into a
count-min sketch (Cormode and Muthukrishnan, 2005: SKETCH_DEPTH rows of `sketch_width`
counters, each saturating at the gate) and leave the table. From then on a value the table
holds is counted there, exactly; any other is added to its counters, and enters the table when
the sketch's count before it plus its own reaches the gate, with that count. Memory is then the
sketch (fixed) and the values that entered (the vocabulary itself); before the spill, the table
(at most `max_values` entries). The counting runs in tfscale/data/_kernels.c's `count_keys`, a
key at a time, without the GIL: a value's bytes are taken only when it becomes an entry, the
rest of the time it is its fingerprint alone.

Error: none while the values fit (no spill: every count is exact, but for two values whose
fingerprints agree in the 63 bits the table keys them by, a chance of about n^2 / 2^64 for n
values). After a spill the sketch never counts low, so no value seen `gate` times or more is
missed; a value that entered through the sketch is counted over its true count by what other
values added to its least-filled counter, at most the gate, and at most e / sketch_width times
the occurrences counted in the sketch (`sketched`) with probability at least 1 -
exp(-SKETCH_DEPTH) for each value. Values counted before the spill or after entering are counted
exactly. The price is values seen fewer than `gate` times that enter because other values filled
their counters. Distinct values per field: exact without a spill, else estimated from the
KMV_SIZE smallest fingerprints of each field (relative standard error about 1 / sqrt(KMV_SIZE),
1.6%), the k-minimum-values estimate (Bar-Yossef et al., 2002).

Written here because neither Arrow nor TensorFlow has a sketch or a distinct-count estimate,
nor a hash table that counts keys as they come without building a table of a block first
(Arrow's `value_counts` and `index_in` do, and cost more than the parse).
"""

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

import tfscale.data._kernels as _kernels
from tfscale.data import aligned
from tfscale.data.fingerprint import fingerprints as value_fingerprints

SKETCH_DEPTH = 4  # rows of the count-min sketch: a value's estimate fails with prob. e^-4 (1.8%)
KMV_SIZE = 4096  # smallest fingerprints kept per field for the distinct estimate
SCHEMA = pa.schema([("field", pa.int16()), ("value", pa.binary()), ("count", pa.int64())])
FINGERPRINT_RULE = "fingerprints"  # line_kernel's rule kind giving `fingerprints`
_FIELD_MIX = np.uint64(0x9E3779B97F4A7C15)  # the golden ratio's 64 bits: fields far apart
_ALL_ONES = np.iinfo(np.uint64).max
_FIRST_ENTRIES = 1 << 14  # the table's room at first; doubled when full
_CANDIDATE_ROOM = 1 << 14  # KMV candidates the kernel writes before they are merged
_ORIGIN_ROOM = 1 << 16  # new entries the kernel makes before their values are taken
_CHUNKS = 64  # entries' value arrays kept apart before they are joined into one


def distinct_counts(columns):
    """(fields int16 [V], values binary [V], counts int64 [V]): each of the binary `columns`'
    (Arrow arrays or chunked arrays) distinct non-empty values with the rows holding them, column
    k as field k, by Arrow's `value_counts`; sorted by field, as ValueCounts.add takes them."""
    fields, values, counts = [np.zeros(0, np.int16)], [pa.array([], pa.binary())], []
    for field, column in enumerate(columns):
        found = pc.value_counts(column)
        present = pc.greater(pc.binary_length(found.field("values")), 0)
        values.append(found.field("values").filter(present))
        counts.append(found.field("counts").filter(present))
        fields.append(np.full(len(values[-1]), field, np.int16))
    counts = pa.concat_arrays(counts).to_numpy() if counts else np.zeros(0, np.int64)
    return np.concatenate(fields), pa.concat_arrays(values), counts


def mix64(x):
    """splitmix64's finaliser of uint64 values (a bijection that spreads every input bit)."""
    with np.errstate(over="ignore"):
        x = x ^ (x >> np.uint64(30))
        x = x * np.uint64(0xBF58476D1CE4E5B9)
        x = x ^ (x >> np.uint64(27))
        x = x * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def field_mixes(num_fields):
    """uint64 [num_fields]: what each field's values' FarmHash is XORed with."""
    with np.errstate(over="ignore"):
        return mix64(np.arange(num_fields, dtype=np.uint64) + _FIELD_MIX)


def fingerprints(fields, values):
    """uint64 fingerprints of (field, value) pairs: `fields` int array, `values` a pyarrow binary
    array (or chunked array) of the same length: splitmix64's finaliser of the value's FarmHash
    Fingerprint64 (tfscale.data.fingerprint's C kernel, TensorFlow's string hash) XOR the
    finaliser of the field plus a constant; 1 in place of 0 (which marks no value)."""
    values = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    hashes, _ = value_fingerprints(values)
    mixed = mix64(hashes ^ field_mixes(int(np.max(fields, initial=0)) + 1)[np.asarray(fields)])
    return mixed + (mixed == 0)


def fingerprint_rule(num_fields):
    """The line kernel's rule (tfscale.data.line_kernel) giving each categorical value its
    `fingerprints`, as ValueCounts.add_keys takes them (an empty value gets the kernel's missing
    id, schema.MISSING_ID, 0: no value here)."""
    return FINGERPRINT_RULE, field_mixes(num_fields), None, None, 0


class ValueCounts:
    """The counts of one pass: `add` or `add_keys` blocks, then `table()`.

    Args:
      num_fields: categorical fields (field ids 0 .. num_fields - 1).
      gate: a value enters the exact table after a spill once its estimate reaches this (the
        min count, divided by the ranks when each rank counts its share).
      max_values: entries of the exact table before it spills into the sketch (never with a
        gate of 1: every value is kept then, so the table is the vocabulary itself).
      sketch_width: counters per sketch row (a power of two).
    """

    def __init__(self, num_fields, *, gate, max_values, sketch_width):
        if sketch_width & (sketch_width - 1):
            raise ValueError(f"sketch_width must be a power of two, got {sketch_width}")
        self.num_fields = int(num_fields)
        self.gate = max(1, int(gate))
        self.max_values = int(max_values) if self.gate > 1 else np.iinfo(np.int64).max
        self.sketch_width = int(sketch_width)
        self._state = np.zeros(3, np.int64)  # entries, KMV candidates written, sketched
        self._candidates = np.zeros((_CANDIDATE_ROOM, 2), np.uint64)  # (field, fingerprint)
        self._origins = np.zeros(_ORIGIN_ROOM, np.int64)  # where the keys of new entries lie
        self._limits = np.full(self.num_fields, _ALL_ONES, np.uint64)  # candidates' bounds
        self._sketch = None  # [SKETCH_DEPTH, sketch_width] once spilled
        self._minima = None  # per field, once spilled: sorted uint64, the KMV_SIZE smallest
        self._empty_table(_FIRST_ENTRIES)

    @property
    def spilled(self):
        """Whether the sketch is in use (counts may then be estimates)."""
        return self._sketch is not None

    @property
    def sketched(self):
        """Occurrences counted in the sketch."""
        return int(self._state[2])

    def add(self, fields, values, counts):
        """Counts `counts` more occurrences of each (field, value): `fields` int, `values` a
        pyarrow binary array, none of them an empty string (missing values are not counted)."""
        fields = np.ascontiguousarray(fields, np.int16)
        if not len(fields):
            return
        values = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
        self._count(fingerprints(fields, values), np.ascontiguousarray(counts, np.int64),
                    fields, lambda origins: values.take(pa.array(origins)))

    def add_keys(self, keys, values_at):
        """Counts once each of `keys` (uint64 [n, num_fields], C-ordered: column k the
        `fingerprints` of field k's values, 0 for none), e.g. a block's as the line kernel gives
        them with `fingerprint_rule`; `values_at(origins)` gives the values (a pyarrow binary
        array) at flat positions `origins` (int64) of `keys`, those that become entries."""
        if keys.ndim != 2 or keys.shape[1] != self.num_fields:
            raise ValueError(f"add_keys takes keys [n, {self.num_fields}], got {keys.shape}")
        self._count(np.ascontiguousarray(keys, np.uint64).reshape(-1), None, None, values_at)

    def table(self):
        """(field, value, count) of every value counted exactly or let in by the sketch."""
        entries = self._entries()  # copies: counting goes on in these arrays
        return pa.table([pa.array(self._field_of[:entries].copy()), self._values(),
                         pa.array(self._counts[:entries].copy())], schema=SCHEMA)

    def distinct(self):
        """Distinct values per field (int64 [num_fields]): exact without a spill, else the KMV
        estimate."""
        if not self.spilled:
            return np.bincount(self._field_of[:self._entries()], minlength=self.num_fields)
        return distinct_estimates(self._minima)

    def minima(self):
        """The KMV_SIZE smallest fingerprints of each field's values (a list of uint64 arrays)."""
        if self.spilled:
            return self._minima
        fields = self._field_of[:self._entries()]
        return kept_minima([np.zeros(0, np.uint64)] * self.num_fields, fields,
                           fingerprints(fields, self._values()))

    def estimates(self, fields, values):
        """The sketch's count of each (field, value) (zeros before a spill)."""
        if not self.spilled:
            return np.zeros(len(values), np.int64)
        estimate = None
        for row, slots in enumerate(self._slots(fingerprints(fields, values))):
            counters = np.take(self._sketch[row], slots)
            estimate = counters if estimate is None else np.minimum(estimate, counters)
        return estimate.astype(np.int64)

    # -- the table

    def _entries(self):
        return int(self._state[0])

    def _empty_table(self, room):
        """A table with room for `room` entries (a power of two), at most half full then."""
        self._slots_table = aligned.empty((2 * room, 2), np.int64)
        self._slots_table[:, 0] = -1
        self._tags = aligned.empty(2 * room, np.uint8)
        self._tags[:] = 0
        self._counts = np.zeros(room, np.int64)
        self._field_of = np.zeros(room, np.int16)
        self._value_chunks = []
        self._state[0] = 0

    def _values(self):
        """The entries' values, in entry order (one array)."""
        if len(self._value_chunks) != 1:
            self._value_chunks = [pa.concat_arrays(
                self._value_chunks or [pa.array([], pa.binary())])]
        return self._value_chunks[0]

    def _count(self, keys, weights, fields, values_at):
        """Counts `keys` (weights and fields as count_keys takes them) from the first on,
        making room, spilling and merging KMV candidates whenever the kernel stops for it."""
        start, first_new = 0, self._entries()
        while True:
            room = len(self._counts)
            limit = room if self.spilled else min(room, self.max_values + 1)
            start = _kernels.count_keys(
                keys, weights, fields, start, self._slots_table, self._tags, self._counts,
                self._field_of, self._origins, limit, self._sketch, self.gate, self._limits,
                self._candidates, self._state)
            if self._entries() > first_new:
                self._value_chunks.append(values_at(self._origins[:self._entries() - first_new]))
                if len(self._value_chunks) > _CHUNKS:
                    self._values()
            self._merge_candidates()
            if start == len(keys):
                return
            if not self.spilled and self._entries() > self.max_values:
                self._spill()
            elif self._entries() == room:
                self._grow()
            first_new = self._entries()

    def _grow(self):
        """Twice the room: the table rebuilt from its keys (the old one let go first), the
        entries' arrays copied."""
        entries, occupied = self._entries(), np.flatnonzero(self._tags)
        keys, ids = self._slots_table[occupied, 0], self._slots_table[occupied, 1]
        del occupied
        self._slots_table = self._tags = None
        counts, field_of, chunks = self._counts, self._field_of, self._value_chunks
        self._empty_table(2 * len(counts))
        _kernels.insert(self._slots_table, self._tags, keys, ids)
        del keys, ids
        self._counts[:entries], self._field_of[:entries] = counts[:entries], field_of[:entries]
        self._value_chunks, self._state[0] = chunks, entries

    def _spill(self):
        """The values under the gate go into a new sketch and leave the table."""
        entries = self._entries()
        fields, counts = self._field_of[:entries].copy(), self._counts[:entries].copy()
        values = self._values()
        hashes = fingerprints(fields, values)
        self._minima = kept_minima([np.zeros(0, np.uint64)] * self.num_fields, fields, hashes)
        self._limits = _limits_of(self._minima)
        kept, under = np.flatnonzero(counts >= self.gate), np.flatnonzero(counts < self.gate)
        self._empty_table(1 << max(14, int(2 * len(kept) - 1).bit_length()))
        _kernels.insert(self._slots_table, self._tags,
                        (hashes[kept] & np.uint64(np.iinfo(np.int64).max)).astype(np.int64),
                        np.arange(len(kept), dtype=np.int64))
        self._counts[:len(kept)], self._field_of[:len(kept)] = counts[kept], fields[kept]
        self._value_chunks, self._state[0] = [values.take(pa.array(kept))], len(kept)
        self._sketch = np.zeros((SKETCH_DEPTH, self.sketch_width), sketch_dtype(self.gate))
        under_values = values.take(pa.array(under))
        self._count(hashes[under], counts[under], fields[under],
                    lambda origins: under_values.take(pa.array(origins)))

    def _merge_candidates(self):
        """The KMV candidates the kernel wrote merged into the minima."""
        written = int(self._state[1])
        if not written:
            return
        found = self._candidates[:written]
        self._minima = kept_minima(self._minima, found[:, 0].astype(np.int64), found[:, 1])
        self._limits = _limits_of(self._minima)
        self._state[1] = 0

    def _slots(self, hashes):
        """The sketch's counter of each value in each row (int64 [SKETCH_DEPTH, n]), as
        count_keys finds them."""
        mask = np.uint64(self.sketch_width - 1)
        with np.errstate(over="ignore"):
            return [(mix64(hashes + np.uint64(row + 1)) & mask).astype(np.intp)
                    for row in range(SKETCH_DEPTH)]


def _limits_of(minima):
    """Per field, the largest fingerprint that can still join its minima."""
    return np.array([m[-1] if len(m) >= KMV_SIZE else _ALL_ONES for m in minima], np.uint64)


def sketch_dtype(gate):
    """16-bit counters for a gate up to 65,535 (they saturate at it), else 32-bit ones."""
    return np.uint16 if gate <= 0xFFFF else np.uint32


def kept_minima(minima, fields, hashes):
    """`minima` (per field, sorted uint64 arrays of at most KMV_SIZE) with `hashes` of `fields`
    added: each field's KMV_SIZE smallest distinct fingerprints."""
    fields = np.asarray(fields)
    limits = _limits_of(minima)
    candidates = np.flatnonzero(hashes <= limits[fields]) if len(fields) else np.zeros(0, int)
    fields, hashes = fields[candidates], hashes[candidates]
    order = np.argsort(fields, kind="stable")
    fields, hashes = fields[order], hashes[order]
    bounds = np.searchsorted(fields, np.arange(len(minima) + 1))
    merged = list(minima)
    for field in np.unique(fields):
        mine = hashes[bounds[field]:bounds[field + 1]]
        if len(mine) > KMV_SIZE:  # the smallest KMV_SIZE of one block are distinct values
            mine = np.partition(mine, KMV_SIZE - 1)[:KMV_SIZE]
        # two sorted runs: a stable sort merges them
        both = np.sort(np.concatenate([minima[field], np.sort(mine)]), kind="stable")
        if len(both) > 1:
            both = both[np.concatenate([[True], both[1:] != both[:-1]])]
        merged[field] = both[:KMV_SIZE]
    return merged


def distinct_estimates(minima):
    """Distinct values per field from their KMV minima: exact when fewer than KMV_SIZE were
    seen, else (k - 1) / (the k-th smallest fingerprint as a fraction of 2**64)."""
    return np.array([len(m) if len(m) < KMV_SIZE else
                     int(round((KMV_SIZE - 1) * 2.0 ** 64 / (float(m[KMV_SIZE - 1]) + 1.0)))
                     for m in minima], np.int64)
