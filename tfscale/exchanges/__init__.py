"""Embedding exchanges: how a train step's gradients are averaged over the Horovod ranks, one
class per method behind `EmbeddingExchange` (base.py; `SynchronousExchange` for those that act
once the gradients are known), and the registry of their names that
`compile(embedding_exchange=...)` and the launcher's `--embedding_comm` read.

- allgather (default): table gradients as rows, allgathered (per-id counts kept: CowClip);
- dense: table gradients as whole-table tensors in the allreduce;
- topk / gtopk: each table's top rows with error feedback, allgathered / by gTop-k's butterfly;
- StaleExchange (stale.py) wraps allgather or dense for bounded-staleness embedding updates;
- RowShardedExchange (sharded.py) wraps allgather or dense when the model's tables are
  row-sharded: the shards' gradients stay on their owners.
"""

from tfscale.exchanges.allgather import AllgatherExchange
from tfscale.exchanges.base import EmbeddingExchange, StepExchange, SynchronousExchange
from tfscale.exchanges.dense import DenseExchange
from tfscale.exchanges.sharded import RowShardedExchange
from tfscale.exchanges.stale import StaleExchange
from tfscale.exchanges.topk import GTopKExchange, TopKAllgatherExchange, TopKExchange

EXCHANGES = {exchange.name: exchange for exchange in (
    AllgatherExchange,
    DenseExchange,
    TopKAllgatherExchange,
    GTopKExchange,
)}
DEFAULT = "allgather"


def get(exchange):
    """An EmbeddingExchange from a registered name (with its default settings) or an instance.

    Args:
        exchange: a name in EXCHANGES ("allgather", "dense", "topk", "gtopk") or an
            EmbeddingExchange (returned as it is).

    Returns:
        An EmbeddingExchange.

    Raises:
        ValueError: `exchange` is neither a name in EXCHANGES nor an EmbeddingExchange.

    Example:
        ```python
        tfscale.exchanges.get("dense")  # a DenseExchange with its default settings
        ```
    """
    if isinstance(exchange, EmbeddingExchange):
        return exchange
    if exchange not in EXCHANGES:
        raise ValueError(f"`embedding_exchange={exchange!r}`: give one of "
                         f"{', '.join(EXCHANGES)}, or an EmbeddingExchange")
    return EXCHANGES[exchange]()


__all__ = ["AllgatherExchange", "DEFAULT", "DenseExchange", "EXCHANGES", "EmbeddingExchange",
           "GTopKExchange", "RowShardedExchange", "StaleExchange", "StepExchange",
           "SynchronousExchange", "TopKAllgatherExchange", "TopKExchange", "get"]
