"""launch.predict and launch.export read every rank's rows in one process: started by a
launcher of several processes (horovodrun's or tfscale.run's variables), each refuses before
reading anything, with exit status 2 and a paragraph naming both launchers."""

import json
import os
import subprocess
import sys

import pytest

from tests.horovod_launch import REPO_ROOT

LAUNCHED = {
    "horovodrun": {"HOROVOD_RANK": "0", "HOROVOD_SIZE": "2"},
    "tfscale.run": {"TF_CONFIG": json.dumps({"cluster": {"worker": ["localhost:1",
                                                                      "localhost:2"]},
                                             "task": {"type": "worker", "index": 0}})},
}
TOOLS = {
    "launch.predict": ["--checkpoint_dir=nowhere", "--input=nothing.txt"],
    "launch.export": ["--checkpoint_dir=nowhere", "--output=nowhere/1"],
}


@pytest.mark.parametrize("launcher", sorted(LAUNCHED))
@pytest.mark.parametrize("tool", sorted(TOOLS))
def test_refused_in_a_job_of_several_processes(tool, launcher, tmp_path):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("HOROVOD_") and k != "TF_CONFIG"}
    env.update(LAUNCHED[launcher], TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run([sys.executable, "-m", tool, *TOOLS[tool]], cwd=tmp_path,
                          env=dict(env, PYTHONPATH=REPO_ROOT), capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"{tool} " in done.stderr and "without horovodrun or tfscale.run" in done.stderr, \
        done.stderr[-2000:]
    assert not (tmp_path / "nowhere").exists()
