"""Time and bytes per exchange of the three ways to sum a gradient of m floats over P ranks: a
dense ring allreduce of all m, TopKAllReduce (allgather of each rank's k = density * m
(index, value) pairs) and gTopKAllReduce (the butterfly of tfscale.distributed.gtopk_allreduce),
next to docs/gtopk.md's cost model:

    BENCHMARK=benchmarks.gtopk_collective benchmarks/run_under_1gbit.sh P [--flags]

Each rank draws k distinct random indices in [0, m) with normal values (its own seed). After one
untimed warm-up of each, every round times one exchange of each method in turn (so machine load
hits all alike); a time is rank 0's median over the rounds of the wall time of the collective
(candidate selection excluded). Bytes are rank 0's sent + received payload. Rank 0 appends one
JSON line per (m, density, method) to --results; `--report_only` prints the markdown table and
draws the plot from that file.

Cost model (alpha latency, beta seconds per byte): dense 2(P-1)alpha + 2(P-1)/P 4m beta; allgather
top-k alpha log2 P + 2(P-1) 12k beta; gTop-k alpha log2 P + 2 log2(P) 12k beta (12 bytes per
int64 index and float32 value). All ranks share one shaped loopback, so each rank's beta is P
times the link's: beta = P * 8 / --link_bits_per_second; alpha is measured as the median time of
a one-float allreduce."""

import json
import math
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from absl import app, flags  # noqa: E402

from benchmarks.timing import machine_description  # noqa: E402
from tfscale import distributed  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_list("sizes", ["1048576", "4194304", "16777216"], "Gradient sizes m (floats).")
flags.DEFINE_list("densities", ["0.001", "0.01"], "k / m.")
flags.DEFINE_integer("rounds", 5, "Timed exchanges per method and setting.")
flags.DEFINE_float("link_bits_per_second", 1e9, "The shaped link's rate, for the cost model.")
flags.DEFINE_string("results", "benchmarks/results/gtopk_collective.jsonl", "JSON lines out.")
flags.DEFINE_string("plot", "benchmarks/results/gtopk_collective.png", "PNG plot.")
flags.DEFINE_bool("report_only", False, "Print the table and draw the plot from --results.")

METHODS = ("dense", "topk", "gtopk")
ENTRY_BYTES = 12


def predicted_seconds(method, num_ranks, size, k, alpha, beta):
    """docs/gtopk.md's cost model."""
    rounds = math.log2(num_ranks)
    if method == "dense":
        return 2 * (num_ranks - 1) * alpha + 2 * (num_ranks - 1) / num_ranks * 4 * size * beta
    if method == "topk":
        return alpha * rounds + 2 * (num_ranks - 1) * ENTRY_BYTES * k * beta
    return alpha * rounds + 2 * rounds * ENTRY_BYTES * k * beta


def exchange_functions(engine, size, k):
    """{method: (tf.function, its inputs)} for one setting."""
    rng = np.random.default_rng(engine.rank)
    indices = tf.constant(rng.choice(size, size=k, replace=False).astype(np.int64))
    values = tf.constant(rng.normal(size=k).astype(np.float32))
    gradient = tf.constant(rng.normal(size=size).astype(np.float32))
    tag = f"{size}_{k}"

    @tf.function
    def dense(g):
        return engine.allreduce(g, "sum", f"dense_{tag}")

    @tf.function
    def topk(i, v):
        return distributed.topk_allgather(i, v, name=f"topk_{tag}")

    @tf.function
    def gtopk(i, v):
        return distributed.gtopk_allreduce(i, v, k, name=f"gtopk_{tag}")

    return {"dense": (dense, (gradient,)), "topk": (topk, (indices, values)),
            "gtopk": (gtopk, (indices, values))}


def timed(function, arguments):
    started = time.perf_counter()
    result = function(*arguments)
    tf.nest.map_structure(lambda t: t.numpy() if hasattr(t, "numpy") else t, result)
    return time.perf_counter() - started, result


def measure_alpha(engine):
    one = tf.function(lambda x: engine.allreduce(x, "sum", "alpha"))
    x = tf.ones([1])
    one(x)
    return statistics.median(timed(one, (x,))[0] for _ in range(20))


