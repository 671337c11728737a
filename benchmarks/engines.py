"""TensorFlow's collective engine against Horovod (Gloo), on the same cores in one run, at P
processes on one host (loopback):

    python -m benchmarks.engines [--only=collectives|steps] [--ranks=2,4] [--sizes_mb=1,16,64]
        [--rounds=2] [--warmup=2] [--calls=10] [--step_cases=2x8192,2x65536,4x8192]
        [--shardings=replicated,row] [--steps=21] [--note="what else ran"]
    python -m benchmarks.engines --report     # the tables again, from --results

Every measured process group is launched alone, one after the other (never two at once), the
engines alternating: Horovod, TF, Horovod, TF, ... (--rounds groups of each per configuration):
Horovod by `horovodrun -np P -H localhost:P --gloo python ...`, TensorFlow's engine by `python -m
tfscale.run -np P ...` (its ranks in a private network namespace with loopback only).

1. Collectives (benchmarks.engine_collectives, one process group per engine, P and round):
   allreduce, allgather and alltoall of --sizes_mb MiB of float32 per rank inside a
   tf.function, --warmup untimed calls then --calls timed ones, rank 0's median ms per call;
   the same with unequal sizes (rank r holds (r + 1)/P of the size), against equal sizes of the
   same total bytes; on TF's engine also the runtime's own allgather and alltoall (without the
   engine's size agreement and padding); and one-value collectives (the latency of one call).
2. Step time of the launcher (`python -m launch.train`, DeepFM on the built-in synthetic data)
   for each --step_cases PxB (P processes, global batch B) and table strategy of --shardings:
   --steps steps, a progress line every --log_every_steps; the ms/step of every line but the
   first (its window holds the first steps after tracing), median per run.

Each group's record (one JSON line per case and group, appended to --results as soon as the
group ends, so an interrupted run keeps what it measured) holds the machine (lscpu model name,
flags and cores), the date, the commit, the command, the 1-minute load average before and after
the group and the CPU seconds other processes took meanwhile. After the runs (or with
--report) the Markdown tables go to --markdown: for each configuration, the latest run that
measured it (both engines from the same run, side by side). `--only` and `--ranks` re-run a part
cheaply; older lines stay in --results."""

import argparse
import json
import os
import pathlib
import re
import resource
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
ENGINES = ("horovod", "tf")
COLLECTIVE_MARKER = "engine_collective"
ROW_FLOATS = 256  # the collectives' rows: 1 KiB of float32 each
ROWS_PER_MIB = (1 << 20) // (4 * ROW_FLOATS)
GROUP_TIMEOUT_SECONDS = 3600
STEP_LINE = re.compile(r"epoch (\d+) batch (\d+)(?:/\d+)? step (\d+): .*?([\d.]+) ms/step\s*$")
MODEL_LINE = re.compile(r"^(?:\[\d+\]<stdout>:)?(model \S+ \(.*)$")


# ----------------------------------------------------------------------------- the cases

