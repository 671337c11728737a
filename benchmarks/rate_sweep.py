"""Which runs a learning-rate sweep needs next, from the runs already finished: each grid grows
outward while its best rate is at an edge, and the best optimizers at a batch are rerun with
further seeds. No TensorFlow and no flags (benchmarks.came_sweep runs what this asks for)."""

import dataclasses
import json
import math


@dataclasses.dataclass(frozen=True)
class Grid:
    """One model's sweep: every optimizer's starting rates at every batch size.

    part: the model's name in the records; batches: batch sizes; rates: {optimizer: rates};
    config: what a result depends on besides batch, optimizer, rate and seed (a record of
    another config is another run); reseeded: how many of the best optimizers at each batch
    run again, at their best rate, with the further seeds."""
    part: str
    batches: tuple
    rates: dict
    config: dict
    reseeded: int


def ladder_neighbour(rate, upward):
    """The next rate of the 1-3-10 ladder above (or below) `rate`."""
    exponent = math.floor(math.log10(rate) + 1e-9)
    low = rate / 10 ** exponent < 2  # a 1, else a 3
    if upward:
        value = 3 * 10 ** exponent if low else 10 ** (exponent + 1)
    else:
        value = 3 * 10 ** (exponent - 1) if low else 10 ** exponent
    return float(f"{value:.0e}")


def run(grid, batch, optimizer, rate, seed):
    return dict(part=grid.part, batch=batch, optimizer=optimizer, rate=rate, seed=seed,
                config=grid.config)


def key(record):
    """A run's identity: a record of it, finished or not, has this key."""
    return json.dumps({k: record[k] for k in ("part", "batch", "optimizer", "rate", "seed",
                                              "config")}, sort_keys=True)


def loss_of(record):
    """What the sweep minimises: the final validation loss, or minus the test AUC; inf when the
    run diverged."""
    value = record["final_loss"] if "final_loss" in record else -record["auc"]
    return value if math.isfinite(value) else math.inf


def finished_rates(done, grid, batch, optimizer, seed):
    """{rate: record} of one optimizer's finished runs at one batch and seed."""
    return {r["rate"]: r for r in done.values()
            if (r["part"], r["batch"], r["optimizer"], r["seed"], r["config"])
            == (grid.part, batch, optimizer, seed, grid.config)}


def best_rate(finished):
    return min(finished, key=lambda rate: loss_of(finished[rate]))


def wanted_runs(done, grids, seeds, max_extensions):
    """The runs the sweep needs now and has not finished (`done`: key -> record): the grids'
    rates at the first seed; for a grid whose best is at an edge of the rates run, the next
    ladder rate outward (at most `max_extensions` added per grid); once every optimizer at a
    batch is bracketed (or out of extensions), the grid's `reseeded` best at their best rate
    with each further seed."""
    first, *others = seeds
    wanted = []
    for grid in grids:
        for batch in grid.batches:
            best = {}
            for optimizer, starting in grid.rates.items():
                finished = finished_rates(done, grid, batch, optimizer, first)
                rates = sorted(set(starting) | set(finished))
                missing = [rate for rate in rates if rate not in finished]
                if missing:
                    wanted += [run(grid, batch, optimizer, rate, first) for rate in missing]
                    continue
                rate = best_rate(finished)
                at_edge = rate in (rates[0], rates[-1])
                if at_edge and len(set(rates) - set(starting)) < max_extensions:
                    outward = ladder_neighbour(rate, upward=rate == rates[-1])
                    wanted.append(run(grid, batch, optimizer, outward, first))
                    continue
                best[optimizer] = (loss_of(finished[rate]), rate)
            if len(best) == len(grid.rates):
                for optimizer in sorted(best, key=best.get)[:grid.reseeded]:
                    wanted += [run(grid, batch, optimizer, best[optimizer][1], seed)
                               for seed in others]
    return [wanted_run for wanted_run in wanted if key(wanted_run) not in done]
