"""Counting categorical values in bounded memory: exact counts while the distinct values fit, a
count-min sketch for the rare ones after that.

Owns `ValueCounts`, the state of one counting pass over (field, value, count) blocks, and the
64-bit fingerprints of values it (and the merge over ranks) hashes with.

How the memory stays bounded: every (field, value) is counted exactly in an Arrow table (blocks
merged into it by Arrow's hash aggregation, `group_by`, in C++) until the table holds more than
`max_values` rows. Then it spills once: the values seen fewer than `gate` times go into a
count-min sketch (Cormode and Muthukrishnan, 2005: SKETCH_DEPTH rows of `sketch_width` counters,
saturating at the gate; cut to it every so many blocks, read through min(counter, gate) in
between) and leave the table, which is kept per field from then on. Each later
block is looked up in its field's table (Arrow's `index_in`): values found are counted exactly,
the others in the sketch, and a value whose sketch count reaches `gate` enters the table with
that count (its count in the sketch before this block, plus this block's). Memory is then the
sketch (fixed), the values that entered (the vocabulary itself) and one block; before the spill,
the table and the blocks waiting to be merged (at most `max_values` rows each).

Error: none while the values fit (no spill: every count is exact). After a spill the sketch
never counts low, so no value seen `gate` times or more is missed; a value that entered through
the sketch is counted over its true count by what other values added to its least-filled
counter, at most the gate, and at most e / sketch_width times the occurrences counted in the
sketch (`sketched`) with probability at least 1 - exp(-SKETCH_DEPTH) for each value. Values
counted before the spill or after entering are counted exactly. The price is values seen fewer
than `gate` times that enter because other values filled their counters. Distinct values per
field: exact without a spill, else estimated from the KMV_SIZE smallest fingerprints of each
field (relative standard error about 1 / sqrt(KMV_SIZE), 1.6%), the k-minimum-values estimate
(Bar-Yossef et al., 2002).

Written here because neither Arrow nor TensorFlow has a sketch or a distinct-count estimate,
nor a 64-bit hash of Arrow's strings outside their own group-by (the values are hashed by the
readers' C kernel).
"""

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tfscale.data.fingerprint import fingerprints as value_fingerprints

SKETCH_DEPTH = 4  # rows of the count-min sketch: a value's estimate fails with prob. e^-4 (1.8%)
KMV_SIZE = 4096  # smallest fingerprints kept per field for the distinct estimate
MIN_MERGE_ROWS = 1 << 20  # before a spill, blocks wait for this many rows (at most max_values)
SCHEMA = pa.schema([("field", pa.int16()), ("value", pa.binary()), ("count", pa.int64())])
_FIELD_MIX = np.uint64(0x9E3779B97F4A7C15)  # the golden ratio's 64 bits: fields far apart
_ALL_ONES = np.iinfo(np.uint64).max
_HASH_SLICE = 1 << 14  # values hashed at a time


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


def fingerprints(fields, values):
    """uint64 fingerprints of (field, value) pairs: `fields` int array, `values` a pyarrow binary
    array (or chunked array) of the same length: splitmix64's finaliser of the value's FarmHash
    Fingerprint64 (tfscale.data.fingerprint's C kernel, TensorFlow's string hash) XOR the
    finaliser of the field plus a constant."""
    values = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    hashes, _ = value_fingerprints(values)
    with np.errstate(over="ignore"):
        return mix64(hashes ^ mix64(np.asarray(fields, np.uint64) + _FIELD_MIX))