def per_rank_rows(megabytes, size, variant):
    """The rows of 1 KiB each rank holds in a collective of `megabytes` MiB, `variant`
    "equal" (all of it), "uneven" (rank r: (r + 1)/size of it) or "equal_mean" (the mean of the
    uneven counts, the same total): a list of `size` counts, each a multiple of `size` (an
    alltoall splits them equally) and at least `size`."""
    rows = int(round(megabytes * ROWS_PER_MIB))

    def whole(count):
        return max(size, count // size * size)

    if variant == "equal":
        return [whole(rows)] * size
    uneven = [whole(rows * (r + 1) // size) for r in range(size)]
    if variant == "uneven":
        return uneven
    if variant == "equal_mean":
        return [whole(int(round(sum(uneven) / size)))] * size
    raise ValueError(f"variant {variant!r}: give equal, uneven or equal_mean")


# ----------------------------------------------------------------------------- parsing

def parse_step_line(line):
    """(global step, ms/step) of one launcher progress line ("epoch E batch B[/N] step S: ...,
    X ms/step", with or without a launcher's "[rank]<stdout>:" prefix), or None."""
    match = STEP_LINE.search(line.rstrip("\n"))
    if not match:
        return None
    return int(match.group(3)), float(match.group(4))


def step_times(lines):
    """The ms/step of every progress line in `lines` but the first (whose window follows the
    trace), as a list."""
    found = [parsed[1] for parsed in map(parse_step_line, lines) if parsed]
    return found[1:]


def collective_records(lines):
    """The JSON records benchmarks.engine_collectives printed (every rank's), from `lines`."""
    records = []
    for line in lines:
        if f'"{COLLECTIVE_MARKER}"' in line:
            records.append(json.loads(line[line.index("{"):]))
    return records


def model_line(lines):
    """The launcher's description of the run ("model deepfm (N parameters) on ..."), or ""."""
    for line in lines:
        match = MODEL_LINE.match(line.rstrip("\n"))
        if match:
            return match.group(1)
    return ""


# ----------------------------------------------------------------------------- the machine

def machine():
    """lscpu's model name, flags and the cores, as every results file records them."""
    listed = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    fields = dict(line.split(":", 1) for line in listed.splitlines() if ":" in line)
    return {"cpu": fields.get("Model name", "").strip(), "cores": os.cpu_count(),
            "cpu_flags": fields.get("Flags", "").strip()}


def vector_flags(flags_text):
    """The vector and matrix flags of an lscpu flags line (avx*, amx*, fma), as pages quote."""
    return " ".join(f for f in flags_text.split() if f.startswith(("avx", "amx", "fma")))


def versions():
    from importlib import metadata

    found = {"python": sys.version.split()[0]}
    for package in ("tensorflow", "keras", "horovod"):
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            found[package] = None
    return found


def commit():
    """The checked-out commit (short), with "+" when tracked files have changes."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True).stdout.strip()
    changes = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                             capture_output=True, text=True).stdout
    return head + ("+" if changes.strip() else "")


def loadavg():
    with open("/proc/loadavg") as stream:
        return float(stream.read().split()[0])


def machine_busy_seconds():
    """CPU seconds every core has been busy since boot (/proc/stat: user..steal)."""
    with open("/proc/stat") as stat:
        fields = [int(value) for value in stat.readline().split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def other_runs():
    """The process ids of other processes running this benchmark or its worker (their groups
    would overlap this run's)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as stream:
                arguments = stream.read().split(b"\0")
        except OSError:
            continue
        if any(a in (b"benchmarks.engines", b"benchmarks.engine_collectives") for a in arguments):
            found.append(int(entry))
    return found


# ----------------------------------------------------------------------------- launching

def launch_command(engine, ranks, module, arguments):
    """The command line that runs `python -m module arguments` on `ranks` processes of
    `engine`."""
    python = sys.executable
    if engine == "horovod":
        horovodrun = str(pathlib.Path(python).parent / "horovodrun")
        return [horovodrun, "-np", str(ranks), "-H", f"localhost:{ranks}", "--gloo", python,
                "-m", module, *arguments]
    return [python, "-m", "tfscale.run", "-np", str(ranks), "-m", module, *arguments]


def run_group(engine, ranks, module, arguments):
    """Runs one process group to its end (nothing else of this benchmark runs meanwhile).

    Returns:
        (output lines, a dict of what the group cost and met: wall seconds, its CPU seconds, the
        CPU seconds other processes took meanwhile, the 1-minute load average before and after,
        the command).

    Raises:
        RuntimeError: the group failed (its output's end in the message).
    """
    command = launch_command(engine, ranks, module, arguments)
    environment = {key: value for key, value in os.environ.items()
                   if not key.startswith(("HOROVOD_", "TF_CONFIG", "TFSCALE_ENGINE"))}
    environment.update(PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2")
    load_before = loadavg()
    busy_before = machine_busy_seconds()
    children_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, env=environment, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=GROUP_TIMEOUT_SECONDS)
    wall = time.perf_counter() - started
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    own = (children.ru_utime + children.ru_stime
           - children_before.ru_utime - children_before.ru_stime)
    lines = done.stdout.splitlines()
    if done.returncode:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}):\n"
                           + "\n".join(lines[-40:]))
    return lines, {"wall_seconds": round(wall, 1), "group_cpu_seconds": round(own, 1),
                   "other_processes_cpu_seconds": round(
                       machine_busy_seconds() - busy_before - own, 1),
                   "loadavg_1min_before_after": [load_before, loadavg()],
                   "launch": " ".join(_shown(c) for c in command)}


def _shown(argument):
    """`argument` with this checkout's and the interpreter's paths shortened for the record."""
    for path, short in ((str(pathlib.Path(sys.executable).parent), ".venv/bin"),
                        (str(ROOT) + "/", "")):
        argument = argument.replace(path, short)
    return argument


# ----------------------------------------------------------------------------- the runs

def _append(path, records):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "a", encoding="utf-8") as out:
        for record in records:
            out.write(json.dumps(record) + "\n")


