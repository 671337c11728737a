"""Launch to first step of `python -m launch.train` with dynamic tables at P ranks, and where the
time goes, per rank:

    python -m benchmarks.startup                       # runs, then the table of --results
    python -m benchmarks.startup --engines=tf,horovod --capacities=8000000,135000000 --rounds=2
    python -m benchmarks.startup --trees=OLD,NEW --tree_labels=before,after   # alternating
    python -m benchmarks.startup --report              # only the table of --results

Each run is the launcher in processes of its own: `python -m tfscale.run -np P` (TensorFlow's
engine) or `horovodrun -np P -H localhost:P --gloo` (Horovod), every rank running this file as
a script, which times launch.train's phases and then runs launch.train itself (absl's app.run
of its `run`, as its command line does) with the flags below: the synthetic data at its
defaults, --embedding_sharding=dynamic --dynamic_capacity=C, --log_every_steps=1,
--stop_after_steps=3, no logs or checkpoints. The timing wraps the launcher's own functions
(its module attributes, looked up when `run` calls them) and adds a Keras callback and a wrapper
around the train step's Python body; it changes nothing they do.

Per rank, at the end of each phase: seconds since the launch (time.time() before the launcher
starts) and the process's CPU seconds (all its threads: time.process_time()). Phases:
`started` (the interpreter is up), `tensorflow` (launch.quiet_tf: TensorFlow and Keras
imported), `modules` (launch.train, tfscale, the models imported), `engine`
(distributed_flags.init_engine), `data` (the source built and dynamic_capacity's check),
`model` (the model built), `compiled` (optimizer built, model compiled, the start lines),
`variables` (training.run.build_model_and_optimizer: tables, optimizer state), `fit_start` (to
the first batch's begin: the checks and broadcasts before fit, the dataset), `traced` (the
train step's Python body traced), `first_step` (the first step's end: TensorFlow's graph
optimisation, the first batch of data, the collectives' start, the step), `second_step`.

The script also reads the launcher's output: the launch to the end of the first step as
table_scaling.py measures it (the first progress line, at step 2, less its step time). Each
run appends one JSON line to --results with every rank's phases, the machine's load average
before and after, the CPU seconds other processes took meanwhile and the run's own (launcher
and ranks, whole run)."""

import json
import os
import sys
import time

_RANK_OUT = "STARTUP_RANK_OUT"  # set for the ranks: the file each rank writes its phases to
_LAUNCHED_AT = "STARTUP_LAUNCHED_AT"


