#!/usr/bin/env bash
# Verifies the GPU set-up (`make setup GPU=1`, README "GPU hosts") as far as a machine without a
# GPU allows, and prints the evidence (kept in benchmarks/results/gpu_setup_verification.txt):
#  1. `make setup GPU=1`, timed: .venv-gpu with tensorflow[and-cuda], then Horovod with NCCL;
#  2. the CUDA-enabled TensorFlow imports, finds no GPU, computes on the CPU, and the libraries
#     of its CUDA wheels load;
#  3. what CUDA compilers exist: the nvidia-cuda-nvcc-cu12 wheel's bin/, nvcc on PATH;
#  4. Horovod's GPU C++ sources, patched as the build patches them, compile with g++ against the
#     TF 2.21, CUDA 12.9 and NCCL wheels' headers, and every TF symbol they use is exported by
#     TF 2.21 (the unpatched mpi_ops.cc uses one that is not);
#  5. the Horovod GPU build, hvd.init() and a 2-rank horovodrun --gloo training run: with
#     .venv-gpu's own build when step 1 made one; else, when a CUDA toolkit of another major
#     version is on PATH, with that toolkit as a labelled stand-in, installed into a temporary
#     directory only (never into .venv-gpu or the wheel cache);
#  6. what XLA does with tfscale's train step (Keras turns it on by itself on a GPU host when op
#     determinism is off): the step compiled with jit_compile=True, here on the CPU;
#  7. disk use, and a summary: the script exits 1 if any step above failed.
# Several GB of downloads the first time; not part of CI. Usage (from anywhere):
#   scripts/verify_gpu_setup.sh [--fresh]      --fresh: remove .venv-gpu first
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/horovod_gpu_source.sh
VENV=.venv-gpu
PY=$PWD/$VENV/bin/python
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
section() { printf '\n=== %s\n' "$*"; }
quiet() {  # quiet COMMAND...: runs it with TensorFlow's start-up chatter filtered out
  "$@" 2>&1 | grep -vE 'I0000 |W0000 |cuInit|WARNING: All log messages|oneDNN|cpu_feature_guard|To enable the following instructions'
}
FAILED=()
timed() {  # timed LABEL COMMAND...: runs it, prints its wall time and exit status; goes on
  local start=$SECONDS status=0
  "${@:2}" || status=$?
  echo "[$1: $((SECONDS - start)) s wall, exit status $status]"
  if [ "$status" != 0 ]; then FAILED+=("$1"); fi
}

section "machine"
date -u
echo "$(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB; shared with another engineer's tests"
command -v nvidia-smi || echo "nvidia-smi: not found (no GPU driver)"

section "1. make setup GPU=1"
if [ "${1:-}" = "--fresh" ]; then rm -rf "$VENV"; echo "removed $VENV"; fi
timed "make setup GPU=1" make setup GPU=1

section "2. TensorFlow from tensorflow[and-cuda] in $VENV"
"$PY" -m pip list 2>/dev/null | grep -iE '^(tensorflow|keras|nvidia-.*) '
quiet "$PY" - <<'EOF'
import ctypes, glob, os, sysconfig
import tensorflow as tf
info = tf.sysconfig.get_build_info()
print("tensorflow", tf.__version__, "built with CUDA", info["cuda_version"], "cuDNN",
      info["cudnn_version"], "for", info["cuda_compute_capabilities"])
print("GPUs:", tf.config.list_physical_devices("GPU"))
print("a matmul on", tf.linalg.matmul(tf.ones([2, 2]), tf.ones([2, 2])).device)
nvidia = os.path.join(sysconfig.get_paths()["purelib"], "nvidia")
for pattern in ("cuda_runtime/lib/libcudart.so.12", "cublas/lib/libcublas.so.12",
                "cudnn/lib/libcudnn.so.9", "nccl/lib/libnccl.so.2", "cusparse/lib/libcusparse.so.12"):
    path = glob.glob(os.path.join(nvidia, pattern))[0]
    ctypes.CDLL(path)
    print("loads:", os.path.relpath(path, nvidia))
