"""The by-id checkpoint format (`BY_ID`, a TableCheckpoint: tfscale.embedding.strategy) of
tables whose rows are given to ids, with a row index (docs/dynamic.md).

Every rank writes `dynamic-<rank>-of-<ranks>.npz` into the checkpoint directory, per row index
(one per FieldEmbedding with dynamic tables, its arrays named "<index path>:<name>"): for each row
in use its key, its position, its rows of the group's tables and their per-row optimizer state,
its last-seen step and count; the rows handed out so far and the stack of freed rows; the
admission sketch; the step. Only rows in use are read and written: the rows never handed out stay
unwritten (tfscale.embedding.id_rows). A restore at the same number of ranks reads the rank's own
file and puts every row back where it was (a bitwise resume). At another number of ranks (or
from a checkpoint without `next_row`, written before rows were handed out from a high-water
mark), every rank reads every file and keeps the keys it owns now (key mod P) in rows 0, 1, ...
in key order; the sketches are summed and capped at `min_count`, which is the sketch one process
would hold, so pending ids keep their counts."""

import dataclasses
import glob
import os
import re

import numpy as np
import tensorflow as tf

from tfscale import distributed
from tfscale.embedding import stored_arrays
from tfscale.embedding.id_rows import NO_ROW
from tfscale.embedding.table import tables_of
from tfscale.errors import UserError

_FILE = "dynamic-{}-of-{}.npz"
_FILE_PATTERN = re.compile(r"dynamic-(\d+)-of-(\d+)\.npz$")


@dataclasses.dataclass(frozen=True)
class DynamicGroup:
    """A row index and the variables with one entry per row it maps: its tables and their
    per-row optimizer state."""

    index: object
    per_row: tuple
    stored_rows: object  # (arrays, name) -> its array in a checkpoint file, or None

    def variables(self):
        """Every variable of the group (kept out of the rest of the checkpoint)."""
        return [*self.per_row, *self.index.state, self.index.step]


def groups(variables, state):
    """The DynamicGroups of the tables `variables` (with their optimizer state: `state`, a
    TableStateSource, tfscale.embedding.strategy)."""
    by_index = {}
    for table in tables_of(variables):
        by_index.setdefault(id(table.row_index), (table.row_index, []))[1].extend(
            [table.variable, *state.per_row(table.variable)])
    return [DynamicGroup(index, tuple(per_row), state.stored_rows)
            for index, per_row in by_index.values()]


class ById:
    """The by-id TableCheckpoint (module docstring); its parts are DynamicGroups."""

    def parts(self, variables, state):
        return groups(variables, state)

    def variables(self, parts):
        return [variable for group in parts for variable in group.variables()]

    def check_matches(self, parts, directory):
        check_matches(parts, directory)

    def save(self, parts, directory):
        save(parts, directory)

    def restore(self, parts, directory):
        restore(parts, directory)

    def restore_rank_local(self, parts, directory):
        """Every rank's rows are its own: all of them."""
        restore(parts, directory)


BY_ID = ById()


def check_matches(dynamic_groups, directory):
    """A UserError when the checkpoint `directory` and the model disagree on holding dynamic
    tables (before anything is restored)."""
    held = bool(_files(directory))
    if dynamic_groups and not held:
        raise UserError(f"checkpoint {directory} was written with fixed embedding tables; this "
                        "model's are dynamic: resume with the tables it was trained with "
                        "(FieldEmbedding's `sharding`)")
    if held and not dynamic_groups:
        raise UserError(f"checkpoint {directory} holds dynamic embedding tables; this model's are "
                        "fixed: resume with `sharding=\"dynamic\"`, as it was trained")


def save(dynamic_groups, directory):
    """Writes this rank's rows of `dynamic_groups` into `directory` (every rank calls it)."""
    if not dynamic_groups:
        return
    arrays = {}
    for group in dynamic_groups:
        index = group.index
        held, keys = index.in_use()
        named = {"keys": keys, "rows": held,
                 "last_seen": tf.gather(index.last_seen.value, held),
                 "seen_count": tf.gather(index.seen_count.value, held),
                 "free_rows": tf.gather(index.free_rows.value, tf.range(index.free_count.value)),
                 "free_count": index.free_count.value, "next_row": index.next_row.value,
                 "step": index.step.value}
        if index.sketch is not None:
            named["sketch"] = index.sketch.value
        for variable in group.per_row:
            named[variable.path] = tf.gather(variable.value, held)
        arrays.update({f"{index.path}:{name}": np.asarray(value) for name, value in named.items()})
    np.savez(os.path.join(directory, _FILE.format(distributed.rank(), distributed.size())),
             **stored_arrays.for_npz(arrays))


