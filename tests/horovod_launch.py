"""Launching test scripts under `horovodrun -np N --gloo` on loopback, for the multi-process
tests, or as one plain process (a reference computed away from pytest's process, where earlier
tests have run). A launch that outlives its timeout is killed with every process it started
(horovodrun's ranks run in sessions of their own), so a hung job cannot outlive its test."""

import os
import signal
import subprocess
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def horovodrun(num_ranks, args, timeout=240):
    """Runs `python ARGS` on `num_ranks` local ranks with Gloo and returns the CompletedProcess
    (stdout and stderr merged into stdout)."""
    horovodrun_bin = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    command = [horovodrun_bin, "-np", str(num_ranks), "-H", f"localhost:{num_ranks}", "--gloo",
               sys.executable] + list(args)
    return _run(command, timeout)


def python(args, timeout=240):
    """Runs `python ARGS` as one process (no Horovod) and returns the CompletedProcess (stdout
    and stderr merged into stdout)."""
    return _run([sys.executable] + list(args), timeout)


def _run(command, timeout):
    """The CompletedProcess of `command` (stdout and stderr merged); on timeout, kills the
    command and all its descendants, then raises subprocess.TimeoutExpired with the output."""
    env = dict(os.environ, PYTHONPATH=REPO_ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    process = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
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
