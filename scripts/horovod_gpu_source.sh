# Sourced by scripts/install_horovod_gpu.sh and scripts/verify_gpu_setup.sh: the Horovod 0.28.1
# sdist unpacked and patched for a CUDA/NCCL build against TensorFlow 2.21.
#
# prepare_horovod_gpu_source PYTHON DIR   -> prints the source directory (DIR/horovod-0.28.1)
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
