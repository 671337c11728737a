#!/usr/bin/env bash
# Builds Horovod 0.28.1 with NCCL for GPU tensors (Gloo stays for CPU tensors and horovodrun
# --gloo) against the TensorFlow of the given Python environment, and installs it there
# (docs/gpu.md). Needs no GPU, but needs a CUDA 12 compiler:
#
# - nvcc: the CUDA 12 toolkit at HOROVOD_CUDA_HOME (or CUDA_HOME), else that of nvcc on PATH.
#   PyPI has none: every nvidia-cuda-nvcc-cu12 wheel (12.0 to 12.9) ships ptxas but no nvcc.
#   The toolkit also gives the CUDA headers and the static CUDA runtime Horovod links.
# - NCCL: the nvidia-nccl-cu12 wheel TensorFlow itself uses (scripts/gpu-constraints.txt).
# Patches, NCCL linking and GPU architectures: scripts/horovod_gpu_source.sh. The wheel is
# cached next to the CPU build's, keyed by TF version, Python and CUDA major version.
#
# Usage: scripts/install_horovod_gpu.sh PYTHON
set -euo pipefail
PY=${1:?usage: install_horovod_gpu.sh PYTHON}
source "$(dirname "$0")/horovod_gpu_source.sh"

if "$PY" -c "import horovod.tensorflow as h; h.init(); assert h.nccl_built()" >/dev/null 2>&1; then
  echo "horovod: already installed with NCCL and loads"
  exit 0
fi

TF_VERSION=$("$PY" -c "import tensorflow as tf; print(tf.__version__)" 2>/dev/null | tail -n 1)
PY_TAG=$("$PY" -c "import sys; print(f'cp{sys.version_info[0]}{sys.version_info[1]}')")
CACHE_DIR=${TFSCALE_CACHE:-$HOME/.cache/tfscale}/horovod-$HOROVOD_VERSION-tf$TF_VERSION-$PY_TAG-cuda12

WHEEL=$(ls "$CACHE_DIR"/horovod-*.whl 2>/dev/null | head -n 1 || true)
if [ -z "$WHEEL" ]; then
  CUDA_DIR=${HOROVOD_CUDA_HOME:-${CUDA_HOME:-}}
  if [ -z "$CUDA_DIR" ] && command -v nvcc >/dev/null; then
    CUDA_DIR=$(cuda_toolkit_of nvcc)
  fi
  if [ -z "$CUDA_DIR" ] || [ ! -x "$CUDA_DIR/bin/nvcc" ]; then
    echo "horovod: cannot build the GPU variant: no CUDA 12 nvcc (HOROVOD_CUDA_HOME and" \
         "CUDA_HOME unset or wrong, no nvcc on PATH). The nvidia-cuda-nvcc-cu12 wheels ship" \
         "only ptxas; install a CUDA 12 toolkit (nvcc, headers, static runtime) and set" \
         "HOROVOD_CUDA_HOME to it (docs/gpu.md)." >&2
    exit 1
  fi
  RELEASE=$("$CUDA_DIR/bin/nvcc" --version | sed -n 's/.*release \([0-9.]*\),.*/\1/p')
  case "$RELEASE" in
    12.*) ;;
    *) echo "horovod: $CUDA_DIR/bin/nvcc is CUDA '$RELEASE'; TensorFlow 2.21's wheels are" \
            "CUDA 12, so Horovod needs a CUDA 12 toolkit" >&2; exit 1 ;;
  esac
  echo "horovod: building $HOROVOD_VERSION with NCCL against TensorFlow $TF_VERSION," \
       "CUDA $RELEASE ($CUDA_DIR)"
  WORK=$(mktemp -d)
  trap 'rm -rf "$WORK"' EXIT
  SRC=$(prepare_horovod_gpu_source "$PY" "$WORK")
  build_horovod_gpu_wheel "$PY" "$SRC" "$CUDA_DIR" "$WORK/dist"
  mkdir -p "$CACHE_DIR"
  cp "$WORK"/dist/horovod-*.whl "$CACHE_DIR/"
  WHEEL=$(ls "$CACHE_DIR"/horovod-*.whl | head -n 1)
fi

"$PY" -m pip install -q --no-deps --force-reinstall "$WHEEL"
"$PY" -m pip install -q cloudpickle psutil pyyaml packaging
"$PY" -c "import horovod.tensorflow as h; h.init(); assert h.nccl_built(), 'no NCCL in this build'; \
print('horovod: loads, size', h.size(), 'cuda_built', h.cuda_built(), 'nccl_built', h.nccl_built(), \
'gloo_built', h.gloo_built())"