def _say(text):
    print(text, flush=True)


def _cost_text(cost):
    before, after = cost["loadavg_1min_before_after"]
    return (f"{cost['wall_seconds']:.0f} s, load {before:.2f} -> {after:.2f}, other processes "
            f"{cost['other_processes_cpu_seconds']:.0f} CPU s")


def run_collectives(args, context):
    sizes = ",".join(args.sizes_mb)
    for ranks in args.ranks:
        for round_index in range(args.rounds):
            for engine in ENGINES:
                lines, cost = run_group(engine, ranks, "benchmarks.engine_collectives",
                                        [f"--sizes_mb={sizes}", f"--warmup={args.warmup}",
                                         f"--calls={args.calls}"])
                found = collective_records(lines)
                cases = {}
                for record in found:
                    key = (record["op"], record["variant"], record["megabytes"])
                    cases.setdefault(key, {})[record["rank"]] = record
                records = []
                for (op, variant, megabytes), by_rank in cases.items():
                    first = by_rank[0]
                    records.append(dict(
                        context, kind="collective", engine=engine, ranks=ranks,
                        round=round_index, op=op, variant=variant, megabytes=megabytes,
                        rows_per_rank=first["rows_per_rank"], row_bytes=first["row_bytes"],
                        warmup=args.warmup, calls=args.calls, median_ms=first["median_ms"],
                        times_ms=first["times_ms"],
                        rank_median_ms=[by_rank[r]["median_ms"] for r in sorted(by_rank)],
                        **cost))
                if not records:
                    raise RuntimeError(f"{engine} P={ranks}: no results in its output:\n"
                                       + "\n".join(lines[-40:]))
                _append(args.results, records)
                _say(f"collectives {engine} P={ranks} round {round_index}: {len(records)} "
                     f"cases, {_cost_text(cost)}")


def step_arguments(batch_size, sharding, steps, log_every_steps):
    """launch.train's arguments for one step-time run."""
    arguments = [f"--batch_size={batch_size}", f"--train_rows={batch_size * steps}",
                 "--test_rows=2048", "--epochs=1", "--logdir=none", "--checkpoint_dir=none",
                 f"--log_every_steps={log_every_steps}"]
    if sharding != "replicated":  # the launcher's default
        arguments.append(f"--embedding_sharding={sharding}")
    return arguments


def parse_step_cases(text):
    """"2x8192,4x8192" -> [(2, 8192), (4, 8192)]."""
    cases = []
    for item in text:
        ranks, _, batch = item.partition("x")
        cases.append((int(ranks), int(batch)))
    return cases


