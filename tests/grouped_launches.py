"""The multi-process test jobs of every test module, grouped into as few launches as possible:
one process (or one `horovodrun -np P --gloo` launch) runs every job registered for its number
of ranks and stage (tests/multiworker/jobs.py), so that TensorFlow and Horovod's Gloo ring start
once per launch instead of once per job. A launch costs 15-25 s before its first job.

Test modules register their jobs when imported (`job(...)`; pytest imports every collected module
before the first test runs) and the input files those jobs read (`prepare(...)`); the session
fixture `launched_jobs` (tests/conftest.py) then runs the jobs of the modules whose tests were
collected, all the launches at once, in a fixed order:
stage 0 before stage 1, and within a stage one process, then 2, 3 and 4 ranks. A job may read
what any job of an earlier launch wrote. Paths in a job's arguments are written relative to the
session's launch directory as "{dir}/..."."""

import dataclasses
import json
import os
import pathlib
import subprocess
import sys

from tests.horovod_launch import horovodrun, python

_JOBS = {}
_PREPARERS = []


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


def job(name, ranks, module, *args, stage=0, timeout=240, before_horovod=False):
    """Registers `module.main(*args)` to run on `ranks` ranks (1: one process without Horovod) in
    launch stage `stage`; `timeout` is its share of its launch's timeout. A job that builds
    something before Horovod starts gives `before_horovod` and runs first in its launch (one
    such job per launch). Returns `name`."""
    assert name not in _JOBS, f"two jobs named {name}"
    _JOBS[name] = Job(_registering_module(), name, ranks, stage, module, [str(arg) for arg in args], timeout,
                      before_horovod)
    return name


def launcher_job(name, ranks, *flags, stage=0, timeout=240):
    """Registers `python -m launch.train FLAGS` as a job (tests/multiworker/launcher_run.py)."""
    return job(name, ranks, "tests.multiworker.launcher_run", *flags, stage=stage,
               timeout=timeout)


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
    """What a job's ranks wrote: their exit statuses, stdout and stderr."""

    def __init__(self, job, log_dir, launch_output):
        self.name, self.ranks, self.log_dir = job.name, job.ranks, log_dir
        self._launch_output = launch_output

    def _read(self, rank, kind):
        path = os.path.join(self.log_dir, f"rank{rank}.{kind}")
        if not os.path.exists(path):
            return None
        with open(path) as f:
            return f.read()

    @property
    def returncode(self):
        """0 when every rank ended the job with status 0, else the first other status; None
        when a rank did not end it (the launch ended or was killed before)."""
        statuses = [self._read(rank, "status") for rank in range(self.ranks)]
        if None in statuses:
            return None
        return next((int(s) for s in statuses if int(s) != 0), 0)

    def stdout(self, rank=0):
        return self._read(rank, "stdout") or ""

    def stderr(self, rank=0):
        return self._read(rank, "stderr") or ""

    @property
    def output(self):
        """Every rank's stdout and stderr, each line prefixed as horovodrun does
        ("[<rank>]<stdout>:"), then the end of the launch's own output if the job did not end."""
        lines = [f"[{rank}]<{kind}>:{line}" for rank in range(self.ranks)
                 for kind in ("stdout", "stderr")
                 for line in getattr(self, kind)(rank).splitlines()]
        if self.returncode is None:
            lines.append(f"job {self.name} did not end; its launch's output:\n"
                         f"{self._launch_output[-5000:]}")
        return "\n".join(lines)


class LaunchedJobs(dict):
    """{job name: JobResult} of the launches run in `directory`."""

    def __init__(self, directory):
        super().__init__()
        self.directory = directory

    def path(self, template):
        """The path a job's argument "{dir}/..." names."""
        return pathlib.Path(template.format(dir=self.directory))


def run_all(directory, modules):
    """Runs the jobs that `modules` (names) registered, after their preparers, in `directory`
    (a pathlib.Path) and returns their LaunchedJobs."""
    for owner, write_inputs in _PREPARERS:
        if owner in modules:
            write_inputs(directory)
    jobs = [j for j in _JOBS.values() if j.owner in modules]
    results = LaunchedJobs(directory)
    for key in sorted({(j.stage, j.ranks) for j in jobs}):
        group = sorted((j for j in jobs if (j.stage, j.ranks) == key),
                       key=lambda j: not j.before_horovod)
        assert sum(j.before_horovod for j in group) <= 1, [j.name for j in group]
        results.update(_launch(group, directory, f"stage{key[0]}-P{key[1]}"))
    return results


def _launch(group, directory, label):
    """Runs the jobs of `group` (same ranks) in one launch; {name: JobResult}."""
    plan = [{"name": j.name, "log_dir": str(directory / "logs" / j.name), "module": j.module,
             "args": [arg.format(dir=directory) for arg in j.args]} for j in group]
    plan_path = directory / f"{label}.json"
    plan_path.write_text(json.dumps(plan, indent=1))
    args, timeout = ["tests/multiworker/jobs.py", str(plan_path)], sum(j.timeout for j in group)
    ranks = group[0].ranks
    try:
        done = python(args, timeout) if ranks == 1 else horovodrun(ranks, args, timeout)
        output = done.stdout
    except subprocess.TimeoutExpired as expired:
        output = f"{expired.output}\n(killed after {timeout:.0f} s)"
    return {j.name: JobResult(j, entry["log_dir"], output) for j, entry in zip(group, plan)}
