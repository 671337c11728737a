"""The Horovod build works: a 2-rank Gloo allreduce under horovodrun (a job of the grouped
launches, tests/grouped_launches.py); and a job that outlives the harness's timeout is killed with
all its ranks."""

import os
import subprocess
import uuid

import pytest

from tests import grouped_launches
from tests.horovod_launch import horovodrun


ALLREDUCE = grouped_launches.job("allreduce-smoke", 2, "tests.multiworker.allreduce_smoke")


def test_two_rank_allreduce_under_horovodrun(launched_jobs):
    result = launched_jobs[ALLREDUCE]
    assert result.returncode == 0, result.output
    assert result.output.count("allreduce sum [3.0, 3.0, 3.0, 3.0] (expected 3) OK") == 2, (
        result.output)


def _processes_naming(marker):
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                if marker.encode() in cmdline.read():
                    found.append(pid)
        except OSError:
            continue
    return found


def test_a_job_past_its_timeout_is_killed_with_its_ranks():
    marker = f"hang-{uuid.uuid4().hex}"
    # horovodrun itself imports TensorFlow: under the grouped launches' load its ranks can take
    # 20 s to start. The wait overlaps those launches (this test runs before their readers).
    with pytest.raises(subprocess.TimeoutExpired) as timed_out:
        horovodrun(2, ["tests/multiworker/hang.py", marker], timeout=60)
    output = timed_out.value.output
    assert f"rank 0 up, marker {marker}" in output and f"rank 1 up, marker {marker}" in output
    assert _processes_naming(marker) == []