def _rank_main():
    """A rank: times launch.train's phases, runs it, writes {"rank", "phases"} to a file."""
    started = (time.time(), time.process_time())
    launched_at = float(os.environ[_LAUNCHED_AT])
    sys.path[0] = os.getcwd()  # the launched tree, not this file's directory
    phases = {"started": started}

    def mark(name):
        if name not in phases:
            phases[name] = (time.time(), time.process_time())

    from launch import quiet_tf  # noqa: F401  (TensorFlow and Keras, as launch.train starts)
    mark("tensorflow")
    import keras

    from launch import common_flags, distributed_flags, hybrid_flags, optimization_flags
    from launch import train as launcher
    from launch.user_errors import absl_main
    from tfscale.training import run as training_run
    from tfscale.training import train_step
    mark("modules")

    def after(module, name, phase, before=None):
        function = getattr(module, name)

        def timed(*args, **kwargs):
            if before:
                mark(before)
            result = function(*args, **kwargs)
            mark(phase)
            return result
        setattr(module, name, timed)

    after(distributed_flags, "init_engine", "engine")
    after(hybrid_flags, "dynamic_capacity", "data")
    after(common_flags, "build_model", "model")
    after(training_run, "build_model_and_optimizer", "variables", before="compiled")
    after(train_step.TrainStep, "train_step", "traced")

    class FirstSteps(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            mark("fit_start")

        def on_train_batch_end(self, batch, logs=None):
            mark("second_step" if "first_step" in phases else "first_step")

    fit = train_step.TrainStep.fit

    def fit_with_timing(self, *args, **kwargs):
        kwargs["callbacks"] = [*(kwargs.get("callbacks") or []), FirstSteps()]
        return fit(self, *args, **kwargs)
    train_step.TrainStep.fit = fit_with_timing

    from absl import app
    try:
        app.run(absl_main(launcher.run), argv=["launch.train", *sys.argv[1:]])
    except SystemExit as exit_status:
        if exit_status.code:
            raise
    finally:
        rank = int(os.environ.get("HOROVOD_RANK") or json.loads(
            os.environ.get("TF_CONFIG", '{"task": {"index": 0}}'))["task"]["index"])
        with open(f"{os.environ[_RANK_OUT]}.{rank}", "w") as out:
            json.dump({"rank": rank, "phases": {
                name: [round(at - launched_at, 3), round(cpu, 3)]
                for name, (at, cpu) in phases.items()}}, out)


if __name__ == "__main__" and os.environ.get(_RANK_OUT):
    _rank_main()
    sys.exit(0)

import pathlib  # noqa: E402
import re  # noqa: E402
import resource  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402

from absl import app, flags  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_list("engines", ["tf", "horovod"], "tf: python -m tfscale.run; horovod: horovodrun "
                  "--gloo.")
flags.DEFINE_list("capacities", ["8000000", "135000000"], "--dynamic_capacity values.")
flags.DEFINE_integer("ranks", 4, "Processes of a run (P).")
flags.DEFINE_integer("rounds", 1, "Rounds over every configuration (and tree).")
flags.DEFINE_list("trees", ["."], "Source trees whose launcher runs, alternating within every "
                  "configuration (the code before and after a change).")
flags.DEFINE_list("tree_labels", [], "A name for each of --trees (default: its path).")
flags.DEFINE_list("extra_flags", [], "More launch.train flags, e.g. --batch_size=8192.")
flags.DEFINE_string("results", "benchmarks/results/startup.jsonl", "JSON lines file.")
flags.DEFINE_string("note", "", "What else ran on the machine (stored with each line).")
flags.DEFINE_bool("report", False, "Only print the table of --results.")
flags.DEFINE_integer("timeout", 900, "Seconds before a run is killed.")

PHASES = ("started", "tensorflow", "modules", "engine", "data", "model", "compiled", "variables",
          "fit_start", "traced", "first_step", "second_step")
STEP_LINE = re.compile(r"step 2: .*, ([\d.]+) ms/step")


def _loadavg():
    with open("/proc/loadavg") as loadavg:
        return [float(value) for value in loadavg.read().split()[:3]]


def _commit(tree):
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=tree, capture_output=True,
                          text=True)
    if done.returncode != 0:
        return None
    changes = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=tree,
                             capture_output=True, text=True).stdout
    return done.stdout.strip() + ("+" if changes else "")


def run_once(engine, capacity, tree, label):
    """One launch's measurements (a dict)."""
    from benchmarks.timing import machine_busy_seconds

    tree = str(pathlib.Path(tree).resolve())
    script = str(pathlib.Path(__file__).resolve())
    program = [script, "--embedding_sharding=dynamic",
               f"--dynamic_capacity={capacity}", "--log_every_steps=1", "--stop_after_steps=3",
               "--logdir=none", "--checkpoint_dir=none", *FLAGS.extra_flags]
    ranks = FLAGS.ranks
    if engine == "tf":
        command = [sys.executable, "-m", "tfscale.run", "-np", str(ranks), *program]  # its Python
    else:
        horovodrun = str(pathlib.Path(sys.executable).parent / "horovodrun")
        command = [horovodrun, "-np", str(ranks), "-H", f"localhost:{ranks}", "--gloo",
                   sys.executable, *program]
    with tempfile.TemporaryDirectory() as scratch:
        out = os.path.join(scratch, "rank")
        load_before, busy_before = _loadavg(), machine_busy_seconds()
        own_before = resource.getrusage(resource.RUSAGE_CHILDREN)
        launched_at = time.time()
        env = dict(os.environ, PYTHONPATH=tree, PYTHONUNBUFFERED="1", TF_CPP_MIN_LOG_LEVEL="3",
                   **{_RANK_OUT: out, _LAUNCHED_AT: repr(launched_at)})
        process = subprocess.Popen(command, cwd=tree, env=env, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True, start_new_session=True)
        first_step, lines = None, []
        for line in process.stdout:
            lines.append(line)
            match = STEP_LINE.search(line)
            if match and first_step is None:
                first_step = time.time() - launched_at - float(match.group(1)) / 1000
        status = process.wait(timeout=FLAGS.timeout)
        wall = time.time() - launched_at
        own_after = resource.getrusage(resource.RUSAGE_CHILDREN)
        own_cpu = (own_after.ru_utime + own_after.ru_stime
                   - own_before.ru_utime - own_before.ru_stime)
        other_cpu = machine_busy_seconds() - busy_before - own_cpu
        per_rank = []
        for rank in range(ranks):
            path = f"{out}.{rank}"
            if os.path.exists(path):
                with open(path) as rank_file:
                    per_rank.append(json.load(rank_file))
    if status != 0 or len(per_rank) != ranks:
        raise RuntimeError(f"{' '.join(command)} (in {tree}) failed:\n{''.join(lines[-40:])}")
    return {"engine": engine, "ranks": ranks, "capacity": int(capacity), "tree": label,
            "commit": _commit(tree), "extra_flags": FLAGS.extra_flags,
            "launch_to_first_step_from_output": round(first_step, 2),
            "launch_to_first_step": max(r["phases"]["first_step"][0] for r in per_rank),
            "per_rank": per_rank, "run_seconds": round(wall, 1),
            "run_cpu_seconds": round(own_cpu, 1),
            "other_processes_cpu_seconds": round(other_cpu, 1),
            "loadavg_before": load_before, "loadavg_after": _loadavg(),
            "date": time.strftime("%Y-%m-%d %H:%M"), "note": FLAGS.note}


