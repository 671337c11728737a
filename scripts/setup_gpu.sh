#!/usr/bin/env bash
# `make setup GPU=1`: the GPU variant's virtual environment in .venv-gpu (docs/gpu.md):
# tfscale with its test extras and tensorflow[and-cuda]==2.21.0, the CUDA 12 wheels pinned by
# scripts/gpu-constraints.txt, then Horovod built with NCCL (scripts/install_horovod_gpu.sh).
# Runs on a machine without a GPU; .venv (the CPU set-up) is not touched. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=.venv-gpu

if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip setuptools wheel
fi
"$VENV/bin/python" -m pip install -q -c scripts/gpu-constraints.txt \
  "tensorflow[and-cuda]==2.21.0" -e ".[test,bench]"
bash scripts/install_horovod_gpu.sh "$VENV/bin/python"
