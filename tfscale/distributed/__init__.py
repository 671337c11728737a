"""Data parallelism for tfscale: one process per rank, on one of two engines behind one seam:
Horovod (started by `horovodrun`) or TensorFlow's own collective runtime (TF_CONFIG; started by
`python -m tfscale.run`, Kubernetes' TFJob, Vertex AI, SageMaker). No module outside this
package names an engine.

- `engine`: the contract every collective goes through; `horovod_engine`, `tf_engine` (with
  `tf_cluster`, TF_CONFIG read and checked) are its two implementations;
- `runtime`: which engine the launcher asks for, start-up, rank, size and local rank;
- `owner_routing`: keys of tables spread over the ranks sent to their owners, rows back;
- `batch_split`: how the global batch and the data splits divide over the ranks;
- `gradients`: the grouped average of a step's gradients (dense allreduce, rows allgathered);
- `topk`: the sparse allreduces of (index, value) candidates: gTop-k butterfly, allgather top-k;
- `traffic`: the bytes a rank sends and receives to allreduce or allgather a gradient;
- `per_rank`: state that differs between ranks, gathered to rank 0 for checkpoints and back;
- `broadcast`: rank 0's model and optimizer variables (and small Python values) to every rank;
- `gather`: numpy arrays from every rank joined, for exact evaluation over all shards;
- `reduce`: sums, minima and maxima of small tensors over the ranks, in the graph;
- `failures`: a collective that failed because a rank was lost, said as such.
How a train step uses these collectives is an exchange's business (tfscale.exchanges).

A single-process run starts no engine: every entry point checks `runtime.engine()` first."""

from tfscale.distributed.broadcast import (any_rank, barrier, broadcast_from_chief,
                                           broadcast_model_and_optimizer)
from tfscale.distributed.engine import Engine
from tfscale.distributed.failures import RankLost, as_rank_lost
from tfscale.distributed.gather import allgather_array
from tfscale.distributed.owner_routing import rows_from_owners
from tfscale.distributed.reduce import (allreduce_max, allreduce_min, allreduce_sum,
                                        true_on_every_rank)
from tfscale.distributed.runtime import (COLLECTIVE_TIMEOUT_SECONDS, COMPRESSIONS, ENGINES,
                                         announced_size, collective_timeout_seconds, engine,
                                         engine_name, gradient_compression_name, init,
                                         is_active, is_chief, launched_by_horovodrun,
                                         launched_engine, local_rank, local_size, rank,
                                         require_started, size)
from tfscale.distributed.batch_split import data_shard, local_batch_size
from tfscale.distributed.topk import SparseSum, gtopk_allreduce, topk_allgather

__all__ = ["COLLECTIVE_TIMEOUT_SECONDS", "COMPRESSIONS", "ENGINES", "Engine", "RankLost",
           "SparseSum", "as_rank_lost",
           "allgather_array", "allreduce_max", "allreduce_min", "allreduce_sum",
           "announced_size", "any_rank", "barrier", "broadcast_from_chief",
           "broadcast_model_and_optimizer", "collective_timeout_seconds", "data_shard", "engine",
           "engine_name", "gradient_compression_name", "gtopk_allreduce", "init", "is_active",
           "is_chief", "launched_by_horovodrun", "launched_engine", "local_batch_size",
           "local_rank", "local_size", "rank", "require_started", "rows_from_owners", "size",
           "topk_allgather", "true_on_every_rank"]