def run(engine):
    num_ranks = engine.size
    alpha = measure_alpha(engine)
    beta = num_ranks * 8 / FLAGS.link_bits_per_second
    records = []
    for size in map(int, FLAGS.sizes):
        for density in map(float, FLAGS.densities):
            k = max(1, int(round(density * size)))
            functions = exchange_functions(engine, size, k)
            seconds = {method: [] for method in METHODS}
            nbytes = {}
            for method, (function, arguments) in functions.items():
                _, result = timed(function, arguments)  # traces
                if method == "dense":
                    nbytes[method] = 2 * 2 * (num_ranks - 1) / num_ranks * 4 * size
                else:
                    nbytes[method] = float(result.bytes_sent) + float(result.bytes_received)
            for _ in range(FLAGS.rounds):
                for method, (function, arguments) in functions.items():
                    seconds[method].append(timed(function, arguments)[0])
            for method in METHODS:
                records.append(dict(
                    ranks=num_ranks, size=size, density=density, k=k, method=method,
                    seconds=statistics.median(seconds[method]), bytes=nbytes[method],
                    predicted_seconds=predicted_seconds(method, num_ranks, size, k, alpha, beta),
                    alpha=alpha, machine=machine_description()))
            if engine.rank == 0:
                print(f"P={num_ranks} m={size:,} density {density:g}: " + ", ".join(
                    f"{r['method']} {r['seconds']:.3f} s" for r in records[-3:]), flush=True)
    return records


def report():
    with open(FLAGS.results) as f:
        records = [json.loads(line) for line in f]
    latest = {}
    for r in records:  # a rerun of a setting replaces the earlier one
        latest[(r["ranks"], r["size"], r["density"], r["method"])] = r
    records = sorted(latest.values(), key=lambda r: (r["ranks"], r["density"], r["size"],
                                                       METHODS.index(r["method"])))
    print(f"machine: {records[0]['machine']}\n")
    print("| P | m (floats) | density | method | s per exchange | model (s) | MB sent+received "
          "per rank | dense / method time |")
    print("|---:|---:|---:|---|---:|---:|---:|---:|")
    for r in records:
        dense = latest[(r["ranks"], r["size"], r["density"], "dense")]
        print(f"| {r['ranks']} | {r['size']:,} | {r['density']:g} | {r['method']} | "
              f"{r['seconds']:.3f} | {r['predicted_seconds']:.3f} | {r['bytes'] / 1e6:,.2f} | "
              f"{dense['seconds'] / r['seconds']:.1f} |")
    plot(records)


def plot(records):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ranks = sorted({r["ranks"] for r in records})
    densities = sorted({r["density"] for r in records})
    figure, axes = plt.subplots(len(densities), len(ranks), figsize=(4 * len(ranks),
                                                                    3.2 * len(densities)),
                                squeeze=False, sharey=True)
    for row, density in enumerate(densities):
        for column, num_ranks in enumerate(ranks):
            axis = axes[row][column]
            for method in METHODS:
                points = sorted((r["size"], r["seconds"], r["predicted_seconds"]) for r in records
                                if r["ranks"] == num_ranks and r["density"] == density
                                and r["method"] == method)
                if not points:
                    continue
                sizes, measured, predicted = zip(*points)
                line, = axis.plot(sizes, measured, marker="o", label=f"{method} measured")
                axis.plot(sizes, predicted, linestyle="--", color=line.get_color(),
                          label=f"{method} model")
            axis.set_xscale("log", base=2)
            axis.set_yscale("log")
            axis.set_title(f"P={num_ranks}, density {density:g}")
            axis.set_xlabel("m (floats)")
            if column == 0:
                axis.set_ylabel("seconds per exchange")
    axes[0][0].legend(fontsize=7)
    figure.suptitle("Sparse allreduces under a 1 Gbit shared loopback")
    figure.tight_layout()
    figure.savefig(FLAGS.plot, dpi=110)
    print(f"\nplot: {FLAGS.plot}")


def main(argv):
    del argv
    if FLAGS.report_only:
        report()
        return
    distributed.init()
    engine = distributed.engine()
    if engine is None:
        raise SystemExit("run under horovodrun with 2 or more ranks (see the module docstring)")
    records = run(engine)
    if engine.rank == 0:
        with open(FLAGS.results, "a") as f:
            for record in records:
                f.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    app.run(main)
