"""Hybrid training under horovodrun -np 2 (Gloo on loopback): the launcher with CowClip and
embedding updates one step stale reports the placement and its TensorBoard scalars (unique-id
rate, staleness, embedding exchange time), and a stopped-and-resumed run ends bitwise equal to
an uninterrupted one, each rank's queue of pending gradients included. (2 ranks at B/2 against
1 process at B with stale updates: tests/test_distributed.py.)"""

import numpy as np
import pytest
import tensorflow as tf

from tests.horovod_launch import horovodrun
from tests.test_distributed import SMALL_RUN
from tests.test_launcher import checkpoint_values, train_scalars

HYBRID_FLAGS = ["--optimizer=cowclip", "--embedding_staleness=1", "--precision=mixed_float16",
                "--logdir={run_dir}/logs"]


def _run(run_dir, *flags):
    common = [flag.format(run_dir=run_dir) for flag in [*SMALL_RUN, *HYBRID_FLAGS]]
    return horovodrun(2, [*common, f"--checkpoint_dir={run_dir}/ckpt", *flags])


@pytest.fixture(scope="module")
def whole_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("hybrid_whole")
    result = _run(run_dir)
    assert result.returncode == 0, result.stdout
    return result.stdout, run_dir


def test_launcher_reports_placement_and_embedding_scalars(whole_run):
    out, run_dir = whole_run
    gpus = tf.config.list_logical_devices("GPU")  # the ranks see this machine's devices
    dense = gpus[0].name.rsplit("device:", 1)[-1] if gpus else "CPU:0 (no accelerator found)"
    assert (f"placement: embedding tables on CPU:0, dense model on {dense}; "
            "tables replicated: 374,398 rows, 25 MB with optimizer state; "
            "de-duplicated lookups, embedding updates 1 step(s) stale") in out, out
    scalars = train_scalars(f"{run_dir}/logs")
    assert scalars["embedding/staleness"] == 1, scalars
    assert 0 < scalars["embedding/unique_id_rate"] < 1, scalars
    assert scalars["exchange/embedding_seconds"] > 0, scalars
    assert scalars["exchange/bytes_sent"] > 0, scalars


def test_resumed_stale_run_equals_uninterrupted_one(whole_run, tmp_path):
    first = _run(tmp_path, "--stop_after_steps=17")
    assert first.returncode == 0, first.stdout
    second = _run(tmp_path, "--resume")
    assert second.returncode == 0, second.stdout
    assert "resumed from global step 10: epoch 1, batch 10" in second.stdout, second.stdout
    expected = checkpoint_values(f"{whole_run[1]}/ckpt")
    actual = checkpoint_values(f"{tmp_path}/ckpt")
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
