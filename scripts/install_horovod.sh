#!/usr/bin/env bash
# Builds Horovod 0.28.1 with Gloo against the TensorFlow installed in the given Python
# environment and installs it there (../shared/docs/stack.md explains each step).
#
# Horovod 0.28.1's sdist does not compile against TF >= 2.19: horovod/tensorflow/xla_mpi_ops.cc
# includes XLA headers that moved. That file only provides XLA-compiled GPU ops, so it is dropped
# from the build. The built wheel is cached outside the clone, keyed by the TF version, because a
# wheel built against one TF fails to load under another.
#
# Usage: scripts/install_horovod.sh PYTHON
set -euo pipefail
PY=${1:?usage: install_horovod.sh PYTHON}
HOROVOD_VERSION=0.28.1

if "$PY" -c "import horovod.tensorflow as h; h.init()" >/dev/null 2>&1; then
  echo "horovod: already installed and loads"
  exit 0
fi

TF_VERSION=$("$PY" -c "import tensorflow as tf; print(tf.__version__)" 2>/dev/null | tail -n 1)
PY_TAG=$("$PY" -c "import sys; print(f'cp{sys.version_info[0]}{sys.version_info[1]}')")
CACHE_DIR=${TFSCALE_CACHE:-$HOME/.cache/tfscale}/horovod-$HOROVOD_VERSION-tf$TF_VERSION-$PY_TAG
mkdir -p "$CACHE_DIR"

WHEEL=$(ls "$CACHE_DIR"/horovod-*.whl 2>/dev/null | head -n 1 || true)
if [ -z "$WHEEL" ]; then
  echo "horovod: building $HOROVOD_VERSION against TensorFlow $TF_VERSION (about 5 minutes on 2 cores)"
  WORK=$(mktemp -d)
  trap 'rm -rf "$WORK"' EXIT
  "$PY" -m pip download --no-deps --no-binary :all: -q -d "$WORK" "horovod==$HOROVOD_VERSION"
  tar xzf "$WORK/horovod-$HOROVOD_VERSION.tar.gz" -C "$WORK"
  SRC="$WORK/horovod-$HOROVOD_VERSION"
  sed -i '/xla_mpi_ops.cc/d' "$SRC/horovod/tensorflow/CMakeLists.txt"
  # The build needs cmake and the installed TF (hence no build isolation).
  "$PY" -m pip install -q "cmake<4" packaging
  HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
  HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_WITHOUT_GPU=1 \
  MAKEFLAGS="-j$(nproc)" \
    "$PY" -m pip wheel --no-build-isolation --no-deps --no-cache-dir -w "$WORK/dist" "$SRC"
  cp "$WORK"/dist/horovod-*.whl "$CACHE_DIR/"
  WHEEL=$(ls "$CACHE_DIR"/horovod-*.whl | head -n 1)
fi

"$PY" -m pip install -q --no-deps "$WHEEL"
# Horovod's own runtime dependencies (horovodrun needs them).
"$PY" -m pip install -q cloudpickle psutil pyyaml packaging
"$PY" -c "import horovod.tensorflow as h; h.init(); print('horovod: loads, size', h.size())"