EOF

section "3. CUDA compilers"
NVIDIA=$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/nvidia
echo "nvidia-cuda-nvcc-cu12 $("$PY" -m pip show nvidia-cuda-nvcc-cu12 2>/dev/null |
  sed -n 's/^Version: //p'), its bin/: $(ls "$NVIDIA/cuda_nvcc/bin" | tr '\n' ' ')"
if command -v nvcc >/dev/null; then
  echo "nvcc on PATH: $(command -v nvcc), toolkit $(cuda_toolkit_of nvcc)"
  nvcc --version | tail -n 2
else
  echo "nvcc on PATH: none"
fi

section "4. Horovod's GPU C++ sources against the TF 2.21 / CUDA 12.9 / NCCL headers (g++)"
SRC=$(prepare_horovod_gpu_source "$PY" "$WORK/src")
"$PY" -m pip install -q "cmake<4" packaging
# nv/target and cub/ come from CUDA's CCCL, which tensorflow[and-cuda] does not install (a
# toolkit has it): CUDA 12.9's.
"$PY" -m pip install -q --no-deps --target "$WORK/cccl" nvidia-cuda-cccl-cu12==12.9.27
# Horovod's own CMake configuration (CPU variant, which needs no nvcc) gives the compile flags.
mkdir -p "$WORK/cfg" "$WORK/obj"
(cd "$WORK/cfg" && HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
  HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_WITHOUT_GPU=1 \
  "$(dirname "$PY")/cmake" "$SRC" -DPYTHON_EXECUTABLE:FILEPATH="$PY" \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo > cmake.log 2>&1)
FLAGS_MAKE=$WORK/cfg/horovod/tensorflow/CMakeFiles/tensorflow.dir/flags.make
CXXFLAGS_ALL="$(sed -n 's/^CXX_DEFINES = //p; s/^CXX_INCLUDES = //p; s/^CXX_FLAGS = //p' \
  "$FLAGS_MAKE" | tr '\n' ' ')"
# What Horovod's CMake adds for HOROVOD_GPU_OPERATIONS=NCCL ('N' = 78 for every collective).
GPU_FLAGS="-DHAVE_CUDA=1 -DHAVE_GPU=1 -DHAVE_NCCL=1 -DHOROVOD_GPU_ALLREDUCE=78
  -DHOROVOD_GPU_ALLGATHER=78 -DHOROVOD_GPU_BROADCAST=78 -DHOROVOD_GPU_ALLTOALL=78
  -DHOROVOD_GPU_REDUCESCATTER=78 -isystem $NVIDIA/cuda_runtime/include
  -isystem $NVIDIA/cuda_nvcc/include -isystem $WORK/cccl/nvidia/cuda_cccl/include
  -isystem $NVIDIA/nccl/include"
compile() {  # compile SOURCE OBJECT
  if c++ $CXXFLAGS_ALL $GPU_FLAGS -w -c "$1" -o "$2" 2> "$2.log"; then
    echo "compiles: ${1#"$SRC"/}"
  else
    echo "FAILS: ${1#"$SRC"/}"; head -n 20 "$2.log"
  fi
}
export -f compile; export CXXFLAGS_ALL GPU_FLAGS SRC
start=$SECONDS
printf '%s\n' horovod/tensorflow/mpi_ops.cc horovod/common/ops/cuda_operations.cc \
  horovod/common/ops/gpu_operations.cc horovod/common/ops/nccl_operations.cc \
  horovod/common/operations.cc horovod/common/controller.cc |
  xargs -P 2 -I{} bash -c 'compile "$SRC/{}" "'"$WORK"'/obj/$(basename {} .cc).o"'
