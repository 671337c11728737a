"""The learning-rate sweep of the CAME benchmark asks for the runs a bracketed grid needs:
benchmarks/rate_sweep.py."""

import math

import pytest

from benchmarks.rate_sweep import Grid, key, ladder_neighbour, run, wanted_runs

GRID = Grid(part="lm", batches=(4,), rates={"adam": (1e-3, 3e-3), "came": (1e-4, 3e-4),
                                            "adafactor": (1e-2, 3e-2)},
            config={"steps": 10}, reseeded=2)


def finish(done, wanted, losses):
    for wanted_run in wanted:
        done[key(wanted_run)] = dict(wanted_run, final_loss=losses[(wanted_run["optimizer"],
                                                                    wanted_run["rate"])])


def described(wanted):
    return sorted((r["optimizer"], r["rate"], r["seed"]) for r in wanted)


@pytest.mark.parametrize("rate, upward, expected", [
    (1e-3, True, 3e-3), (3e-3, True, 1e-2), (1e-3, False, 3e-4), (3e-4, False, 1e-4),
    (0.1, True, 0.3), (0.3, False, 0.1)])
def test_the_ladder_has_1_and_3_in_each_decade(rate, upward, expected):
    assert ladder_neighbour(rate, upward) == pytest.approx(expected)


def test_a_grid_grows_outward_until_its_best_is_inside_then_the_two_best_get_more_seeds():
    losses = {("adam", 1e-3): 2.0, ("adam", 3e-3): 1.5, ("adam", 1e-2): 1.6,
              ("came", 1e-4): 1.4, ("came", 3e-4): 1.45, ("came", 3e-5): 1.7,
              ("adafactor", 1e-2): 1.9, ("adafactor", 3e-2): 1.8, ("adafactor", 0.1): 1.85}
    done = {}
    wanted = wanted_runs(done, [GRID], seeds=[0, 1], max_extensions=2)
    assert described(wanted) == sorted((o, r, 0) for o, rates in GRID.rates.items()
                                       for r in rates)
    finish(done, wanted, losses)
    wanted = wanted_runs(done, [GRID], seeds=[0, 1], max_extensions=2)
    # Every best is at an edge: adam's top, came's bottom, adafactor's top.
    assert described(wanted) == [("adafactor", 0.1, 0), ("adam", 1e-2, 0), ("came", 3e-5, 0)]
    finish(done, wanted, losses)
    wanted = wanted_runs(done, [GRID], seeds=[0, 1], max_extensions=2)
    # Bracketed now; the two best (came 1.4, adam 1.5) again with seed 1 at their best rates.
    assert described(wanted) == [("adam", 3e-3, 1), ("came", 1e-4, 1)]
    finish(done, wanted, losses)
    assert wanted_runs(done, [GRID], seeds=[0, 1], max_extensions=2) == []
    all_three = Grid(**{**GRID.__dict__, "reseeded": 3})
    assert described(wanted_runs(done, [all_three], seeds=[0, 1], max_extensions=2)) == [
        ("adafactor", 3e-2, 1)]


def test_extensions_stop_at_the_limit_and_a_diverged_run_is_the_worst():
    grid = Grid(part="ctr", batches=(8192,), rates={"came": (1e-4,)}, config={}, reseeded=0)
    done = {}
    aucs = {1e-4: 0.70, 3e-4: 0.71, 1e-3: math.nan}
    for _ in range(5):
        wanted = wanted_runs(done, [grid], seeds=[0], max_extensions=2)
        for wanted_run in wanted:
            done[key(wanted_run)] = dict(wanted_run, auc=aucs.get(wanted_run["rate"], 0.5))
    rates = sorted(record["rate"] for record in done.values())
    # 1e-4 alone is at both edges: up to 3e-4 (the top edge is tried first), then, 3e-4 being
    # at the top, up to 1e-3, which diverged: the two extensions are used, and 1e-3 is no best.
    assert rates == pytest.approx([1e-4, 3e-4, 1e-3])


def test_a_record_of_another_configuration_is_another_run():
    other = Grid(**{**GRID.__dict__, "config": {"steps": 20}})
    done = {}
    finish(done, wanted_runs(done, [other], seeds=[0], max_extensions=0),
           {(o, r): 1.0 for o, rates in GRID.rates.items() for r in rates})
    assert len(wanted_runs(done, [GRID], seeds=[0], max_extensions=0)) == 6
    assert run(GRID, 4, "adam", 1e-3, 0)["config"] == {"steps": 10}
