"""One process group's collective timings, for benchmarks.engines (which launches it and keeps
its output); it runs under either launcher, on whichever engine that launcher starts:

    horovodrun -np P -H localhost:P --gloo python -m benchmarks.engine_collectives [ARGS]
    python -m tfscale.run -np P -m benchmarks.engine_collectives [ARGS]

ARGS: --sizes_mb=1,16,64 --warmup=2 --calls=10.

Every collective is the engine's own method (`engine.allreduce`, `allgather`, `alltoall`)
inside a tf.function, as tfscale's train steps call them. Tensors are float32 rows of 1 KiB
(256 floats); a size of S MiB is S * 1024 rows on every rank. Cases, for each size:

- `allreduce/equal`, `allgather/equal`, `alltoall/equal`: S MiB on every rank (alltoall: S/P to
  each rank);
- `allgather/uneven`, `alltoall/uneven`: rank r holds (r + 1)/P of S (the last rank all of it;
  alltoall: split equally between the destinations);
- `allgather/equal_mean`, `alltoall/equal_mean`: every rank holds the mean of the uneven sizes,
  the same total bytes as `uneven`, equal shapes;
- on TensorFlow's engine only, `allgather/runtime`, `alltoall/runtime`: the runtime's collective
  alone on the equal tensor (no size agreement, no padding, no mask: what the engine adds on top;
  called through the engine's private key functions, and left out if those are gone).

and once, size-independent: `allreduce/4B` and `allgather/4B` (one float32, one int32: the
latency of one collective), and on TensorFlow's engine `allgather/4B_runtime` (the runtime's
allgather alone: the engine's allgather is this size agreement plus the gather).

Each case is traced and run --warmup times (at least once; the rows it returns are checked);
then, after a barrier, --calls rounds each time one call of every case of the size, the order
rotating round by round (the same on every rank), so machine load meets every case alike. Every
rank prints one JSON line per case (marker "engine_collective"): its per-call wall times in ms
and their median."""

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

from benchmarks.engines import COLLECTIVE_MARKER as MARKER, ROW_FLOATS, per_rank_rows  # noqa: E402
from tfscale import distributed  # noqa: E402


def _rows(count, rank):
    return tf.fill([count, ROW_FLOATS], tf.constant(float(rank + 1)))


