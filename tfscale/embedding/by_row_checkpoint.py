"""The by-row checkpoint format (`BY_ROW`, a TableCheckpoint: tfscale.embedding.strategy) of the
tables whose strategy holds fixed rows (replicated, row-sharded) and of a user's Keras Embedding
tables (docs/sharding.md).

Every such table, and each optimizer variable of it with one entry per table row
(Adam's moments, CAME's row factors), is written apart from the rest of the checkpoint: each
rank that holds rows writes them to `tables-<i>-of-<n>.npz` in the checkpoint directory (rank r
of P with row-sharded tables: its shard, rows r, r + P, ...; with replicated tables rank 0 alone,
as shard 0 of 1, since every rank holds the same rows). Nothing gathers a table on one rank. A
restore reads every such file and keeps the rows this rank holds now (the global id of row k of
shard i of n is i + n k), so a checkpoint resumes at another number of ranks, and replicated
tables resume sharded and the reverse."""

import dataclasses
import glob
import os
import re

import numpy as np

from tfscale import distributed
from tfscale.embedding import stored_arrays
from tfscale.embedding.table import RowShard, shard_of
from tfscale.errors import UserError

_FILE = "tables-{}-of-{}.npz"
_FILE_PATTERN = re.compile(r"tables-(\d+)-of-(\d+)\.npz$")


@dataclasses.dataclass(frozen=True)
class TableVariable:
    """A variable with one entry per row of a table: the table itself or one of its slots."""

    name: str
    variable: object
    shard: RowShard  # the rows this rank holds (all of them: shard 0 of 1)
    stored_rows: object = None  # (arrays, name) -> its array in a checkpoint file, or None

    def read(self, arrays):
        """This variable's array among a checkpoint file's `arrays`, or None."""
        if self.stored_rows is not None:
            return self.stored_rows(arrays, self.name)
        return stored_arrays.read(arrays, self.name)


class ByRow:
    """The by-row TableCheckpoint (module docstring); its parts are TableVariables."""

    def parts(self, variables, state):
        """The TableVariables of the tables `variables` and of their optimizer state (`state`:
        a TableStateSource, tfscale.embedding.strategy)."""
        entries = []
        for table in variables:
            shard = shard_of(table) or RowShard(int(table.shape[0]), 1, 0)
            entries += [TableVariable(v.path, v, shard, state.stored_rows)
                        for v in [table] + state.per_row(table)]
        return entries

    def variables(self, parts):
        return [entry.variable for entry in parts]

    def check_matches(self, parts, directory):
        """Nothing: `restore` names what is missing."""

    def save(self, parts, directory):
        save(parts, directory)

    def restore(self, parts, directory):
        restore(parts, directory)

    def restore_rank_local(self, parts, directory):
        """The rows of the sharded tables among `parts` (the others come with rank 0's
        broadcast)."""
        sharded = [entry for entry in parts if entry.shard.num_shards > 1]
        if sharded:
            restore(sharded, directory)


BY_ROW = ByRow()


def save(entries, directory):
    """Writes the rows this rank holds of `entries` into `directory` (on the ranks that hold rows
    no other rank writes: every rank when sharded, rank 0 when replicated)."""
    if not entries:
        return
    shard = entries[0].shard
    if shard.num_shards == 1 and not distributed.is_chief():
        return
    np.savez(os.path.join(directory, _FILE.format(shard.index, shard.num_shards)),
             **stored_arrays.for_npz({entry.name: entry.variable.numpy() for entry in entries}))


def restore(entries, directory):
    """Assigns to each of `entries` the rows this rank holds now, read from every table file in
    `directory`; a UserError when the files lack a variable or a row."""
    files = sorted(path for path in glob.glob(os.path.join(directory, "tables-*-of-*.npz"))
                   if _FILE_PATTERN.search(path))
    if entries and not files:
        raise UserError(f"checkpoint {directory} holds no embedding tables (tables-*.npz): it was "
                        "not written by this version; train anew")
    values = {entry.name: np.zeros(entry.variable.shape, entry.variable.dtype)
              for entry in entries}
    filled = {entry.name: 0 for entry in entries}
    for path in files:
        index, num_shards = map(int, _FILE_PATTERN.search(path).groups())
        with np.load(path) as stored:
            for entry in entries:
                rows = entry.read(stored)
                if rows is None:
                    raise UserError(f"checkpoint {path} has no {entry.name}: resume with the "
                                    "model and optimizer it was written with")
                global_ids = index + num_shards * np.arange(len(rows), dtype=np.int64)
                mine = global_ids % entry.shard.num_shards == entry.shard.index
                values[entry.name][global_ids[mine] // entry.shard.num_shards] = rows[mine]
                filled[entry.name] += int(mine.sum())
    for entry in entries:
        if filled[entry.name] != entry.variable.shape[0]:
            raise UserError(f"checkpoint {directory} holds {filled[entry.name]} of the "
                            f"{entry.variable.shape[0]} rows of {entry.name} this rank needs "
                            "(a missing or extra tables-*.npz file?)")
        entry.variable.assign(values[entry.name])
