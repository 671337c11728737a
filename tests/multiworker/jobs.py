"""Several test jobs in one process, so that one launch starts TensorFlow (and its engine) once
for all of them: `horovodrun -np P ... python tests/multiworker/jobs.py PLAN.json` or `python -m
tfscale.run -np P tests/multiworker/jobs.py PLAN.json`, or plain `python
tests/multiworker/jobs.py PLAN.json` for one process (tests/grouped_launches.py writes the plan
and runs the launches).

PLAN.json lists jobs {"name", "log_dir", "module", "args"}, run in order: each calls
`module.main(*args)` (tests/multiworker/launcher_run.py runs `launch.train`) in a fresh Keras
session (layer and model names counted from scratch, as checkpoints key variables by them) with
TensorFlow's op determinism off, as a new process would start it. While a job runs,
what the process writes to its stdout and stderr (file descriptors 1 and 2, so TensorFlow's and
Horovod's C++ output too) goes to LOG_DIR/rank<r>.stdout and .stderr; at its end the rank
writes its exit status (main's return value, a SystemExit's code, 1 after an exception, whose
traceback goes to the job's stderr) to LOG_DIR/rank<r>.status. In a launch of several ranks a
job that fails ends the process at once: the launcher then ends the others (a dead rank ends the
job) instead of letting them wait for a rank that went on to another job; one process goes on to
its next job (some are meant to fail: the launcher's refusals)."""

import contextlib
import importlib
import json
import os
import resource
import sys
import time
import traceback

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import keras  # noqa: E402
from tensorflow.python.framework import config as tf_config  # noqa: E402


def fresh_session():
    """Keras's and TensorFlow's global state as a new process has it: a new Keras session (names
    counted from scratch) and op determinism off."""
    keras.backend.clear_session()
    tf_config.disable_op_determinism()


@contextlib.contextmanager
def output_to(stdout_path, stderr_path):
    """File descriptors 1 and 2 (and so sys.stdout, sys.stderr) written to the two files."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(stdout_path, "w") as stdout, open(stderr_path, "w") as stderr:
        os.dup2(stdout.fileno(), 1)
        os.dup2(stderr.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)


def run_job(module, args):
    """The exit status of `module.main(*args)`, as if it were the process's main."""
    try:
        fresh_session()
        status = importlib.import_module(module).main(*args)
    except SystemExit as exit_:
        status = exit_.code
    except BaseException:  # noqa: B036 (reported as the job's failure, then the process ends)
        traceback.print_exc()
        return 1
    if status is None or isinstance(status, int):
        return status or 0
    print(status, file=sys.stderr)  # sys.exit("message")
    return 1


def _cpu_seconds():
    """CPU time this process has used (user and system), so that a launch's output tells what
    each job cost."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main(plan_path):
    with open(plan_path) as f:
        plan = json.load(f)
    from tfscale.distributed import runtime, tf_cluster

    several = runtime.announced_size() > 1
    rank = os.environ.get("HOROVOD_RANK") or (
        str(tf_cluster.read_cluster().rank) if tf_cluster.configured() else "0")
    for job in plan:
        log = os.path.join(job["log_dir"], f"rank{rank}")
        os.makedirs(job["log_dir"], exist_ok=True)
        started, cpu_before = time.monotonic(), _cpu_seconds()
        with output_to(f"{log}.stdout", f"{log}.stderr"):
            status = run_job(job["module"], job["args"])
        with open(f"{log}.status", "w") as f:
            f.write(str(status))
        print(f"rank {rank}: job {job['name']} ended with status {status} "
              f"({time.monotonic() - started:.1f} s, {_cpu_seconds() - cpu_before:.1f} CPU s)",
              flush=True)
        if status != 0 and several:
            os._exit(status)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
