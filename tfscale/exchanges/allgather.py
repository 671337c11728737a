"""The "allgather" exchange (the default): a table's row gradient travels as its rows (values and
int64 ids, plus counts for de-duplicated lookups), allgathered, so its bytes grow with the
batch's ids and the optimizer gets the global batch's per-id counts (CowClip needs them)."""

import tensorflow as tf

from tfscale.distributed import traffic
from tfscale.exchanges.averaging import AveragingExchange


class AllgatherExchange(AveragingExchange):
    """Table gradients as rows (one per unique id of each rank's batch, with the ids' counts),
    allgathered; the other gradients allreduced. The default exchange: its bytes follow the
    batch, and it carries the per-id counts CowClip clips by. It can run stale.

    Example:
        ```python
        model.compile(optimizer=tfscale.optimizers.CowClip(), loss="binary_crossentropy",
                      embedding_exchange="allgather")  # or AllgatherExchange()
        ```
    """

    name = "allgather"
    carries_counts = True

    def _prepare(self, gradient):
        return gradient

    def _one_way_bytes(self, gradient, num_ranks, compression):
        if isinstance(gradient, tf.IndexedSlices):
            return traffic.allgather_bytes(gradient, num_ranks)
        return traffic.allreduce_bytes(gradient, num_ranks, compression)