class ValueCounts:
    """The counts of one pass: `add` blocks of (field, value, count), then `table()`.

    Args:
      num_fields: categorical fields (field ids 0 .. num_fields - 1).
      gate: a value enters the exact table after a spill once its estimate reaches this (the
        min count, divided by the ranks when each rank counts its share).
      max_values: rows of the exact table before it spills into the sketch (never with a gate
        of 1: every value is kept then, so the table is the vocabulary itself).
      sketch_width: counters per sketch row (a power of two; 4 bytes each).
    """

    def __init__(self, num_fields, *, gate, max_values, sketch_width):
        if sketch_width & (sketch_width - 1):
            raise ValueError(f"sketch_width must be a power of two, got {sketch_width}")
        self.num_fields = int(num_fields)
        self.gate = max(1, int(gate))
        self.max_values = int(max_values) if self.gate > 1 else np.iinfo(np.int64).max
        self.sketch_width = int(sketch_width)
        self.sketched = 0  # occurrences counted in the sketch
        self._table = SCHEMA.empty_table()
        self._pending, self._pending_rows = [], 0
        self._sketch = None  # uint32 [SKETCH_DEPTH, sketch_width] once spilled
        self._minima = None  # per field: sorted uint64 fingerprints, the KMV_SIZE smallest
        self._fields = None  # once spilled, per field: [values (binary array), counts (int64)]

    @property
    def spilled(self):
        """Whether the sketch is in use (counts may then be estimates)."""
        return self._sketch is not None

    def add(self, fields, values, counts, hashed=None):
        """Counts `counts` more occurrences of each (field, value): distinct pairs, sorted by
        field, none of them an empty string (missing values are not counted). `hashed`, when
        given, is `self.hashed(fields, values)` (worked out ahead, e.g. in another thread)."""
        if self.spilled:
            self._add_after_spill(np.asarray(fields), values, np.asarray(counts, np.int64),
                                  hashed)
            return
        block = pa.table([pa.array(fields, pa.int16()), values, pa.array(counts, pa.int64())],
                         schema=SCHEMA)
        self._pending.append(block)
        self._pending_rows += block.num_rows
        if self._pending_rows >= max(min(MIN_MERGE_ROWS, self.max_values), self._table.num_rows):
            self._merge()

    def hashed(self, fields, values):
        """(fingerprints, sketch counters) of (field, value) pairs, for `add`: what counting
        them after a spill hashes, worked out of them alone (any thread may call it)."""
        hashes = fingerprints(fields, values)
        return hashes, self._slots(hashes)

    def table(self):
        """(field, value, count) of every value counted exactly or let in by the sketch."""
        if not self.spilled:
            self._merge()  # which may spill
        if not self.spilled:
            return self._table
        columns = [(np.full(len(values), field, np.int16), values, counts)
                   for field, (values, counts) in enumerate(self._fields)]
        return pa.table([pa.array(np.concatenate([c[0] for c in columns])),
                         pa.concat_arrays([c[1] for c in columns]),
                         pa.array(np.concatenate([c[2] for c in columns]))], schema=SCHEMA)

    def distinct(self):
        """Distinct values per field (int64 [num_fields]): exact without a spill, else the KMV
        estimate."""
        if not self.spilled:
            return np.bincount(self.table()["field"].to_numpy(), minlength=self.num_fields)
        return distinct_estimates(self._minima)

    def minima(self):
        """The KMV_SIZE smallest fingerprints of each field's values (a list of uint64 arrays)."""
        if self.spilled:
            return self._minima
        table = self.table()
        fields = table["field"].to_numpy()
        return kept_minima([np.zeros(0, np.uint64)] * self.num_fields, fields,
                           fingerprints(fields, table["value"]))

    def estimates(self, fields, values):
        """The sketch's count of each (field, value) (zeros before a spill)."""
        if not self.spilled:
            return np.zeros(len(values), np.int64)
        return self._estimate(self._slots(fingerprints(fields, values)))

    # -- before the spill: blocks merged into the table by Arrow's group_by

    def _merge(self):
        if not self._pending:
            return
        pending = pa.concat_tables(self._pending)
        self._pending, self._pending_rows = [], 0
        self._table = _summed(pa.concat_tables([self._table, pending]))
        if self._table.num_rows > self.max_values:
            self._spill()

    def _spill(self):
        """The values under the gate go into a new sketch and leave the table, which is kept
        per field from now on."""
        table = self._table.sort_by("field")
        fields = table["field"].to_numpy()
        hashes = fingerprints(fields, table["value"])
        self._minima = kept_minima([np.zeros(0, np.uint64)] * self.num_fields, fields, hashes)
        counts = table["count"].to_numpy()
        under = counts < self.gate
        self._sketch = np.zeros((SKETCH_DEPTH, self.sketch_width), sketch_dtype(self.gate))
        self._unsaturated = 0  # batches added since the counters were last cut to the gate
        self._batches_unsaturated = max(1, int(
            (np.iinfo(self._sketch.dtype).max - self.gate) // (15 * self.gate)))
        self._sketch_add(self._slots(hashes[under]), counts[under])
        kept = table.filter(pa.array(~under))
        bounds = np.searchsorted(kept["field"].to_numpy(), np.arange(self.num_fields + 1))
        values, counts = kept["value"].combine_chunks(), kept["count"].to_numpy()
        self._fields = [[values[bounds[f]:bounds[f + 1]], counts[bounds[f]:bounds[f + 1]].copy()]
                        for f in range(self.num_fields)]
        self._table = None

    # -- after the spill: each block looked up in the (small) table, the rest sketched

    def _add_after_spill(self, fields, values, counts, hashed):
        bounds = np.searchsorted(fields, np.arange(self.num_fields + 1))
        unknown = np.ones(len(fields), bool)
        for field in range(self.num_fields):
            start, end = bounds[field], bounds[field + 1]
            known, known_counts = self._fields[field]
            if start == end or not len(known):
                continue
            rows = pc.index_in(values[start:end], value_set=known).to_numpy(zero_copy_only=False)
            found = ~np.isnan(rows) if rows.dtype.kind == "f" else rows >= 0
            known_counts[rows[found].astype(np.int64)] += counts[start:end][found]
            unknown[start:end] = ~found
        new = np.flatnonzero(unknown)
        if not len(new):
            return
        if len(new) < len(fields):
            fields, counts, values = fields[new], counts[new], values.take(pa.array(new))
            if hashed is not None:
                hashed = hashed[0][new], np.take(hashed[1], new, axis=1)
        hashes, slots = self.hashed(fields, values) if hashed is None else hashed
        before = self._estimate(slots)
        self._sketch_add(slots, counts)
        self._minima = kept_minima(self._minima, fields, hashes)
        estimate = before + counts  # what entering values start with: the sketch's + this block's
        entering = np.flatnonzero(estimate >= self.gate)
        if not len(entering):
            return
        fields, estimate = fields[entering], estimate[entering]
        values = values.take(pa.array(entering))
        bounds = np.searchsorted(fields, np.arange(self.num_fields + 1))
        for field in np.flatnonzero(np.diff(bounds)):
            start, end = bounds[field], bounds[field + 1]
            known, known_counts = self._fields[field]
            self._fields[field] = [pa.concat_arrays([known, values[start:end]]),
                                   np.concatenate([known_counts, estimate[start:end]])]

    def _slots(self, hashes):
        """The sketch's counter of each value in each row (int64 [SKETCH_DEPTH, n])."""
        mask = np.uint64(self.sketch_width - 1)
        slots = np.empty((SKETCH_DEPTH, len(hashes)), np.intp)
        for start in range(0, len(hashes), _HASH_SLICE):
            piece = hashes[start:start + _HASH_SLICE]
            for row in range(SKETCH_DEPTH):
                slots[row, start:start + len(piece)] = mix64(piece + np.uint64(row + 1)) & mask
        return slots

    def _sketch_add(self, slots, counts):
        """Adds `counts` (clipped to the gate) to the values' counters, which saturate at the
        gate: a count-min sketch needs to tell no more than whether a value reached it.

        The counters are cut down to the gate only every `_batches_unsaturated` batches (a pass
        over the whole sketch), and read through min(counter, gate) in between: the same
        estimates, since min(min(c, gate) + a, gate) = min(c + a, gate) for a >= 0. A batch
        adds at most 15 times the gate to a counter (no 16 of its values share one, as
        sketch_dtype assumes), so they cannot overflow before."""
        counts = np.asarray(counts, np.int64)
        self.sketched += int(counts.sum())
        clipped = np.minimum(counts, self.gate).astype(self._sketch.dtype)
        if self._unsaturated >= self._batches_unsaturated:
            np.minimum(self._sketch, self._sketch.dtype.type(self.gate), out=self._sketch)
            self._unsaturated = 0
        for row in range(SKETCH_DEPTH):
            np.add.at(self._sketch[row], slots[row], clipped)
        self._unsaturated += 1

    def _estimate(self, slots):
        estimate = np.take(self._sketch[0], slots[0])
        for row in range(1, SKETCH_DEPTH):
            np.minimum(estimate, np.take(self._sketch[row], slots[row]), out=estimate)
        return np.minimum(estimate, self.gate).astype(np.int64)


def sketch_dtype(gate):
    """16-bit counters while a batch cannot overflow them between saturations (gate <= 4095:
    16 values of one batch would have to share a counter), else 32-bit ones."""
    return np.uint16 if gate <= 4095 else np.uint32


def _summed(table):
    """(field, value, count) with the counts of equal (field, value) rows added."""
    grouped = table.group_by(["field", "value"], use_threads=False).aggregate(
        [("count", "sum")])
    return pa.table([grouped["field"], grouped["value"], grouped["count_sum"]], schema=SCHEMA)


def kept_minima(minima, fields, hashes):
    """`minima` (per field, sorted uint64 arrays of at most KMV_SIZE) with `hashes` of `fields`
    added: each field's KMV_SIZE smallest distinct fingerprints."""
    fields = np.asarray(fields)
    limits = np.array([m[-1] if len(m) >= KMV_SIZE else _ALL_ONES for m in minima], np.uint64)
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
