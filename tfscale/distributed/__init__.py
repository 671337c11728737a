"""Horovod data parallelism for tfscale: one process per rank, started by `horovodrun`.

- `runtime`: whether this process is a rank of a Horovod job, start-up, rank and size;
- `sharding`: how the global batch and the data splits divide over the ranks;
- `gradients`: the gradient exchange inside the train step (dense allreduce, sparse allgather);
- `topk`: the sparse allreduces of (index, value) candidates: gTop-k butterfly, allgather top-k;
- `sparse_exchange`: the top-k exchanges of embedding gradients with error feedback;
- `traffic`: the bytes a rank sends and receives per step in that exchange;
- `per_rank`: state that differs between ranks, gathered to rank 0 for checkpoints and back;
- `broadcast`: rank 0's model and optimizer variables (and small Python values) to every rank;
- `gather`: numpy arrays from every rank joined, for exact evaluation over all shards.

A single-process run never imports Horovod: every entry point checks `runtime.is_active()`
first."""

from tfscale.distributed.broadcast import broadcast_from_chief, broadcast_model_and_optimizer
from tfscale.distributed.gather import allgather_array
from tfscale.distributed.gradients import exchange_gradients
from tfscale.distributed.runtime import (COMPRESSIONS, EMBEDDING_EXCHANGES,
                                         check_embedding_exchange, embedding_exchange,
                                         gradient_compression_name, init,
                                         is_active, is_chief, launched_by_horovodrun, rank, size)
from tfscale.distributed.sharding import data_shard, local_batch_size
from tfscale.distributed.sparse_exchange import (TOPK_EXCHANGES, TopKExchange,
                                                 resolve_embedding_exchange)
from tfscale.distributed.topk import SparseSum, gtopk_allreduce, topk_allgather
from tfscale.distributed.traffic import TrafficCounter, exchange_bytes

__all__ = ["COMPRESSIONS", "EMBEDDING_EXCHANGES", "SparseSum", "TOPK_EXCHANGES", "TopKExchange",
           "TrafficCounter", "allgather_array", "broadcast_from_chief",
           "broadcast_model_and_optimizer", "check_embedding_exchange", "data_shard",
           "embedding_exchange", "exchange_bytes", "exchange_gradients",
           "gradient_compression_name", "gtopk_allreduce",
           "init", "is_active", "is_chief", "launched_by_horovodrun", "local_batch_size", "rank",
           "resolve_embedding_exchange", "size", "topk_allgather"]
