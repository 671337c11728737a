"""The launcher (launch.train) with the state it resumes from made visible, for
tests/test_sharding.py. Run as

    launcher_resume.py OUT.npz <launch.train flags, with --resume>

it trains exactly as `python -m launch.train <flags>` does and, right after the checkpoint is
restored on every rank (CheckpointStore.finish_restore), rank 0 writes to OUT.npz every embedding
table and each of its optimizer variables with one row per table row, whole: gathered from every
rank by global id (for the comparison only; training never gathers a table)."""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
from launch import quiet_tf  # noqa: E402,F401  (first, as in launch.train)

import numpy as np  # noqa: E402
from absl import app  # noqa: E402

from launch import train  # noqa: E402
from launch.user_errors import absl_main  # noqa: E402
from tests.multiworker.sharded_steps import gathered  # noqa: E402
from tfscale import distributed  # noqa: E402
from tfscale.training.checkpoints import CheckpointStore  # noqa: E402

OUT = sys.argv.pop(1)
_finish_restore = CheckpointStore.finish_restore


def finish_restore_and_write(store):
    """CheckpointStore.finish_restore, then the restored tables and their per-row state, whole,
    to OUT (every rank takes part in the gathering; rank 0 writes)."""
    _finish_restore(store)
    whole = {entry.name: gathered(entry.variable, entry.shard) for entry in store._tables()}
    if distributed.is_chief():
        np.savez(OUT, **whole)


CheckpointStore.finish_restore = finish_restore_and_write

if __name__ == "__main__":
    app.run(absl_main(train.run))
