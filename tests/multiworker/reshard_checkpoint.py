"""Checkpoints of embedding tables by global row, at any number of ranks
(tfscale.checkpoints.store, tfscale.embedding.by_row_checkpoint). A job of
tests/multiworker/jobs.py, in one process or under horovodrun:

    main("write", SHARDING, DIR)   for each optimizer of OPTIMIZERS, trains a small
        DeepFM with SHARDING tables for 3 steps, saves a checkpoint in DIR/<optimizer>, and
        rank 0 writes DIR/<optimizer>/expected.npz: every variable, the tables and their
        optimizer state whole (gathered for the test only);
    main("read", SHARDING, DIR)    builds the same models with SHARDING tables at
        this job's number of ranks, restores DIR/<optimizer> as the training run does (rank 0
        reads, the others finish the restore, rank 0's replicated state is broadcast) and checks
        that every variable equals expected.npz exactly, then trains 2 more steps with a finite
        loss.
Adam's moments have a row per table row; CAME's row statistics too, and its column statistics,
which span every row, are whole on every rank.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import keras  # noqa: E402
import numpy as np  # noqa: E402

import models  # noqa: E402
from tests.multiworker.sharded_steps import rank_batches, whole_state  # noqa: E402
from tfscale import distributed  # noqa: E402
from tfscale.data.synthetic import SyntheticCTR  # noqa: E402
from tfscale.optimizers import CAME, FusedAdam  # noqa: E402
from tfscale.optimizers.table_state import local_variables  # noqa: E402
from tfscale.checkpoints.store import CheckpointStore  # noqa: E402
from tfscale.training.run import build_model_and_optimizer  # noqa: E402

OPTIMIZERS = {"adam": lambda: FusedAdam(learning_rate=1e-2), "came": lambda: CAME(1e-3)}


def build(sharding, optimizer, directory):
    data = SyntheticCTR(seed=0, train_rows=384 * 20, test_rows=256, vocabulary_scale=0.002)
    keras.utils.set_random_seed(0)
    model = models.build_model("deepfm", data.schema, hidden_units=[32, 32],
                               embedding_sharding=sharding)
    model.compile(optimizer=OPTIMIZERS[optimizer](), loss="binary_crossentropy")
    build_model_and_optimizer(model, data.schema)
    distributed.broadcast_model_and_optimizer(model, local=local_variables(model))
    return model, data, CheckpointStore(os.path.join(directory, optimizer), model=model,
                                        optimizer=model.optimizer)


def write(sharding, optimizer, directory):
    model, data, store = build(sharding, optimizer, directory)
    batches = iter(rank_batches(data, distributed.rank(), distributed.size()))
    for _ in range(3):
        model.train_on_batch(*next(batches))
    store.save(3, {"epoch": 0, "batches_done": 3})
    state = whole_state(model)
    if distributed.is_chief():
        np.savez(os.path.join(store.directory, "expected.npz"), *state)


def read(sharding, optimizer, directory):
    model, data, store = build(sharding, optimizer, directory)
    distributed.broadcast_from_chief(lambda: store.restore_latest() and None,
                                     name="restore")
    distributed.broadcast_model_and_optimizer(model, local=local_variables(model))
    store.finish_restore()
    with np.load(os.path.join(store.directory, "expected.npz")) as saved:
        expected = [saved[f"arr_{i}"] for i in range(len(saved.files))]
    state = whole_state(model)
    assert len(state) == len(expected)
    for i, (got, want) in enumerate(zip(state, expected)):
        np.testing.assert_array_equal(got, want, err_msg=f"variable {i}")
    batches = iter(rank_batches(data, distributed.rank(), distributed.size()))
    for _ in range(2):
        loss = model.train_on_batch(*next(batches))
        assert np.isfinite(loss), loss
    print(f"rank {distributed.rank()} of {distributed.size()}: restored {sharding} tables "
          f"and {optimizer} state exactly and trained on", flush=True)


def main(mode, sharding, directory):
    if distributed.launched_by_horovodrun():
        distributed.init()
    for name in OPTIMIZERS:
        {"write": write, "read": read}[mode](sharding, name, directory)
