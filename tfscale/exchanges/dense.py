"""The "dense" exchange (Horovod's sparse_as_dense): a table's row gradient is summed into a
whole-table tensor and allreduced with the dense weights, so its bytes grow with the table's
rows instead of the batch's ids, and the per-id counts are gone."""

from tfscale.distributed import traffic
from tfscale.exchanges.averaging import AveragingExchange
from tfscale.row_gradients import densify


class DenseExchange(AveragingExchange):
    """Table gradients summed into whole-table tensors and allreduced with the other gradients
    (Horovod's sparse_as_dense): the bytes follow the table's rows, and no per-id counts reach
    the optimizer (not with CowClip). It can run stale.

    Example:
        ```python
        model.compile(optimizer=tfscale.optimizers.RowSparseAdam(1e-3),
                      loss="binary_crossentropy", embedding_exchange="dense")
        ```
    """

    name = "dense"

    def _prepare(self, gradient):
        return densify(gradient)

    def _one_way_bytes(self, gradient, num_ranks, compression):
        return traffic.allreduce_bytes(gradient, num_ranks, compression)