echo "[compiled in $((SECONDS - start)) s wall, 2 at a time]"
[ "$(ls "$WORK"/obj/*.o | wc -l)" = 6 ] || { echo "compile check FAILED"; exit 1; }
# TF-namespace symbols these objects need that no TF 2.21 library exports.
SITE=$(dirname "$NVIDIA")
nm -D --defined-only "$SITE"/tensorflow/libtensorflow_framework.so.2 \
  "$SITE"/tensorflow/libtensorflow_cc.so.2 | awk '{print $NF}' | sed 's/@.*//' | sort -u \
  > "$WORK/tf_exports"
missing_tf_symbols() {  # missing_tf_symbols OBJECT...
  nm -u "$@" | awk '{print $NF}' | sed 's/@.*//' | sort -u |
    grep -E '^_ZN?K?[0-9]+(tensorflow|stream_executor|tsl|xla)' |
    comm -23 - "$WORK/tf_exports" | c++filt || true
}
echo "TF symbols the patched objects need and TF 2.21 does not export: $(missing_tf_symbols \
  "$WORK"/obj/*.o | wc -l)"
tar xzf "$WORK/src/horovod-$HOROVOD_VERSION.tar.gz" -C "$WORK" --strip-components=3 \
  "horovod-$HOROVOD_VERSION/horovod/tensorflow/mpi_ops.cc"
cp "$WORK/mpi_ops.cc" "$SRC/horovod/tensorflow/mpi_ops_unpatched.cc"
c++ $CXXFLAGS_ALL $GPU_FLAGS -w -c "$SRC/horovod/tensorflow/mpi_ops_unpatched.cc" \
  -o "$WORK/unpatched.o"
rm "$SRC/horovod/tensorflow/mpi_ops_unpatched.cc"
echo "... and those the unpatched mpi_ops.cc needs: $(missing_tf_symbols "$WORK/unpatched.o")"

section "5. Horovod GPU build, hvd.init() and a 2-rank horovodrun --gloo run"
RUN_PY=$PY
HOROVODRUN=$VENV/bin/horovodrun
if "$PY" -c "import horovod.tensorflow as h; assert h.nccl_built()" 2>/dev/null; then
  echo "using $VENV's own Horovod (the CUDA 12 build of step 1)"
