"""The multi-process test jobs of every test module, grouped into as few launches as possible:
one process (or one launch of P ranks on an engine: `horovodrun -np P --gloo`, or `python -m
tfscale.run -np P` for TensorFlow's collective runtime) runs every job registered for its number
of ranks, engine and stage (tests/multiworker/jobs.py), so that TensorFlow and the engine start
once per launch instead of once per job. A launch costs 15-25 s before its first job.

A job of several ranks runs on each engine of its `engines` (Horovod's by default, ENGINES for
both); its result on Horovod is `launched_jobs[name]`, on TensorFlow's engine
`launched_jobs[on_engine(name, "tf")]`, and "{engine}" in its arguments names the engine, so
that the two runs write apart.

Test modules register their jobs when imported (`job(...)`; pytest imports every collected module
before the first test runs) and the input files those jobs read (`prepare(...)`). When the
session starts, tests/conftest.py starts the launches of the jobs of every module with a
collected test that uses the fixture `launched_jobs`, in the background (InBackground), and
orders those tests last; they wait for the launches to end. Stage 0's launches run before stage
1's; within a stage the one-process launch runs beside the multi-process launches, which run one
after another (Horovod's 2, 3, then 4 ranks, then TensorFlow's engine's). A job may read what any job of an earlier stage wrote, and
what a horovodrun launch of fewer ranks in its own stage wrote. Paths in a job's arguments are
written relative to the session's launch directory as "{dir}/..."."""

import concurrent.futures
import dataclasses
import json
import os
import pathlib
import subprocess
import sys
import threading
import time

from tests.horovod_launch import horovodrun_command, side_by_side, tfscale_run_command

_JOBS = {}
_PREPARERS = []
ENGINES = ("horovod", "tf")


def on_engine(name, engine):
    """The name a job registered as `name` runs under on `engine` ("horovod": `name` itself)."""
    return name if engine == "horovod" else f"{name}@{engine}"


@dataclasses.dataclass
class Job:
    owner: str
    name: str
    ranks: int
    stage: int
    module: str
    args: list
    timeout: float
    before_horovod: bool
    engine: str


def job(name, ranks, module, *args, stage=0, timeout=240, before_horovod=False,
        engines=("horovod",)):
    """Registers `module.main(*args)` to run on `ranks` ranks (1: one process, no engine) in
    launch stage `stage`, on each of `engines` when `ranks` > 1 ("{engine}" in an argument is
    replaced by the engine's name); `timeout` is its share of its launch's timeout. A job that
    builds something before Horovod starts gives `before_horovod` (Horovod only) and runs first
    in its launch (one such job per launch). Returns `name`."""
    owner = _registering_module()
    engines = ("horovod",) if ranks == 1 or before_horovod else engines
    for engine in engines:
        key = on_engine(name, engine)
        assert key not in _JOBS, f"two jobs named {key}"
        _JOBS[key] = Job(owner, key, ranks, stage, module,
                         [str(arg).replace("{engine}", engine) for arg in args], timeout,
                         before_horovod, engine if ranks > 1 else "none")
    return name


def launcher_job(name, ranks, *flags, stage=0, timeout=240, engines=("horovod",)):
    """Registers `python -m launch.train FLAGS` as a job (tests/multiworker/launcher_run.py)."""
    return job(name, ranks, "tests.multiworker.launcher_run", *flags, stage=stage,
               timeout=timeout, engines=engines)


def prepare(write_inputs):
    """Registers `write_inputs(directory)`, called with the launch directory before any launch
    (the files the jobs read). Returns it."""
    _PREPARERS.append((_registering_module(), write_inputs))
    return write_inputs


def _registering_module():
    """The name of the module that called into this one."""
    frame = sys._getframe(1)
    while frame.f_globals["__name__"] == __name__:
        frame = frame.f_back
    return frame.f_globals["__name__"]


class JobResult:
    """What a job's ranks wrote: their exit statuses, stdout and stderr. Reading any of them
    fails (with the launch's own output) when a rank did not end the job: the launch ended or
    was killed before."""

    def __init__(self, job, log_dir, launch_output):
        self.name, self.ranks, self.log_dir = job.name, job.ranks, log_dir
        self.launch_output = launch_output

    def _read(self, rank, kind):
        path = os.path.join(self.log_dir, f"rank{rank}.{kind}")
        if not os.path.exists(path):
            return None
        with open(path) as f:
            return f.read()

    def _statuses(self):
        statuses = [self._read(rank, "status") for rank in range(self.ranks)]
        assert None not in statuses, (
            f"job {self.name} did not end on every rank (statuses {statuses}); its launch's "
            f"output:\n{self.launch_output[-5000:]}")
        return [int(status) for status in statuses]

    @property
    def returncode(self):
        """0 when every rank ended the job with status 0, else the first other status."""
        return next((status for status in self._statuses() if status != 0), 0)

    def stdout(self, rank=0):
        self._statuses()
        return self._read(rank, "stdout")

    def stderr(self, rank=0):
        self._statuses()
        return self._read(rank, "stderr")

    @property
    def output(self):
        """Every rank's stdout and stderr, each line prefixed as horovodrun does
        ("[<rank>]<stdout>:")."""
        return "\n".join(f"[{rank}]<{kind}>:{line}" for rank in range(self.ranks)
                         for kind in ("stdout", "stderr")
                         for line in getattr(self, kind)(rank).splitlines())