def cases_for_size(engine, megabytes):
    """[(op, variant, rows per rank, tf.function, arguments)] of one size, in a fixed order."""
    size, rank = engine.size, engine.rank
    tag = f"{megabytes:g}mb"
    cases = []

    def add(op, variant, rows, function, *arguments):
        cases.append((op, variant, rows, tf.function(function), arguments))

    rows = per_rank_rows(megabytes, size, "equal")
    equal = _rows(rows[rank], rank)
    add("allreduce", "equal", rows,
        lambda x: engine.allreduce(x, "sum", f"bench_allreduce_{tag}"), equal)
    for variant in ("equal", "uneven", "equal_mean"):
        rows = per_rank_rows(megabytes, size, variant)
        tensor = equal if variant == "equal" else _rows(rows[rank], rank)
        splits = tf.fill([size], rows[rank] // size)
        add("allgather", variant, rows,
            lambda x, v=variant: engine.allgather(x, f"bench_allgather_{v}_{tag}"), tensor)
        add("alltoall", variant, rows,
            lambda x, s, v=variant: engine.alltoall(x, s, f"bench_alltoall_{v}_{tag}"),
            tensor, splits)
    if _runtime_reachable(engine):
        from tensorflow.python.ops import collective_ops

        rows = per_rank_rows(megabytes, size, "equal")
        add("allgather", "runtime", rows,
            lambda x: engine._gather_equal(x, f"bench_allgather_runtime_{tag}"), equal)

        def alltoall_runtime(x):
            flat = tf.reshape(x, [size, -1])
            with tf.device("CPU:0"):
                return collective_ops.all_to_all_v2(
                    flat, **engine._options(f"bench_alltoall_runtime_{tag}"))

        add("alltoall", "runtime", rows, alltoall_runtime, equal)
    return cases


def _runtime_reachable(engine):
    """Whether the runtime's own collectives can be called past the engine: TensorFlow's
    engine, through its private `_gather_equal` and `_options` (keys agreed as the engine
    agrees them). Without them the `runtime` cases are left out."""
    return engine.name == "tf" and all(hasattr(engine, name)
                                       for name in ("_gather_equal", "_options"))


def latency_cases(engine):
    """The size-independent cases: one 4-byte collective each."""
    one_float = tf.constant([1.0])
    one_int = tf.constant([engine.rank], tf.int32)
    cases = [("allreduce", "4B", [1] * engine.size,
              tf.function(lambda x: engine.allreduce(x, "sum", "bench_allreduce_4b")),
              (one_float,)),
             ("allgather", "4B", [1] * engine.size,
              tf.function(lambda x: engine.allgather(x, "bench_allgather_4b")), (one_int,))]
    if _runtime_reachable(engine):
        cases.append(("allgather", "4B_runtime", [1] * engine.size,
                      tf.function(lambda x: engine._gather_equal(x, "bench_allgather_4b_rt")),
                      (one_int,)))
    return cases


def expected_rows(op, rows, rank):
    """The rows `op` returns on `rank` when rank r held rows[r] rows (alltoall: split equally)."""
    if op == "allreduce":
        return rows[rank]
    if op == "allgather":
        return sum(rows)
    return sum(count // len(rows) for count in rows)


def timed_calls(engine, cases, warmup, calls, label):
    """{case index: [ms per call]}: every case warmed up (its result's rows checked), then
    `calls` rotating rounds."""
    for op, variant, rows, function, arguments in cases:
        for _ in range(max(1, warmup)):
            result = function(*arguments)
        received = tf.nest.flatten(result)[0]
        wanted = expected_rows(op, rows, engine.rank)
        if variant.endswith("runtime") and op == "alltoall":
            wanted = engine.size  # the runtime's own alltoall: [size, chunk] in, the same out
        if received.shape[0] != wanted:
            raise RuntimeError(f"{op}/{variant}: {received.shape[0]} rows, expected {wanted}")
    engine.barrier(f"bench_barrier_{label}")
    times = {i: [] for i in range(len(cases))}
    for call in range(calls):
        shift = call % len(cases)
        for i in list(range(shift, len(cases))) + list(range(shift)):
            function, arguments = cases[i][3], cases[i][4]
            started = time.perf_counter()
            result = function(*arguments)
            times[i].append((time.perf_counter() - started) * 1e3)
            del result
    return times


def report(engine, megabytes, cases, times):
    for i, (op, variant, rows, _, _) in enumerate(cases):
        print(MARKER + " " + json.dumps({
            MARKER: True, "engine": engine.name, "ranks": engine.size, "rank": engine.rank,
            "op": op, "variant": variant, "megabytes": megabytes, "rows_per_rank": rows,
            "row_bytes": 4 * ROW_FLOATS if megabytes else 4,
            "times_ms": [round(t, 3) for t in times[i]],
            "median_ms": round(statistics.median(times[i]), 3)}), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes_mb", default="1,16,64", help="Sizes in MiB, comma-separated.")
    parser.add_argument("--warmup", type=int, default=2, help="Untimed calls of each case.")
    parser.add_argument("--calls", type=int, default=10, help="Timed calls of each case.")
    args = parser.parse_args()
    distributed.init()
    engine = distributed.engine()
    if engine is None:
        raise SystemExit("run under horovodrun or python -m tfscale.run with 2 or more ranks")
    cases = latency_cases(engine)
    report(engine, 0, cases, timed_calls(engine, cases, args.warmup, args.calls, "latency"))
    for megabytes in (float(s) for s in args.sizes_mb.split(",") if s):
        cases = cases_for_size(engine, megabytes)
        report(engine, megabytes, cases,
               timed_calls(engine, cases, args.warmup, args.calls, f"{megabytes:g}mb"))
        del cases
    engine.barrier("bench_barrier_end")


if __name__ == "__main__":
    main()
