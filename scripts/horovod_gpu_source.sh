# Sourced by scripts/install_horovod_gpu.sh and scripts/verify_gpu_setup.sh: the Horovod 0.28.1
# sdist unpacked and patched for a CUDA/NCCL build against TensorFlow 2.21, and its build.
#
# prepare_horovod_gpu_source PYTHON DIR   -> prints the source directory (DIR/horovod-0.28.1)
# build_horovod_gpu_wheel PYTHON SRC CUDA_DIR OUT_DIR   -> a wheel in OUT_DIR
# cuda_toolkit_of NVCC   -> prints the toolkit directory of that nvcc (which may be a wrapper)
#
# Patches (each needed by TF 2.21, none changes Horovod's behaviour):
# - horovod/tensorflow/xla_mpi_ops.cc is dropped, as in the CPU build: it includes XLA headers
#   that moved in TF >= 2.19 and only provides XLA-compiled ops, which tfscale never uses.
# - mpi_ops.cc gets the CUDA stream of a TF op from `stream->platform_specific_handle().stream`
#   instead of `stream_executor::gpu::AsGpuStreamValue(stream)`, which it forward-declares but
#   TF 2.21 no longer exports (the import would fail with an undefined symbol).
HOROVOD_VERSION=0.28.1

prepare_horovod_gpu_source() {
  local py=$1 dir=$2
  "$py" -m pip download --no-deps --no-binary :all: -q -d "$dir" "horovod==$HOROVOD_VERSION" >&2
  tar xzf "$dir/horovod-$HOROVOD_VERSION.tar.gz" -C "$dir"
  local src="$dir/horovod-$HOROVOD_VERSION"
  sed -i '/xla_mpi_ops.cc/d' "$src/horovod/tensorflow/CMakeLists.txt"
  local ops="$src/horovod/tensorflow/mpi_ops.cc"
  sed -i 's/stream_executor::gpu::AsGpuStreamValue(/HvdGpuStream(/g' "$ops"
  sed -i '/^#endif \/\/ TENSORFLOW_VERSION >= 2011000000$/a\
static inline GpuStreamHandle HvdGpuStream(stream_executor::Stream* stream) {\
  return static_cast<GpuStreamHandle>(stream->platform_specific_handle().stream);\
}' "$ops"
  # Fail here, not deep in the build, if the source no longer looks as these patches expect.
  grep -q 'HvdGpuStream(stream_executor::Stream\* stream)' "$ops"
  ! grep -q 'xla_mpi_ops.cc' "$src/horovod/tensorflow/CMakeLists.txt"
  echo "$src"
}

# NCCL is the nvidia-nccl-cu12 wheel of PYTHON's environment (the one TensorFlow uses): its
# headers, and libnccl.so.2 through a libnccl.so link (the wheel has no unversioned name); the
# built library finds it at run time through an RPATH into site-packages (CMake escapes $ORIGIN).
# CUDA_DIR is a CUDA toolkit (nvcc, headers, static runtime). GPU architectures:
# HOROVOD_BUILD_CUDA_CC_LIST, default TensorFlow 2.21's (sm_60, 70, 80, 89, PTX for 90).
build_horovod_gpu_wheel() {
  local py=$1 src=$2 cuda=$3 out=$4
  local site nccl links
  site=$("$py" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  nccl=$site/nvidia/nccl
  test -f "$nccl/include/nccl.h" && test -f "$nccl/lib/libnccl.so.2"
  links=$(dirname "$src")/nccl
  mkdir -p "$links/lib"
  ln -sfn "$nccl/include" "$links/include"
  ln -sf "$nccl/lib/libnccl.so.2" "$links/lib/libnccl.so"
  "$py" -m pip install -q "cmake<4" packaging
  HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
  HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_WITHOUT_NVTX=1 \
  HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_CUDA_HOME="$cuda" CUDAToolkit_ROOT="$cuda" \
  HOROVOD_NCCL_HOME="$links" HOROVOD_NCCL_INCLUDE="$links/include" HOROVOD_NCCL_LIB="$links/lib" \
  HOROVOD_NCCL_LINK=SHARED \
  HOROVOD_BUILD_CUDA_CC_LIST="${HOROVOD_BUILD_CUDA_CC_LIST:-60,70,80,89,90}" \
  LDFLAGS='-Wl,-rpath,$ORIGIN/../../nvidia/nccl/lib' \
  MAKEFLAGS="${MAKEFLAGS:--j2}" \
    "$py" -m pip wheel --no-build-isolation --no-deps --no-cache-dir -w "$out" "$src"
}

cuda_toolkit_of() {
  readlink -f "$("$1" --dryrun -x cu -c /dev/null -o /dev/null 2>&1 | sed -n 's/^#\$ TOP=//p')"
}
