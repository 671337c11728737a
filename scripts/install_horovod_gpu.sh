#!/usr/bin/env bash
# Builds Horovod 0.28.1 with NCCL for GPU tensors (Gloo stays for CPU tensors and horovodrun
# --gloo) against the TensorFlow of the given Python environment, and installs it there
# (README, "GPU hosts"). Needs no GPU, but needs a CUDA 12 compiler:
#
# - nvcc: the CUDA 12 toolkit at HOROVOD_CUDA_HOME, else the one whose bin/nvcc is on PATH.
#   PyPI has none: every nvidia-cuda-nvcc-cu12 wheel (12.0 to 12.9) ships ptxas but no nvcc.
#   The toolkit also gives the CUDA headers and the static CUDA runtime Horovod links.
# - NCCL: the nvidia-nccl-cu12 wheel TensorFlow itself uses (scripts/gpu-constraints.txt):
#   its headers, and libnccl.so.2 through a libnccl.so link in the build directory (the wheel
#   ships no unversioned name); found at run time through an RPATH into the environment.
# - GPU architectures: TensorFlow 2.21's (sm_60, 70, 80, 89, PTX for 90), or
#   HOROVOD_BUILD_CUDA_CC_LIST.
# The source is patched for TF 2.21 (scripts/horovod_gpu_source.sh). The wheel is cached next
# to the CPU build's, keyed by TF version, Python and CUDA major version.
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
SITE=$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
CACHE_DIR=${TFSCALE_CACHE:-$HOME/.cache/tfscale}/horovod-$HOROVOD_VERSION-tf$TF_VERSION-$PY_TAG-cuda12
mkdir -p "$CACHE_DIR"

WHEEL=$(ls "$CACHE_DIR"/horovod-*.whl 2>/dev/null | head -n 1 || true)
if [ -z "$WHEEL" ]; then
  CUDA_DIR=${HOROVOD_CUDA_HOME:-}
  if [ -z "$CUDA_DIR" ] && command -v nvcc >/dev/null; then
    CUDA_DIR=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
  fi
  if [ -z "$CUDA_DIR" ] || [ ! -x "$CUDA_DIR/bin/nvcc" ]; then
    echo "horovod: cannot build the GPU variant: no CUDA 12 nvcc (HOROVOD_CUDA_HOME is" \
         "'${HOROVOD_CUDA_HOME:-}', no nvcc on PATH). The nvidia-cuda-nvcc-cu12 wheels ship" \
         "only ptxas; install a CUDA 12 toolkit (nvcc, headers, static runtime) and set" \
         "HOROVOD_CUDA_HOME to it (README, \"GPU hosts\")." >&2
    exit 1
  fi
  RELEASE=$("$CUDA_DIR/bin/nvcc" --version | sed -n 's/.*release \([0-9.]*\),.*/\1/p')
  case "$RELEASE" in
    12.*) ;;
    *) echo "horovod: $CUDA_DIR/bin/nvcc is CUDA '$RELEASE'; TensorFlow 2.21's wheels are" \
            "CUDA 12, so Horovod needs a CUDA 12 toolkit" >&2; exit 1 ;;
  esac
  NCCL=$SITE/nvidia/nccl
  test -f "$NCCL/include/nccl.h" && test -f "$NCCL/lib/libnccl.so.2"
  echo "horovod: building $HOROVOD_VERSION with NCCL against TensorFlow $TF_VERSION," \
       "CUDA $RELEASE ($CUDA_DIR), NCCL from $NCCL"
  WORK=$(mktemp -d)
  trap 'rm -rf "$WORK"' EXIT
  SRC=$(prepare_horovod_gpu_source "$PY" "$WORK")
  mkdir -p "$WORK/nccl/lib"
  ln -s "$NCCL/include" "$WORK/nccl/include"
  ln -s "$NCCL/lib/libnccl.so.2" "$WORK/nccl/lib/libnccl.so"
  "$PY" -m pip install -q "cmake<4" packaging
  # horovod/tensorflow/mpi_lib*.so -> site-packages/nvidia/nccl/lib (CMake escapes $ORIGIN).
  HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
  HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_WITHOUT_NVTX=1 \
  HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_CUDA_HOME="$CUDA_DIR" CUDAToolkit_ROOT="$CUDA_DIR" \
  HOROVOD_NCCL_HOME="$WORK/nccl" HOROVOD_NCCL_INCLUDE="$WORK/nccl/include" \
  HOROVOD_NCCL_LIB="$WORK/nccl/lib" HOROVOD_NCCL_LINK=SHARED \
  HOROVOD_BUILD_CUDA_CC_LIST="${HOROVOD_BUILD_CUDA_CC_LIST:-60,70,80,89,90}" \
  LDFLAGS='-Wl,-rpath,$ORIGIN/../../nvidia/nccl/lib' \
  MAKEFLAGS="${MAKEFLAGS:--j2}" \
    "$PY" -m pip wheel --no-build-isolation --no-deps --no-cache-dir -w "$WORK/dist" "$SRC"
  cp "$WORK"/dist/horovod-*.whl "$CACHE_DIR/"
  WHEEL=$(ls "$CACHE_DIR"/horovod-*.whl | head -n 1)
fi

"$PY" -m pip install -q --no-deps --force-reinstall "$WHEEL"
"$PY" -m pip install -q cloudpickle psutil pyyaml packaging
"$PY" -c "import horovod.tensorflow as h; h.init(); assert h.nccl_built(), 'no NCCL in this build'; \
print('horovod: loads, size', h.size(), 'cuda_built', h.cuda_built(), 'nccl_built', h.nccl_built(), \
'gloo_built', h.gloo_built())"