def restore(dynamic_groups, directory):
    """Assigns this rank's rows of `dynamic_groups` from the checkpoint `directory` and
    rebuilds the id maps; a UserError when the checkpoint and the model disagree on holding
    dynamic tables, or a rank's rows cannot hold the ids it now owns."""
    files = _files(directory)
    check_matches(dynamic_groups, directory)
    if not dynamic_groups:
        return
    num_ranks = files[0][2]
    stored = [np.load(path) for path, _, _ in files]
    try:
        for group in dynamic_groups:
            own = stored[distributed.rank()] if num_ranks == distributed.size() else None
            if own is not None and f"{group.index.path}:next_row" in own.files:
                _restore_in_place(group, own)
            else:
                _restore_by_key(group, stored)
            group.index.rebuild_map()
    finally:
        for arrays in stored:
            arrays.close()


def _restore_in_place(group, arrays):
    """Every row back at its position (the checkpoint's rank is this one)."""
    index = group.index
    named = _named(arrays, group)
    handed_out, rows = int(named("next_row")), named("rows")
    _write_rows(index.row_ids, handed_out, rows, named("keys"), NO_ROW)
    _write_rows(index.last_seen, handed_out, rows, named("last_seen"), 0)
    _write_rows(index.seen_count, handed_out, rows, named("seen_count"), 0)
    stack = named("free_rows")
    _write_rows(index.free_rows, len(stack), np.arange(len(stack)), stack, 0)
    index.free_count.assign(len(stack))
    index.next_row.assign(handed_out)
    index.step.assign(named("step"))
    if index.sketch is not None:
        index.sketch.assign(named("sketch"))
    for variable in group.per_row:
        _write_rows(variable, handed_out, rows, named(variable.path), 0)


def _restore_by_key(group, every_rank):
    """The keys this rank owns now, from every rank's arrays, in rows 0, 1, ... by key."""
    index = group.index
    parts = [_named(arrays, group) for arrays in every_rank]
    keys = np.concatenate([named("keys") for named in parts])
    mine = np.flatnonzero(keys % distributed.size() == distributed.rank())
    mine = mine[np.argsort(keys[mine], kind="stable")]
    if len(mine) > index.rows:
        raise UserError(f"the checkpoint's dynamic tables hold {len(mine):,} ids for rank "
                        f"{distributed.rank()}, which holds {index.rows:,} rows: resume with a "
                        "larger `capacity` or more ranks")
    count = len(mine)
    rows = np.arange(count)

    def gathered(name):
        return np.concatenate([named(name) for named in parts])[mine]

    _write_rows(index.row_ids, count, rows, keys[mine], NO_ROW)
    _write_rows(index.last_seen, count, rows, gathered("last_seen"), 0)
    _write_rows(index.seen_count, count, rows, gathered("seen_count"), 0)
    index.free_count.assign(0)
    index.next_row.assign(count)
    index.step.assign(parts[0]("step"))
    if index.sketch is not None:
        total = np.sum([named("sketch").astype(np.int64) for named in parts], axis=0)
        index.sketch.assign(np.minimum(total, index.min_count).astype(np.int32))
    for variable in group.per_row:
        _write_rows(variable, count, rows, gathered(variable.path), 0)


def _named(arrays, group):
    """name -> the checkpoint's array of `group`'s index's `name`; a UserError when it is
    missing."""
    def named(name):
        key = f"{group.index.path}:{name}"
        values = group.stored_rows(arrays, key)
        if values is None:
            raise UserError(f"the checkpoint's dynamic tables have no {key}: resume with the "
                            "model and optimizer it was written with")
        return values

    return named


def _write_rows(variable, count, rows, values, fill):
    """Rows 0 .. `count` - 1 of `variable`: `values` at `rows`, `fill` at the others; the rows
    from `count` on stay as they are (unwritten in a new model)."""
    part = np.full((count, *variable.shape[1:]), fill, dtype=variable.dtype)
    part[rows] = values
    variable.value.scatter_update(tf.IndexedSlices(part, tf.range(count, dtype=tf.int64)))


def _files(directory):
    """(path, rank, ranks) of each dynamic-*.npz in `directory`, by rank; a UserError when they
    are not one file from each rank of one job."""
    found = []
    for path in glob.glob(os.path.join(directory, "dynamic-*-of-*.npz")):
        match = _FILE_PATTERN.search(path)
        if match:
            found.append((path, int(match.group(1)), int(match.group(2))))
    found.sort(key=lambda entry: entry[1])
    if found and [(rank, ranks) for _, rank, ranks in found] != [
            (rank, found[0][2]) for rank in range(found[0][2])]:
        raise UserError(f"checkpoint {directory} holds dynamic table files "
                        f"{sorted(os.path.basename(p) for p, _, _ in found)}, not one from each "
                        "rank of one job: restore from a complete checkpoint")
    return found
