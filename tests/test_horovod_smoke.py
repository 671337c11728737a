"""The Horovod build works: a 2-rank Gloo allreduce under horovodrun; and a job that outlives
the harness's timeout is killed with all its ranks."""

import os
import subprocess
import uuid

import pytest

from tests.horovod_launch import horovodrun


def test_two_rank_allreduce_under_horovodrun():
    result = horovodrun(2, ["tests/multiworker/allreduce_smoke.py"])
    assert result.returncode == 0, result.stdout
    assert result.stdout.count("allreduce sum [3.0, 3.0, 3.0, 3.0] (expected 3) OK") == 2, result.stdout


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
    with pytest.raises(subprocess.TimeoutExpired) as timed_out:
        horovodrun(2, ["tests/multiworker/hang.py", marker], timeout=20)
    output = timed_out.value.output
    assert f"rank 0 up, marker {marker}" in output and f"rank 1 up, marker {marker}" in output
    assert _processes_naming(marker) == []