def run_steps(args, context):
    for ranks, batch_size in parse_step_cases(args.step_cases):
        if ranks not in args.ranks:
            continue
        for sharding in args.shardings:
            for round_index in range(args.rounds):
                for engine in ENGINES:
                    arguments = step_arguments(batch_size, sharding, args.steps,
                                               args.log_every_steps)
                    lines, cost = run_group(engine, ranks, "launch.train", arguments)
                    times = step_times(lines)
                    described = model_line(lines)
                    if f"({engine} engine)" not in described:
                        raise RuntimeError(f"the launcher's description does not name the "
                                           f"{engine} engine: {described!r}")
                    if not times:
                        raise RuntimeError(f"{engine} P={ranks} batch {batch_size} {sharding}: "
                                           "no progress line after the first:\n"
                                           + "\n".join(lines[-40:]))
                    record = dict(
                        context, kind="steps", engine=engine, ranks=ranks, round=round_index,
                        batch_size=batch_size, sharding=sharding, steps=args.steps,
                        log_every_steps=args.log_every_steps, step_ms=times,
                        median_ms=statistics.median(times), model=described, **cost)
                    _append(args.results, [record])
                    _say(f"steps {engine} P={ranks} batch {batch_size} {sharding} round "
                         f"{round_index}: {record['median_ms']:.1f} ms/step ({times}), "
                         f"{_cost_text(cost)}")


# ----------------------------------------------------------------------------- the report

def median(values):
    return statistics.median(values) if values else None


def latest_runs(records, key):
    """{key(record): [records of the latest run (run_id) that measured it]}."""
    latest = {}
    for record in records:
        k = key(record)
        if k not in latest or record["run_id"] > latest[k][0]["run_id"]:
            latest[k] = [record]
        elif record["run_id"] == latest[k][0]["run_id"]:
            latest[k].append(record)
    return latest


def compare(runs):
    """{"horovod": median ms, "tf": median ms, "ratio": tf / horovod, "range": (lowest,
    highest) of each round's TF / Horovod, "rounds": rounds of each} of one configuration's
    records of one run (each with engine, round and median_ms); a missing engine gives None."""
    by_engine = {engine: {r["round"]: r["median_ms"] for r in runs if r["engine"] == engine}
                 for engine in ENGINES}
    horovod, tf = median(list(by_engine["horovod"].values())), median(
        list(by_engine["tf"].values()))
    paired = [by_engine["tf"][i] / by_engine["horovod"][i] for i in by_engine["tf"]
              if i in by_engine["horovod"] and by_engine["horovod"][i] > 0]
    return {"horovod": horovod, "tf": tf,
            "ratio": tf / horovod if horovod and tf is not None else None,
            "range": (min(paired), max(paired)) if paired else None,
            "rounds": min(len(by_engine["horovod"]), len(by_engine["tf"]))}


def ms(value):
    if value is None:
        return ""
    return f"{value:,.1f}" if value >= 10 else f"{value:.2f}"


def ratio_text(compared):
    """"1.23 (1.10-1.40)": TF / Horovod, with the range over rounds when there are several."""
    if compared["ratio"] is None:
        return ""
    text = f"{compared['ratio']:.2f}"
    low, high = compared["range"] or (None, None)
    if low is not None and compared["rounds"] > 1:
        text += f" ({low:.2f}-{high:.2f})"
    return text


def padding_factor(rows_per_rank):
    """Bytes TF's engine moves over the payload's when every rank pads to the largest: the
    largest rank's rows times P, over the rows held."""
    return len(rows_per_rank) * max(rows_per_rank) / sum(rows_per_rank)


def mib(rows, row_bytes):
    return rows * row_bytes / (1 << 20)


