"""Launching test scripts under `horovodrun -np N --gloo` on loopback, for the multi-process
tests, or as one plain process (a reference computed away from pytest's process, where earlier
tests have run)."""

import os
import subprocess
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def horovodrun(num_ranks, args, timeout=240):
    """Runs `python ARGS` on `num_ranks` local ranks with Gloo and returns the CompletedProcess
    (stdout and stderr merged into stdout)."""
    horovodrun_bin = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    command = [horovodrun_bin, "-np", str(num_ranks), "-H", f"localhost:{num_ranks}", "--gloo",
               sys.executable] + list(args)
    env = dict(os.environ, PYTHONPATH=REPO_ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.run(command, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=timeout)


def python(args, timeout=240):
    """Runs `python ARGS` as one process (no Horovod) and returns the CompletedProcess (stdout
    and stderr merged into stdout)."""
    env = dict(os.environ, PYTHONPATH=REPO_ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.run([sys.executable] + list(args), cwd=REPO_ROOT, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout)
