#!/usr/bin/env bash
# Sets up the project's virtual environment in .venv: tfscale with its pinned dependencies and
# test extras, then Horovod built against the installed TensorFlow. Safe to run again: it only
# redoes what changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=.venv

if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip setuptools wheel
fi
"$VENV/bin/python" -m pip install -q -e ".[test,bench]"
bash scripts/install_horovod.sh "$VENV/bin/python"
