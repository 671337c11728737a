"""The "dense" exchange (Horovod's sparse_as_dense): a table's row gradient is summed into a
whole-table tensor and allreduced with the dense weights, so its bytes grow with the table's
rows instead of the batch's ids, and the per-id counts are gone."""

from tfscale.distributed import traffic
from tfscale.exchanges.averaging import AveragingExchange
from tfscale.row_gradients import densify


class DenseExchange(AveragingExchange):
    name = "dense"

    def _prepare(self, gradient):
        return densify(gradient)

    def _one_way_bytes(self, gradient, num_ranks, compression):
        return traffic.allreduce_bytes(gradient, num_ranks, compression)