def phase_table(rows):
    """Markdown: per run, each phase's seconds (wall, the slowest rank's end of it, since the
    previous one's; `started`: since the launch) and CPU seconds (the ranks' median of that
    phase's)."""
    import statistics

    lines = ["| engine | capacity | tree | load before | launch to first step (s) | "
             + " | ".join(PHASES[:-1]) + " | CPU s per rank to first step |",
             "|---|---:|---|---:|---:|" + "---:|" * (len(PHASES) - 1) + "---:|"]
    for row in rows:
        cells = [f"{max(r['phases']['started'][0] for r in row['per_rank']):.1f} / -"]
        for previous, phase in zip(PHASES, PHASES[1:-1]):
            wall = max(r["phases"][phase][0] for r in row["per_rank"]) - max(
                r["phases"][previous][0] for r in row["per_rank"])
            cpu = statistics.median(r["phases"][phase][1] - r["phases"][previous][1]
                                    for r in row["per_rank"])
            cells.append(f"{wall:.1f} / {cpu:.2f}")
        cpu_total = statistics.median(r["phases"]["first_step"][1] for r in row["per_rank"])
        lines.append(f"| {row['engine']} | {row['capacity']:,} | {row['tree']} | "
                     f"{row['loadavg_before'][0]:.1f} | {row['launch_to_first_step']:.1f} | "
                     + " | ".join(cells) + f" | {cpu_total:.2f} |")
    return "\n".join(lines)


def summary_table(rows):
    """Markdown: per engine, capacity and tree, the runs' launch to first step and CPU seconds
    per rank to it (each run's median rank), with the load averages they met."""
    import statistics

    groups = {}
    for row in rows:
        groups.setdefault((row["engine"], row["capacity"], row["tree"]), []).append(row)
    lines = ["| engine | capacity | tree | runs | load before | launch to first step (s) | "
             "CPU s per rank to first step |", "|---|---:|---|---:|---|---|---|"]
    for (engine, capacity, tree), runs in groups.items():
        loads = [run["loadavg_before"][0] for run in runs]
        walls = [run["launch_to_first_step"] for run in runs]
        cpus = [statistics.median(r["phases"]["first_step"][1] for r in run["per_rank"])
                for run in runs]
        lines.append(f"| {engine} | {capacity:,} | {tree} | {len(runs)} | "
                     f"{min(loads):.1f}-{max(loads):.1f} | "
                     f"{', '.join(f'{w:.1f}' for w in walls)} | "
                     f"{', '.join(f'{c:.2f}' for c in cpus)} |")
    return "\n".join(lines)


def report(path):
    rows = [json.loads(line) for line in open(path)]
    print(summary_table(rows))
    print("\nEach phase: wall seconds (the slowest rank, from the previous phase's end) / CPU "
          "seconds (the ranks' median).\n")
    print(phase_table(rows))


def main(argv):
    del argv
    from benchmarks.timing import cpu_flags, machine_description

    if not FLAGS.report:
        labels = FLAGS.tree_labels or FLAGS.trees
        machine = {"machine": machine_description(), "cpu_flags": cpu_flags()}
        for _ in range(FLAGS.rounds):
            for engine in FLAGS.engines:
                for capacity in FLAGS.capacities:
                    for tree, label in zip(FLAGS.trees, labels):
                        result = dict(run_once(engine, capacity, tree, label), **machine)
                        with open(FLAGS.results, "a") as results:
                            results.write(json.dumps(result) + "\n")
                        print(phase_table([result]).splitlines()[-1], flush=True)
    report(FLAGS.results)


if __name__ == "__main__":
    app.run(main)