class LaunchedJobs(dict):
    """{job name: JobResult} of the launches run in `directory`."""

    def __init__(self, directory):
        super().__init__()
        self.directory = directory

    def path(self, template):
        """The path a job's argument "{dir}/..." names."""
        return pathlib.Path(template.format(dir=self.directory))


class InBackground:
    """The launches of the jobs that `modules` (names) registered, in `directory` (a
    pathlib.Path), run by a thread so that their processes work while pytest runs other tests.
    The jobs' input files are written first, in the calling thread."""

    def __init__(self, directory, modules):
        for owner, write_inputs in _PREPARERS:
            if owner in modules:
                write_inputs(directory)
        self._jobs = LaunchedJobs(directory)
        self._error = None
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run_all, args=([j for j in _JOBS.values() if j.owner in modules],),
            name="grouped launches", daemon=True)
        self._thread.start()

    def _run_all(self, jobs):
        try:
            self._run_stages(jobs)
        except BaseException as error:  # noqa: B036 (raised again in the thread that waits)
            self._error = error
        finally:
            _write_outcome(self._jobs, self._error)

    def _run_stages(self, jobs):
        for stage in sorted({j.stage for j in jobs}):
            groups = {}
            for j in jobs:
                if j.stage == stage:
                    groups.setdefault((j.engine != "horovod", j.engine, j.ranks), []).append(j)
            one_process = [groups[key] for key in groups if key[2] == 1]
            several = [groups[key] for key in sorted(groups) if key[2] > 1]
            with concurrent.futures.ThreadPoolExecutor(2) as pool:
                lanes = [pool.submit(self._run_lane, stage, lane)
                         for lane in (one_process, several)]
                for lane in lanes:
                    lane.result()

    def _run_lane(self, stage, groups):
        """Launches `groups` (lists of jobs of one number of ranks) one after another."""
        for group in groups:
            group = sorted(group, key=lambda j: not j.before_horovod)
            assert sum(j.before_horovod for j in group) <= 1, [j.name for j in group]
            self._jobs.update(self._launch(
                group, f"stage{stage}-P{group[0].ranks}-{group[0].engine}"))

    def _launch(self, group, label):
        """Runs the jobs of `group` (same ranks) in one launch; {name: JobResult}."""
        directory = self._jobs.directory
        plan = [{"name": j.name, "log_dir": str(directory / "logs" / j.name), "module": j.module,
                 "args": [arg.format(dir=directory) for arg in j.args]} for j in group]
        plan_path = directory / f"{label}.json"
        plan_path.write_text(json.dumps(plan, indent=1))
        args = ["tests/multiworker/jobs.py", str(plan_path)]
        ranks, timeout = group[0].ranks, sum(j.timeout for j in group)
        command = ([sys.executable, *args] if ranks == 1
                   else horovodrun_command(ranks, args) if group[0].engine == "horovod"
                   else tfscale_run_command(ranks, args))
        try:
            output = side_by_side([command], timeout, stop=self._stop)[0].stdout
        except subprocess.TimeoutExpired as expired:
            output = f"{expired.output}\n(killed after {timeout:.0f} s)"
        return {j.name: JobResult(j, entry["log_dir"], output) for j, entry in zip(group, plan)}

    def result(self):
        """The LaunchedJobs, once every launch has ended."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._jobs

    def stop(self):
        """Kills the running launch, if any, and starts no other."""
        self._stop.set()
        self._thread.join()


class InAnotherWorker:
    """The launches an InBackground of another pytest-xdist worker runs in `directory`: their
    results once its outcome file is written."""

    def __init__(self, directory):
        self._directory = directory

    def result(self, poll_seconds=2):
        outcome = self._directory / OUTCOME_FILE
        deadline = time.monotonic() + sum(j.timeout for j in _JOBS.values()) + 600
        while not outcome.exists():
            assert time.monotonic() < deadline, f"no {outcome} from the worker running the launches"
            time.sleep(poll_seconds)
        written = json.loads(outcome.read_text())
        if written["error"]:
            raise RuntimeError(f"the grouped launches failed in another worker: {written['error']}")
        jobs = LaunchedJobs(self._directory)
        for name, (log_dir, output) in written["jobs"].items():
            jobs[name] = JobResult(_JOBS[name], log_dir, output)
        return jobs


OUTCOME_FILE = "outcome.json"


def _write_outcome(jobs, error):
    """What InAnotherWorker reads: every job's log directory and its launch's output, and the
    error that ended the launches, if any (written whole, then renamed into place)."""
    written = {"error": None if error is None else repr(error),
               "jobs": {name: (job.log_dir, job.launch_output) for name, job in jobs.items()}}
    partial = jobs.directory / (OUTCOME_FILE + ".partial")
    partial.write_text(json.dumps(written))
    os.replace(partial, jobs.directory / OUTCOME_FILE)
