"""Per-rank data of different lengths given to a TrainStep model's `fit` and `evaluate` through
Keras's own data adapters, on 2 ranks of each engine (tests/multiworker/uneven_fit.py): steps
agreed, or refused before the first step on every rank, never a hang."""

import pytest

from tests import grouped_launches

UNEVEN_FIT = grouped_launches.job("uneven-fit", 2, "tests.multiworker.uneven_fit", timeout=120,
                                  engines=grouped_launches.ENGINES)
SCENARIOS = ("arrays refused", "datasets refused", "equal steps train", "unknown length agreed",
             "steps_per_epoch refused", "steps_per_epoch agreed", "row-sharded evaluation")


@pytest.mark.parametrize("engine", grouped_launches.ENGINES)
def test_uneven_data_agreed_or_refused_on_every_rank(launched_jobs, engine):
    """Every scenario passed on both ranks, and the job ended (no rank waited forever)."""
    job = launched_jobs[grouped_launches.on_engine(UNEVEN_FIT, engine)]
    assert job.returncode == 0, job.output
    for scenario in SCENARIOS:
        for rank in (0, 1):
            assert f"rank {rank}: {scenario} ok" in job.stdout(rank), (scenario, job.output)
