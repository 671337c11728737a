"""The by-id checkpoint format (`BY_ID`, a TableCheckpoint: tfscale.embedding.strategy) of
tables whose rows are given to ids, with a row index (docs/dynamic.md).

Every rank writes `dynamic-<rank>-of-<ranks>.npz` into the checkpoint directory, per row index
(one per FieldEmbedding with dynamic tables, its arrays named "<index path>:<name>"): for each row
in use its key, its position, its rows of the group's tables and their per-row optimizer state,
its last-seen step and count; the free-row stack; the admission sketch; the step. A restore at
the same number of ranks reads the rank's own file and puts every row back where it was (a
bitwise resume). At another number of ranks, every rank reads every file and keeps the keys it
owns now (key mod P) in rows 0, 1, ... in key order; the sketches are summed and capped at
`min_count`, which is the sketch one process would hold, so pending ids keep their counts."""

import dataclasses
import glob
import os
import re

import numpy as np

from tfscale import distributed
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
        row_ids = index.row_ids.numpy()
        held = np.flatnonzero(row_ids != NO_ROW)
        named = {"keys": row_ids[held], "rows": held,
                 "last_seen": index.last_seen.numpy()[held],
                 "seen_count": index.seen_count.numpy()[held],
                 "free_rows": index.free_rows.numpy(), "free_count": index.free_count.numpy(),
                 "step": index.step.numpy()}
        if index.sketch is not None:
            named["sketch"] = index.sketch.numpy()
        for variable in group.per_row:
            named[variable.path] = variable.numpy()[held]
        arrays.update({f"{index.path}:{name}": value for name, value in named.items()})
    np.savez(os.path.join(directory, _FILE.format(distributed.rank(), distributed.size())),
             **arrays)


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
            if num_ranks == distributed.size():
                _restore_in_place(group, stored[distributed.rank()])
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
    rows = named("rows")
    _assign_rows(index.row_ids, rows, named("keys"), NO_ROW)
    _assign_rows(index.last_seen, rows, named("last_seen"), 0)
    _assign_rows(index.seen_count, rows, named("seen_count"), 0)
    index.free_rows.assign(named("free_rows"))
    index.step.assign(named("step"))
    if index.sketch is not None:
        index.sketch.assign(named("sketch"))
    for variable in group.per_row:
        _assign_rows(variable, rows, named(variable.path), 0)


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
    rows = np.arange(len(mine))

    def gathered(name):
        return np.concatenate([named(name) for named in parts])[mine]

    _assign_rows(index.row_ids, rows, keys[mine], NO_ROW)
    _assign_rows(index.last_seen, rows, gathered("last_seen"), 0)
    _assign_rows(index.seen_count, rows, gathered("seen_count"), 0)
    index.free_rows.assign(np.arange(index.rows - 1, len(mine) - 1, -1).tolist()
                           + [0] * len(mine))
    index.step.assign(parts[0]("step"))
    if index.sketch is not None:
        total = np.sum([named("sketch").astype(np.int64) for named in parts], axis=0)
        index.sketch.assign(np.minimum(total, index.min_count).astype(np.int32))
    for variable in group.per_row:
        _assign_rows(variable, rows, gathered(variable.path), 0)


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


def _assign_rows(variable, rows, values, fill):
    """`variable` with `values` at `rows` and `fill` elsewhere."""
    whole = np.full(variable.shape, fill, dtype=variable.dtype)
    whole[rows] = values
    variable.assign(whole)


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
