"""Adding up the vocabulary counts of the Horovod ranks (tfscale.distributed's collectives), so
that every rank ends with the counts of all the lines.

Owns `RankCounts`, what one rank counted, and `added_up`: the ranks' exact tables allgathered and
added by Arrow's group_by; a value that some rank's table lacks gets that rank's sketch estimate
(allreduced) when that rank spilled; integer ranges, rows, malformed lines and sketched
occurrences reduced; distinct values from the union of the tables, or from the ranks' KMV minima
after a spill. A rank lets a value into its table at ceil(min count / ranks), so a value counted
min count times in all is in at least one rank's table. A rank that stopped on an error stops
every rank with its message.
"""

import dataclasses

import numpy as np
import pyarrow as pa
import tensorflow as tf

from tfscale import distributed
from tfscale.data.value_counts import (SCHEMA, ValueCounts, distinct_estimates,
                                       kept_minima)
from tfscale.errors import UserError


@dataclasses.dataclass
class RankCounts:
    """What one rank counted: the values (a ValueCounts), each integer field's min and max, the
    rows counted and the malformed lines skipped; `error`, a UserError that stopped it."""

    counts: ValueCounts
    num_dense: int
    rows: int = 0
    bad_lines: int = 0
    error: UserError = None

    def __post_init__(self):
        self.lows = np.full(self.num_dense, np.inf)
        self.highs = np.full(self.num_dense, -np.inf)

    def add_ranges(self, lows, highs):
        self.lows = np.minimum(self.lows, lows)
        self.highs = np.maximum(self.highs, highs)


@dataclasses.dataclass
class Totals:
    """The counts of every rank added up: `table` (field, value, count), `distinct` per field,
    integer `lows` and `highs`, `rows`, `bad_lines`, whether any rank `spilled` into its sketch
    and the occurrences the sketches counted (`sketched`)."""

    table: pa.Table
    distinct: np.ndarray
    lows: np.ndarray
    highs: np.ndarray
    rows: int
    bad_lines: int
    spilled: bool
    sketched: int


def added_up(local):
    """The Totals of every rank's RankCounts (`local` is this rank's); every rank calls it and
    gets the same. Raises the UserError that stopped this rank or another."""
    if not several_ranks():
        if local.error is not None:
            raise local.error
        counts = local.counts
        return Totals(counts.table(), counts.distinct(), local.lows, local.highs, local.rows,
                      local.bad_lines, counts.spilled, counts.sketched)
    _stop_all_on_an_error(local.error)
    counts = local.counts
    mine = counts.table()
    table = _union(mine)
    spilled = distributed.any_rank(counts.spilled, name="tfscale_vocabulary_spilled")
    if spilled:
        extra = np.where(_has(mine, table), 0, counts.estimates(
            table["field"].to_numpy(), table["value"]))
        extra = _sum(extra, "tfscale_vocabulary_sketched_counts")
        table = table.set_column(2, "count", pa.array(table["count"].to_numpy() + extra))
        minima = _all_minima(counts)
        distinct = distinct_estimates(minima)
    else:
        distinct = np.bincount(table["field"].to_numpy(), minlength=counts.num_fields)
    lows = -distributed.allreduce_max(tf.constant(-local.lows), name="tfscale_vocabulary_lows")
    highs = distributed.allreduce_max(tf.constant(local.highs), name="tfscale_vocabulary_highs")
    rows, bad_lines, sketched = _sum(np.array([local.rows, local.bad_lines, counts.sketched],
                                              np.int64), "tfscale_vocabulary_totals")
    return Totals(table, distinct, np.asarray(lows), np.asarray(highs), int(rows),
                  int(bad_lines), bool(spilled), int(sketched))


def several_ranks():
    """Whether several ranks count (each its share)."""
    return distributed.size() > 1


def _stop_all_on_an_error(error):
    """Raises on every rank the first rank's error, if any rank has one."""
    messages = _gathered_bytes(b"" if error is None else str(error).encode(),
                               "tfscale_vocabulary_errors")
    if error is not None:
        raise error
    for rank, message in enumerate(messages):
        if message:
            raise UserError(f"rank {rank}: {message.decode()}")


def _gathered_bytes(data, name):
    """Every rank's `data` (bytes), in rank order."""
    lengths = distributed.allgather_array(np.array([len(data)], np.int64), name=name + "_lengths")
    joined = distributed.allgather_array(np.frombuffer(data, np.uint8), name=name).tobytes()
    ends = np.cumsum(lengths)
    return [joined[end - length:end] for end, length in zip(ends, lengths)]


def _union(table):
    """Every rank's (field, value, count) table, added up; the same rows in the same order on
    every rank (a group_by without threads keeps the order values first appear in)."""
    values = table["value"].combine_chunks() if table.num_rows else pa.array([], pa.binary())
    offsets = np.frombuffer(values.buffers()[1], np.int32)[values.offset:
                                                            values.offset + len(values) + 1]
    data = values.buffers()[2]
    data = (np.frombuffer(data, np.uint8)[offsets[0]:offsets[-1]] if data is not None
            else np.zeros(0, np.uint8))
    field = distributed.allgather_array(table["field"].to_numpy(), name="tfscale_vocabulary_fields")
    lengths = distributed.allgather_array(np.diff(offsets), name="tfscale_vocabulary_lengths")
    data = distributed.allgather_array(data, name="tfscale_vocabulary_values")
    count = distributed.allgather_array(table["count"].to_numpy(), name="tfscale_vocabulary_counts")
    ends = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
    kind = pa.binary() if ends[-1] < 2 ** 31 else pa.large_binary()
    ends = ends.astype(np.int32 if kind == pa.binary() else np.int64)
    value = pa.Array.from_buffers(kind, len(lengths), [None, pa.py_buffer(ends),
                                                       pa.py_buffer(data)])
    gathered = pa.table([pa.array(field, pa.int16()), value.cast(pa.binary()),
                         pa.array(count, pa.int64())], schema=SCHEMA)
    summed = gathered.group_by(["field", "value"], use_threads=False).aggregate(
        [("count", "sum")])
    return pa.table([summed["field"], summed["value"], summed["count_sum"]], schema=SCHEMA)


def _has(mine, table):
    """Whether each row of `table` is in `mine` (both (field, value, count) tables)."""
    indexed = table.select(["field", "value"]).append_column(
        "row", pa.array(np.arange(table.num_rows)))
    found = indexed.join(mine.select(["field", "value"]), ["field", "value"], join_type="inner")
    has = np.zeros(table.num_rows, bool)
    has[found["row"].to_numpy()] = True
    return has


def _sum(array, name):
    return np.asarray(distributed.allreduce_sum(tf.constant(array), name=name))


def _all_minima(counts):
    """Each field's KMV minima over every rank (each rank's added in turn: kept_minima takes
    distinct fingerprints at a time)."""
    minima = counts.minima()
    lengths = [len(m) for m in minima]
    fields = np.repeat(np.arange(len(minima), dtype=np.int16), lengths)
    hashes = np.concatenate(minima).view(np.int64)
    sizes = distributed.allgather_array(np.array([len(hashes)], np.int64),
                                        name="tfscale_vocabulary_minima_sizes")
    fields = distributed.allgather_array(fields, name="tfscale_vocabulary_minima_fields")
    hashes = distributed.allgather_array(hashes, name="tfscale_vocabulary_minima").view(np.uint64)
    merged = [np.zeros(0, np.uint64)] * len(minima)
    for end, size in zip(np.cumsum(sizes), sizes):
        merged = kept_minima(merged, fields[end - size:end], hashes[end - size:end])
    return merged
