"""The launcher (launch.train) with the state it resumes from made visible, for
tests/test_sharding.py: a job of tests/multiworker/jobs.py, `main(OUT.npz, *flags)` with
launch.train flags that include --resume.

It trains exactly as `python -m launch.train <flags>` does and, right after the checkpoint is
restored on every rank (CheckpointStore.finish_restore), rank 0 writes to OUT.npz every embedding
table and each of its optimizer variables with one row per table row, whole: gathered from every
rank by global id (for the comparison only; training never gathers a table)."""

import numpy as np

from tests.multiworker import launcher_run
from tests.multiworker.sharded_steps import gathered
from tfscale import distributed
from tfscale.embedding.by_row_checkpoint import BY_ROW
from tfscale.checkpoints.store import CheckpointStore


def main(out, *flags_given):
    finish_restore = CheckpointStore.finish_restore

    def finish_restore_and_write(store):
        """CheckpointStore.finish_restore, then the restored tables and their per-row state,
        whole, to `out` (every rank takes part in the gathering; rank 0 writes)."""
        finish_restore(store)
        by_row = [entry for fmt, parts in store._table_parts() if fmt is BY_ROW
                  for entry in parts]
        whole = {entry.name: gathered(entry.variable, entry.shard) for entry in by_row}
        if distributed.is_chief():
            np.savez(out, **whole)

    CheckpointStore.finish_restore = finish_restore_and_write
    try:
        return launcher_run.main(*flags_given)
    finally:
        CheckpointStore.finish_restore = finish_restore
