#!/usr/bin/env bash
# Runs a benchmark module (default benchmarks.embedding_exchange; another with BENCHMARK=module)
# on P Horovod ranks (Gloo) inside a private network namespace whose loopback is shaped to 1 Gbit
# (tbf), then deletes the namespace, whatever happens. Needs root.
# All ranks share the one shaped link.
#   [BENCHMARK=benchmarks.gtopk_collective] benchmarks/run_under_1gbit.sh P [benchmark flags...]
set -euo pipefail
if [[ $# -lt 1 ]]; then
  echo "usage: [BENCHMARK=module] $0 P [benchmark flags...]" >&2
  exit 2
fi
ranks=$1
shift
repo=$(cd "$(dirname "$0")/.." && pwd)
namespace="tfs-net-$$"
ip netns add "$namespace"
trap 'ip netns del "$namespace"' EXIT
trap 'exit 130' INT TERM
ip netns exec "$namespace" ip link set lo up
ip netns exec "$namespace" tc qdisc add dev lo root tbf rate 1gbit burst 128kb latency 50ms
cd "$repo"
ip netns exec "$namespace" env PYTHONPATH="$repo" TF_CPP_MIN_LOG_LEVEL=2 \
  .venv/bin/horovodrun -np "$ranks" -H "localhost:$ranks" --gloo \
  .venv/bin/python -m "${BENCHMARK:-benchmarks.embedding_exchange}" "$@"
