"""Horovod data parallelism for tfscale: one process per rank, started by `horovodrun`.

- `runtime`: whether this process is a rank of a Horovod job, start-up, rank and size;
- `batch_split`: how the global batch and the data splits divide over the ranks;
- `gradients`: the grouped average of a step's gradients (dense allreduce, rows allgathered);
- `topk`: the sparse allreduces of (index, value) candidates: gTop-k butterfly, allgather top-k;
- `traffic`: the bytes a rank sends and receives to allreduce or allgather a gradient;
- `per_rank`: state that differs between ranks, gathered to rank 0 for checkpoints and back;
- `broadcast`: rank 0's model and optimizer variables (and small Python values) to every rank;
- `gather`: numpy arrays from every rank joined, for exact evaluation over all shards;
- `reduce`: sums and maxima of small tensors over the ranks, in the graph.
How a train step uses these collectives is an exchange's business (tfscale.exchanges).

A single-process run never imports Horovod: every entry point checks `runtime.is_active()`
first."""

from tfscale.distributed.broadcast import (any_rank, barrier, broadcast_from_chief,
                                           broadcast_model_and_optimizer)
from tfscale.distributed.gather import allgather_array
from tfscale.distributed.reduce import allreduce_max, allreduce_sum
from tfscale.distributed.runtime import (COMPRESSIONS, gradient_compression_name, init,
                                         is_active, is_chief, launched_by_horovodrun, rank,
                                         require_started, size)
from tfscale.distributed.batch_split import data_shard, local_batch_size
from tfscale.distributed.topk import SparseSum, gtopk_allreduce, topk_allgather

__all__ = ["COMPRESSIONS", "SparseSum", "allgather_array", "allreduce_max", "allreduce_sum",
           "any_rank", "barrier",
           "broadcast_from_chief",
           "broadcast_model_and_optimizer", "data_shard", "gradient_compression_name",
           "gtopk_allreduce", "init", "is_active", "is_chief", "launched_by_horovodrun",
           "local_batch_size", "rank", "require_started", "size", "topk_allgather"]
