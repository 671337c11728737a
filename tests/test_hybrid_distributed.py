"""Hybrid training under horovodrun -np 2 (Gloo on loopback): the launcher with CowClip and
embedding updates one step stale reports the placement and its TensorBoard scalars (unique-id
rate, staleness, embedding exchange time), and a stopped-and-resumed run ends bitwise equal to
an uninterrupted one, each rank's queue of pending gradients included. (2 ranks at B/2 against
1 process at B with stale updates: tests/test_distributed.py.)"""

import numpy as np
import pytest
import tensorflow as tf

from tests import grouped_launches
from tests.run_outputs import checkpoint_values, train_scalars
from tests.test_distributed import SMALL_RUN

RUN_DIR = "{dir}/hybrid"
HYBRID_RUN = [*SMALL_RUN, "--optimizer=cowclip", "--embedding_staleness=1",
              "--precision=mixed_float16"]
# The whole run with logs and checkpoints; one stopped after step 17, resumed in a later launch.
WHOLE = grouped_launches.launcher_job("hybrid-whole", 2, *HYBRID_RUN, f"--logdir={RUN_DIR}/logs",
                                      f"--checkpoint_dir={RUN_DIR}/whole")
STOPPED = grouped_launches.launcher_job("hybrid-stopped", 2, *HYBRID_RUN,
                                        f"--logdir={RUN_DIR}/split_logs",
                                        f"--checkpoint_dir={RUN_DIR}/split",
                                        "--stop_after_steps=17")
RESUMED = grouped_launches.launcher_job("hybrid-resumed", 2, *HYBRID_RUN,
                                        f"--logdir={RUN_DIR}/split_logs",
                                        f"--checkpoint_dir={RUN_DIR}/split", "--resume", stage=1)


@pytest.fixture(scope="module")
def whole_run(launched_jobs):
    job = launched_jobs[WHOLE]
    assert job.returncode == 0, job.output
    return job.output, launched_jobs.path(RUN_DIR)


def test_launcher_reports_placement_and_embedding_scalars(whole_run):
    out, run_dir = whole_run
    gpus = tf.config.list_logical_devices("GPU")  # the ranks see this machine's devices
    dense = gpus[0].name.rsplit("device:", 1)[-1] if gpus else "CPU:0 (no accelerator found)"
    # 26 MB: the tables, Adam's moments and the catch-up's last step per row (CowClip's scalable
    # mode catches rows up).
    assert (f"placement: embedding tables on CPU:0, dense model on {dense}; "
            "tables replicated: 374,398 rows, 26 MB with optimizer state; "
            "de-duplicated lookups, embedding updates 1 step(s) stale") in out, out
    scalars = train_scalars(f"{run_dir}/logs")
    assert scalars["embedding/staleness"] == 1, scalars
    assert 0 < scalars["embedding/unique_id_rate"] < 1, scalars
    assert scalars["exchange/embedding_seconds"] > 0, scalars
    assert scalars["exchange/bytes_sent"] > 0, scalars


def test_resumed_stale_run_equals_uninterrupted_one(whole_run, launched_jobs):
    stopped, resumed = launched_jobs[STOPPED], launched_jobs[RESUMED]
    assert stopped.returncode == 0, stopped.output
    assert resumed.returncode == 0, resumed.output
    assert "resumed from global step 10: epoch 1, batch 10" in resumed.output, resumed.output
    expected = checkpoint_values(f"{whole_run[1]}/whole")
    actual = checkpoint_values(f"{whole_run[1]}/split")
    assert expected.keys() == actual.keys()
    queued = [name for name in expected
              if name.startswith("per_rank/staleness/") and name.endswith("values@rank0")]
    assert len(queued) == 2, list(expected)  # the deep and the wide table
    for name in queued:  # one step of each rank's own rows waits in its queue
        other = expected[name.replace("@rank0", "@rank1")]
        assert len(expected[name]) > 0 and len(other) > 0, name
        assert expected[name].shape != other.shape or not np.array_equal(expected[name], other)
    for name in expected:
        np.testing.assert_array_equal(expected[name], actual[name], err_msg=name)