elif command -v nvcc >/dev/null; then
  STANDIN=$(cuda_toolkit_of nvcc)
  echo "STAND-IN: step 1 could not build Horovod (no CUDA 12 nvcc); building the same way with" \
       "the CUDA toolkit at $STANDIN ($(nvcc --version | sed -n 's/.*release \([0-9.]*\),.*/\1/p'))," \
       "for architectures 75,80,89,90 (its oldest is 75), installed into a temporary directory" \
       "only. It checks the build recipe, not a wheel to run on a GPU."
  start=$SECONDS
  HOROVOD_BUILD_CUDA_CC_LIST=75,80,89,90 \
    build_horovod_gpu_wheel "$PY" "$SRC" "$STANDIN" "$WORK/dist" > "$WORK/build.log" 2>&1 ||
    { grep -E -A8 "CMake Error|error:" "$WORK/build.log" | head -n 60
      echo "stand-in build FAILED"; exit 1; }
  echo "[stand-in wheel built in $((SECONDS - start)) s wall, MAKEFLAGS=${MAKEFLAGS:--j2}]"
  ls -l "$WORK"/dist/*.whl
  "$PY" -m pip install -q --no-deps --target "$WORK/site" "$WORK"/dist/horovod-*.whl \
    cloudpickle psutil pyyaml
  # The library's RPATH expects nvidia/ beside horovod/, as in site-packages.
  ln -s "$NVIDIA" "$WORK/site/nvidia"
  export PYTHONPATH=$WORK/site
  HOROVODRUN=$WORK/site/bin/horovodrun
else
  echo "NOT RUN: no Horovod GPU build (no CUDA 12 nvcc) and no other CUDA toolkit to stand in"
  FAILED+=("Horovod GPU build")
  HOROVODRUN=
fi
if [ -n "$HOROVODRUN" ]; then
  MPI_LIB=$("$RUN_PY" -c "import glob, os, horovod; print(glob.glob(os.path.join(
    os.path.dirname(horovod.__file__), 'tensorflow', 'mpi_lib*.so'))[0])")
  echo "$MPI_LIB:"
  readelf -d "$MPI_LIB" | grep -E 'NEEDED|RUNPATH' | grep -E 'nccl|cuda|RUNPATH|tensorflow'
  ldd "$MPI_LIB" | grep -E 'nccl|cudart' || echo "(libcudart linked statically)"
  quiet "$RUN_PY" -c "import horovod.tensorflow as hvd; hvd.init(); print('hvd.init(): size', \
hvd.size(), 'rank', hvd.rank(), '| cuda_built', hvd.cuda_built(), 'nccl_built', \
hvd.nccl_built(), 'gloo_built', hvd.gloo_built(), 'mpi_built', hvd.mpi_built())"
  SMOKE=(--train_rows=4096 --test_rows=1024 --batch_size=1024 --logdir=none --checkpoint_dir=none)
  timed "2-rank smoke test" quiet "$RUN_PY" "$HOROVODRUN" -np 2 -H localhost:2 --gloo \
    "$RUN_PY" -m launch.train "${SMOKE[@]}"
  # README's launch line: one GPU per rank, chosen by CUDA_VISIBLE_DEVICES from the local rank.
  WRAPPER='CUDA_VISIBLE_DEVICES=$HOROVOD_LOCAL_RANK exec '"$RUN_PY"' -m launch.train "$@"'
  timed "2-rank smoke test, README's launch line" quiet "$RUN_PY" "$HOROVODRUN" -np 2 \
    -H localhost:2 --gloo bash -c "$WRAPPER" _ "${SMOKE[@]}"
  quiet "$RUN_PY" "$HOROVODRUN" -np 2 -H localhost:2 --gloo bash -c \
    'CUDA_VISIBLE_DEVICES=$HOROVOD_LOCAL_RANK exec '"$RUN_PY"' -c "import os; print(\"rank\",
    os.environ[\"HOROVOD_RANK\"], \"sees CUDA_VISIBLE_DEVICES =\", os.environ[\"CUDA_VISIBLE_DEVICES\"])"'
fi

section "6. XLA and tfscale's train step (DeepFM, jit_compile=True, on the CPU)"
for lookups in dedup plain; do
  # TensorFlow logs the failing graph's traceback; the printed line below is the evidence.
  PYTHONPATH=. "$PY" - "$lookups" 2> "$WORK/xla_$lookups.log" <<'EOF' ||
import sys
import keras
import models
from tfscale.data.synthetic import SyntheticCTR
from tfscale.optimizers.fused_adam import FusedAdam

keras.utils.set_random_seed(0)
dedup = sys.argv[1] == "dedup"
source = SyntheticCTR(seed=0, train_rows=2048, test_rows=512)
model = models.build_model("deepfm", source.schema, embedding_dim=4, hidden_units=[16],
                           deduplicate_ids=dedup)
model.compile(optimizer=FusedAdam(1e-3), loss=keras.losses.BinaryCrossentropy(), jit_compile=True)
label = "de-duplicated lookups" if dedup else "plain lookups"
try:
    loss = model.fit(source.train_batches(512), steps_per_epoch=2, verbose=0).history["loss"][-1]
    print(f"{label}: the XLA-compiled step trains (loss {loss:.4f})")
except Exception as error:
    lines = [l.strip() for l in str(error).splitlines() if "unsupported operations" in l]
    print(f"{label}: the XLA-compiled step fails: {type(error).__name__}: {lines[:1]}")
EOF
    { tail -n 20 "$WORK/xla_$lookups.log"; exit 1; }
done

section "7. disk use, summary"
du -sh "$VENV" "${TFSCALE_CACHE:-$HOME/.cache/tfscale}"/* "$HOME/.cache/pip" 2>/dev/null || true
if [ "${#FAILED[@]}" != 0 ]; then
  printf 'FAILED: %s\n' "${FAILED[@]}"
  exit 1
fi
echo "every step passed"
