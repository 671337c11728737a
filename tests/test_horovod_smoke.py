"""The Horovod build works: a 2-rank Gloo allreduce under horovodrun."""

from tests.horovod_launch import horovodrun


def test_two_rank_allreduce_under_horovodrun():
    result = horovodrun(2, ["tests/multiworker/allreduce_smoke.py"])
    assert result.returncode == 0, result.stdout
    assert result.stdout.count("allreduce sum [3.0, 3.0, 3.0, 3.0] (expected 3) OK") == 2, result.stdout
