"""Launching test scripts under `horovodrun -np N --gloo` on loopback, for the multi-process
tests, or as plain processes (a reference computed away from pytest's process, where earlier
tests have run; independent runs side by side). A launch that outlives its timeout is killed
with every process it started (horovodrun's ranks run in sessions of their own), so a hung job
cannot outlive its test."""

import os
import signal
import subprocess
import sys
import tempfile
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Installed plugins for the launched processes: the test table strategy's entry point
# (tests/partitioned_strategy.py).
PLUGINS = os.path.join(REPO_ROOT, "tests", "plugins")
# First on the path of launches on TensorFlow's engine: Horovod as if never installed.
WITHOUT_HOROVOD = os.path.join(REPO_ROOT, "tests", "without_horovod")


def horovodrun(num_ranks, args, timeout=240):
    """Runs `python ARGS` on `num_ranks` local ranks with Gloo and returns the CompletedProcess
    (stdout and stderr merged into stdout)."""
    return _run(horovodrun_command(num_ranks, args), timeout)


def horovodrun_command(num_ranks, args):
    """The command line of `python ARGS` on `num_ranks` local ranks with Gloo."""
    horovodrun_bin = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    return [horovodrun_bin, "-np", str(num_ranks), "-H", f"localhost:{num_ranks}", "--gloo",
            sys.executable] + list(args)


def tfscale_run_command(num_ranks, args):
    """The command line of `python ARGS` on `num_ranks` local ranks of TensorFlow's collective
    runtime (tfscale.run), with Horovod hidden (WITHOUT_HOROVOD): that engine needs none."""
    path = os.pathsep.join([WITHOUT_HOROVOD, REPO_ROOT, PLUGINS])
    return ["env", f"PYTHONPATH={path}", sys.executable, "-m", "tfscale.run",
            "-np", str(num_ranks)] + list(args)


def tfscale_run(num_ranks, args, timeout=240):
    """Runs `python ARGS` on `num_ranks` local ranks of TensorFlow's engine and returns the
    CompletedProcess (stdout and stderr merged into stdout)."""
    return _run(tfscale_run_command(num_ranks, args), timeout)


def python(args, timeout=240):
    """Runs `python ARGS` as one process (no Horovod) and returns the CompletedProcess (stdout
    and stderr merged into stdout)."""
    return _run([sys.executable] + list(args), timeout)


def python_side_by_side(arg_lists, timeout=240, separate_stderr=False):
    """Runs `python ARGS` for each ARGS of `arg_lists` as concurrent processes (no Horovod), so
    that independent runs share the machine's cores (one TensorFlow process of a small model
    keeps about one busy); see side_by_side."""
    return side_by_side([[sys.executable] + list(args) for args in arg_lists], timeout,
                        separate_stderr)


def horovodrun_side_by_side(num_ranks, arg_lists, timeout=240):
    """Runs `python ARGS` on `num_ranks` ranks for each ARGS of `arg_lists`, the launches
    concurrently (independent jobs that mostly wait: start-up, a failure); see side_by_side."""
    return side_by_side([horovodrun_command(num_ranks, args) for args in arg_lists], timeout)


def side_by_side(commands, timeout=240, separate_stderr=False, stop=None):
    """Runs `commands` as concurrent processes and returns their CompletedProcesses in order
    (stderr merged into stdout unless `separate_stderr`), each with `ended`, the time.time() at
    which its process ended; on timeout, kills them all and raises subprocess.TimeoutExpired
    with the first unfinished one's output; when `stop` (a threading.Event) is set meanwhile,
    kills them all and raises InterruptedError."""
    deadline = time.monotonic() + timeout
    started = []
    try:
        for command in commands:
            # Files, not pipes: a full pipe would stall its process until the ones before end.
            stdout = tempfile.TemporaryFile(mode="w+")
            stderr = tempfile.TemporaryFile(mode="w+") if separate_stderr else None
            started.append((command, stdout, stderr, _start(command, stdout, stderr)))
        ended = {}
        while True:
            for index, (_, _, _, process) in enumerate(started):
                if index not in ended and process.poll() is not None:
                    ended[index] = time.time()
            unfinished = [entry for index, entry in enumerate(started) if index not in ended]
            if not unfinished:
                break
            if stop is not None and stop.is_set():
                raise InterruptedError(f"stopped: {unfinished[0][0]}")
            if time.monotonic() > deadline:
                command, stdout, stderr, _ = unfinished[0]
                raise subprocess.TimeoutExpired(command, timeout, output=_read(stdout),
                                                stderr=_read(stderr))
            time.sleep(0.1)
        results = []
        for index, (command, stdout, stderr, process) in enumerate(started):
            result = subprocess.CompletedProcess(command, process.returncode, _read(stdout),
                                                 _read(stderr))
            result.ended = ended[index]
            results.append(result)
        return results
    finally:
        for _, stdout, stderr, process in started:
            if process.poll() is None:
                kill_process_tree(process.pid)
                process.wait()
            for stream in (stdout, stderr):
                if stream is not None:
                    stream.close()


def _read(stream):
    """All that was written to the temporary file `stream` (None for None)."""
    if stream is None:
        return None
    stream.seek(0)
    return stream.read()


def _start(command, stdout, stderr=None):
    """The Popen of `command` from the repository root (and the test plugins) on the path, in a
    session of its own, its stderr merged into `stdout` unless a `stderr` is given."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO_ROOT, PLUGINS]),
               TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=stdout,
                            stderr=subprocess.STDOUT if stderr is None else stderr, text=True,
                            start_new_session=True)


def _run(command, timeout):
    """The CompletedProcess of `command` (stdout and stderr merged); on timeout, kills the
    command and all its descendants, then raises subprocess.TimeoutExpired with the output."""
    process = _start(command, subprocess.PIPE)
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_process_tree(process.pid)
        output, _ = process.communicate()
        raise subprocess.TimeoutExpired(command, timeout, output=output) from None
    return subprocess.CompletedProcess(command, process.returncode, output)


def descendants(pid):
    """The pids of every process below `pid` (from /proc)."""
    children = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as stat:
                parent = int(stat.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):  # gone meanwhile
            continue
        children.setdefault(parent, []).append(int(entry))
    found, pending = [], [pid]
    while pending:
        below = children.get(pending.pop(), [])
        found += below
        pending += below
    return found


def kill_process_tree(pid):
    """SIGKILL to `pid`, its process group and every descendant (until none is left)."""
    while True:
        victims = descendants(pid)
        for victim in [pid] + victims:
            try:
                os.kill(victim, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if not victims:
            return


def launch_side_by_side(*flag_lists, timeout=300):
    """The CompletedProcesses of `python -m launch.train FLAGS` for each of `flag_lists`, run as
    concurrent processes (independent runs, one per core)."""
    return python_side_by_side([["-m", "launch.train", *flags] for flags in flag_lists],
                               timeout=timeout, separate_stderr=True)
