#!/usr/bin/env bash
# Checks both engines on a GPU host (docs/engines.md, "GPUs"); it needs at least one GPU and
# .venv-gpu (`make setup GPU=1`). Not run where tfscale is tested (no GPU there). For P = the
# number of GPUs (at least 2 processes; with one GPU both share it):
#  1. each process sees exactly one GPU, its local rank's, under horovodrun and tfscale.run;
#  2. a dense allreduce of a GPU tensor: the right sum on every rank under both engines, and on
#     TensorFlow's engine the collective placed on the GPU with NCCL (communication hint);
#  3. launch.train, 20 steps of DeepFM at batch 8,192 on the built-in data, under both engines:
#     the run's description names the engine and the step time is printed.
# Exits 1 at the first failed check. Usage: scripts/check_gpu_engines.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=$PWD/.venv-gpu/bin/python
[ -x "$PY" ] || { echo "no .venv-gpu: run 'make setup GPU=1' first" >&2; exit 1; }
GPUS=$("$PY" -c "import tensorflow as tf; print(len(tf.config.list_physical_devices('GPU')))" 2>/dev/null | tail -n 1)
[ "$GPUS" -ge 1 ] || { echo "no GPU visible to TensorFlow" >&2; exit 1; }
P=$(( GPUS < 2 ? 2 : GPUS ))
CHECK=$(mktemp --suffix=.py)
trap 'rm -f "$CHECK"' EXIT
cat > "$CHECK" <<'PYTHON'
import tensorflow as tf
import tfscale

tfscale.distributed.init()
engine = tfscale.distributed.engine()
gpus = tf.config.list_logical_devices("GPU")
assert len(gpus) == 1, f"rank {engine.rank} sees {len(gpus)} GPUs"
with tf.device("GPU:0"):
    value = tf.fill([1 << 20], float(engine.rank + 1))
summed = engine.grouped_allreduce([value], "sum", "gpu_check")[0]
expected = engine.size * (engine.size + 1) / 2
assert float(summed[0]) == expected, (float(summed[0]), expected)
print(f"rank {engine.rank} of {engine.size} ({engine.name}): local rank {engine.local_rank}, "
      f"one GPU, allreduce on {summed.device} ok")
PYTHON
echo "== one GPU per process and a GPU allreduce, Horovod"
.venv-gpu/bin/horovodrun -np "$P" -H "localhost:$P" --gloo "$PY" "$CHECK"
echo "== one GPU per process and a GPU allreduce (NCCL), TensorFlow's engine"
"$PY" -m tfscale.run -np "$P" "$CHECK"
TRAIN=(-m launch.train --batch_size=8192 --train_rows=$((8192 * 20)) --test_rows=8192
       --epochs=1 --logdir=none --checkpoint_dir=none --log_every_steps=5)
echo "== launch.train, Horovod"
.venv-gpu/bin/horovodrun -np "$P" -H "localhost:$P" --gloo "$PY" "${TRAIN[@]}" | grep -E "engine|ms/step"
echo "== launch.train, TensorFlow's engine"
"$PY" -m tfscale.run -np "$P" "${TRAIN[@]}" | grep -E "engine|ms/step"
echo "all GPU engine checks passed"