def collective_tables(records):
    """Markdown lines of the collective tables."""
    latest = latest_runs(records, lambda r: (r["ranks"], r["op"], r["variant"], r["megabytes"]))

    def get(ranks, op, variant, megabytes):
        return compare(latest.get((ranks, op, variant, megabytes), []))

    def tf_only(ranks, op, variant, megabytes):
        return median([r["median_ms"] for r in latest.get((ranks, op, variant, megabytes), [])
                       if r["engine"] == "tf"])

    ranks_list = sorted({k[0] for k in latest})
    sizes = sorted({k[3] for k in latest if k[3]})
    lines = ["### Equal shapes", "",
             "Median ms per call (rank 0); TF / Horovod with its range over the rounds; the "
             "runtime alone: TensorFlow's collective without the engine's size agreement, "
             "padding and mask.", "",
             "| P | op | MiB per rank | Horovod ms | TF ms | TF / Horovod | TF runtime alone ms "
             "| runtime / Horovod |", "|---:|---|---:|---:|---:|---:|---:|---:|"]
    for ranks in ranks_list:
        for op in ("allreduce", "allgather", "alltoall"):
            for megabytes in sizes:
                compared = get(ranks, op, "equal", megabytes)
                if compared["horovod"] is None and compared["tf"] is None:
                    continue
                runtime = tf_only(ranks, op, "runtime", megabytes)
                lines.append(
                    f"| {ranks} | {op} | {megabytes:g} | {ms(compared['horovod'])} | "
                    f"{ms(compared['tf'])} | {ratio_text(compared)} | "
                    f"{ms(runtime) if runtime is not None else '(same)'} | "
                    + (f"{runtime / compared['horovod']:.2f}"
                       if runtime is not None and compared["horovod"] else "") + " |")
    lines += ["", "### One value: the cost of a call", "",
              "| P | collective | Horovod ms | TF ms | TF / Horovod |", "|---:|---|---:|---:|---:|"]
    for ranks in ranks_list:
        for op, label in (("allreduce", "allreduce of one float32"),
                          ("allgather", "allgather of one int32")):
            compared = get(ranks, op, "4B", 0)
            if compared["horovod"] is None and compared["tf"] is None:
                continue
            lines.append(f"| {ranks} | {label} | {ms(compared['horovod'])} | "
                         f"{ms(compared['tf'])} | {ratio_text(compared)} |")
        runtime = tf_only(ranks, "allgather", "4B_runtime", 0)
        if runtime is not None:
            lines.append(f"| {ranks} | TF runtime's allgather of one int32 (the engine's size "
                         f"agreement) | | {ms(runtime)} | |")
    slopes = []
    for ranks in ranks_list:
        for op in ("allreduce", "allgather", "alltoall"):
            if len(sizes) < 2:
                continue
            low, high = sizes[-2], sizes[-1]
            cells = []
            for engine_value in (
                    lambda s: get(ranks, op, "equal", s)["horovod"],
                    lambda s: get(ranks, op, "equal", s)["tf"],
                    lambda s: tf_only(ranks, op, "runtime", s) if op != "allreduce"
                    else get(ranks, op, "equal", s)["tf"]):
                a, b = engine_value(low), engine_value(high)
                cells.append(None if a is None or b is None else (b - a) / (high - low))
            if any(c is not None for c in cells):
                slopes.append(f"| {ranks} | {op} | {low:g} -> {high:g} | "
                              + " | ".join(_slope_text(c) for c in cells) + " |")
    if slopes:
        lines += ["", "### Cost per MiB", "",
                  "Extra ms per extra MiB per rank between the two largest sizes (the per-byte "
                  "cost: copies, serialisation, the wire), and the MiB/s it implies.", "",
                  "| P | op | MiB | Horovod ms/MiB (MiB/s) | TF ms/MiB (MiB/s) | TF runtime "
                  "alone ms/MiB (MiB/s) |", "|---:|---|---|---:|---:|---:|"] + slopes
    lines += ["", "### Unequal sizes: rank r holds (r + 1)/P of the size", "",
              "TF's engine pads every rank's rows to the largest's (alltoall: every chunk to the "
              "largest chunk); `pad` is the bytes it moves over the payload's. `equal, same "
              "total`: every rank holds the mean of the unequal sizes.", "",
              "| P | op | MiB on the largest rank | pad | TF uneven ms | TF equal, same total ms "
              "| TF uneven / equal | Horovod uneven ms | Horovod equal, same total ms | Horovod "
              "uneven / equal | TF / Horovod, uneven |",
              "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for ranks in ranks_list:
        for op in ("allgather", "alltoall"):
            for megabytes in sizes:
                uneven = get(ranks, op, "uneven", megabytes)
                equal = get(ranks, op, "equal_mean", megabytes)
                if uneven["horovod"] is None and uneven["tf"] is None:
                    continue
                some = latest[(ranks, op, "uneven", megabytes)][0]
                largest = mib(max(some["rows_per_rank"]), some["row_bytes"])
                lines.append(
                    f"| {ranks} | {op} | {largest:g} | {padding_factor(some['rows_per_rank']):.2f}"
                    f" | {ms(uneven['tf'])} | {ms(equal['tf'])} | "
                    f"{_divided(uneven['tf'], equal['tf'])} | {ms(uneven['horovod'])} | "
                    f"{ms(equal['horovod'])} | {_divided(uneven['horovod'], equal['horovod'])} "
                    f"| {ratio_text(uneven)} |")
    return lines


def _slope_text(value):
    if value is None:
        return ""
    if value <= 0:
        return f"{value:.2f} (-)"
    return f"{value:.2f} ({1000 / value:,.0f})"


def _divided(a, b):
    return f"{a / b:.2f}" if a is not None and b else ""


def steps_table(records):
    latest = latest_runs(records, lambda r: (r["ranks"], r["batch_size"], r["sharding"]))
    lines = ["| P | global batch | tables | Horovod ms/step | TF ms/step | TF / Horovod | runs "
             "of each | steps timed per run |", "|---:|---:|---|---:|---:|---:|---:|---:|"]
    for (ranks, batch_size, sharding), runs in sorted(latest.items()):
        compared = compare(runs)
        timed = sorted({len(r["step_ms"]) * r["log_every_steps"] for r in runs})
        lines.append(f"| {ranks} | {batch_size:,} | {sharding} | {ms(compared['horovod'])} | "
                     f"{ms(compared['tf'])} | {ratio_text(compared)} | {compared['rounds']} | "
                     f"about {timed[-1]} |")
    return lines


def provenance_lines(records):
    """One line per run the tables use: its date, machine, commit, command, and the load it
    met."""
    lines = []
    for run_id in sorted({r["run_id"] for r in records}):
        runs = [r for r in records if r["run_id"] == run_id]
        first = runs[0]
        loads = [v for r in runs for v in r["loadavg_1min_before_after"]]
        others = [r["other_processes_cpu_seconds"] for r in runs]
        about = first["machine"]
        lines.append(
            f"- run {run_id}: `{first['command']}`, commit {first['commit']}; {about['cpu']}, "
            f"{about['cores']} cores (lscpu flags: {vector_flags(about['cpu_flags'])}); "
            f"Python {first['versions']['python']}, TensorFlow {first['versions']['tensorflow']},"
            f" Keras {first['versions']['keras']}, Horovod {first['versions']['horovod']}; "
            f"1-minute load average {min(loads):.2f} to {max(loads):.2f} around its groups, "
            f"other processes took a median {statistics.median(others):.0f} CPU s per group "
            f"(max {max(others):.0f})" + (f"; note: {first['note']}" if first["note"] else ""))
    return lines


def report_markdown(records, results_path="benchmarks/results/engines.jsonl"):
    """The Markdown results file of `records` (every line of `results_path`)."""
    collectives = [r for r in records if r["kind"] == "collective"]
    steps = [r for r in records if r["kind"] == "steps"]
    used = []
    if collectives:
        keyed = latest_runs(collectives,
                            lambda r: (r["ranks"], r["op"], r["variant"], r["megabytes"]))
        used += [r for runs in keyed.values() for r in runs]
    if steps:
        keyed = latest_runs(steps, lambda r: (r["ranks"], r["batch_size"], r["sharding"]))
        used += [r for runs in keyed.values() for r in runs]
    lines = ["# TensorFlow's engine against Horovod: `python -m benchmarks.engines`", "",
             "Each configuration from the latest run that measured it; in a run, process groups "
             "one at a time, the engines alternating (Horovod, TF, Horovod, TF, ...), on the "
             f"same cores. Raw data: `{results_path}`.", ""]
    lines += provenance_lines(used)
    if collectives:
        lines += ["", "## Collectives", ""] + collective_tables(collectives)
    if steps:
        lines += ["", "## Launcher step time (`python -m launch.train`, DeepFM, synthetic "
                  "data)", "", "Median of each run's ms/step lines (every progress line but the "
                  "first), median over the runs; TF / Horovod with its range over the rounds.",
                  ""] + steps_table(steps)
    return "\n".join(lines) + "\n"


def read_records(path):
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as stream:
        return [json.loads(line) for line in stream if line.strip()]


def write_report(args):
    records = read_records(args.results)
    if not records:
        _say(f"no records in {args.results}")
        return
    text = report_markdown(records, args.results)
    with open(args.markdown, "w", encoding="utf-8") as out:
        out.write(text)
    _say(text)
    _say(f"written: {args.markdown}")


# ----------------------------------------------------------------------------- main

def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.engines",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=("collectives", "steps"),
                        help="Run one part only (default: both).")
    parser.add_argument("--ranks", default="2,4", help="Numbers of processes (both parts).")
    parser.add_argument("--sizes_mb", default="1,16,64", help="Collective sizes, MiB per rank.")
    parser.add_argument("--rounds", type=int, default=2,
                        help="Process groups of each engine per configuration, alternating.")
    parser.add_argument("--warmup", type=int, default=2, help="Untimed calls of each collective.")
    parser.add_argument("--calls", type=int, default=10, help="Timed calls of each collective.")
    parser.add_argument("--step_cases", default="2x8192,2x65536,4x8192",
                        help="Launcher runs: P x global batch, comma-separated.")
    parser.add_argument("--shardings", default="replicated,row",
                        help="--embedding_sharding values of the launcher runs.")
    parser.add_argument("--steps", type=int, default=21, help="Training steps per launcher run.")
    parser.add_argument("--log_every_steps", type=int, default=5,
                        help="The launcher's progress line every N steps.")
    parser.add_argument("--results", default="benchmarks/results/engines.jsonl",
                        help="JSON lines, appended.")
    parser.add_argument("--markdown", default="benchmarks/results/engines.md",
                        help="The tables, rewritten from --results.")
    parser.add_argument("--note", default="", help="What else ran (stored with each line).")
    parser.add_argument("--report", action="store_true",
                        help="Only rewrite --markdown from --results.")
    args = parser.parse_args(argv)
    args.ranks = [int(r) for r in args.ranks.split(",") if r]
    args.sizes_mb = [s for s in args.sizes_mb.split(",") if s]
    args.step_cases = [c for c in args.step_cases.split(",") if c]
    args.shardings = [s for s in args.shardings.split(",") if s]
    return args


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    os.chdir(ROOT)
    if args.report:
        write_report(args)
        return
    running = other_runs()
    if running:
        raise SystemExit(f"another run of this benchmark is going on (processes {running}): "
                         "its process groups would overlap this run's")
    context = {"run_id": time.strftime("%Y-%m-%dT%H:%M:%S"),
               "date": time.strftime("%Y-%m-%d"), "machine": machine(), "versions": versions(),
               "commit": commit(), "command": " ".join(["python -m benchmarks.engines", *argv]),
               "note": args.note}
    about = context["machine"]
    _say(f"machine: {about['cpu']}, {about['cores']} cores, lscpu flags "
         f"{vector_flags(about['cpu_flags'])}; commit {context['commit']}; load average "
         f"{loadavg():.2f}")
    started = time.perf_counter()
    if args.only in (None, "collectives"):
        run_collectives(args, context)
    if args.only in (None, "steps"):
        run_steps(args, context)
    _say(f"took {time.perf_counter() - started:.0f} s; load average now {loadavg():.2f}")
    write_report(args)


if __name__ == "__main__":
    main()
