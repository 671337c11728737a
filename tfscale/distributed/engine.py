"""The engine contract: every collective tfscale's multi-process code calls, whichever runtime
moves the bytes (tfscale.distributed.horovod_engine, tfscale.distributed.tf_engine). Nothing
above tfscale.distributed names a runtime: it asks `runtime.engine()` for the started Engine
and calls these methods.

Every rank calls the same collectives in the same order with the same `name` (it identifies
the collective on both engines). Tensors may be eager or symbolic (inside a tf.function).
Per-rank first dimensions are allowed where a method says so; an engine whose runtime takes
equal shapes only agrees the sizes and pads."""

import abc
from typing import ClassVar

# The reductions `allreduce` and `grouped_allreduce` take.
REDUCE_OPS = ("sum", "average", "min", "max")


class Engine(abc.ABC):
    """One started collective runtime of `size` processes, seen from process `rank`.

    Attributes:
        name: "horovod" or "tf", as `TFSCALE_ENGINE` names it.
        rank: this process's index, 0 .. size - 1.
        size: the number of processes.
        local_rank: this process's index among those on its host (its GPU, if any).
        local_size: the number of processes on this host.

    Example:
        ```python
        engine = tfscale.distributed.engine()  # None in one process
        if engine is not None:
            total = engine.allreduce(tf.constant(1.0), "sum", name="count_ranks")  # size
        ```
    """

    name: ClassVar[str]
    rank: int
    size: int
    local_rank: int
    local_size: int

    @abc.abstractmethod
    def allreduce(self, tensor, op, name):
        """`tensor` (same shape on every rank) reduced element-wise by `op` (REDUCE_OPS)."""

    @abc.abstractmethod
    def grouped_allreduce(self, tensors, op, name):
        """Each of `tensors` reduced by `op` ("sum" or "average"), in one fused exchange where
        the runtime can. A tf.IndexedSlices is allgathered (values and indices of every rank,
        duplicates kept, values divided by `size` for "average") and stays IndexedSlices (a
        CountedSlices may come back with every rank's counts gathered beside its rows)."""

    @abc.abstractmethod
    def allgather(self, tensor, name):
        """Every rank's `tensor` joined along axis 0 in rank order; first dimensions may differ
        between ranks, the others and the dtype may not."""

    @abc.abstractmethod
    def alltoall(self, tensor, splits, name):
        """Rows of `tensor` sent in order to each rank: `splits[r]` rows (int32 [size], summing
        to tensor's first dimension) to rank r. Returns (received rows, in source-rank order;
        int32 [size] rows received from each rank)."""

    @abc.abstractmethod
    def broadcast_variables(self, variables, root_rank=0):
        """Assigns `root_rank`'s values of `variables` (tf.Variables, the same list on every
        rank) to every rank's. Eager."""

    @abc.abstractmethod
    def broadcast_object(self, value, name, root_rank=0):
        """`root_rank`'s `value` (picklable; ignored elsewhere) on every rank. Eager."""

    @abc.abstractmethod
    def allgather_object(self, value, name):
        """[rank 0's value, ..., rank size-1's] of a picklable `value`. Eager."""

    def rank_of_task(self, job, index):
        """The rank of the runtime's task `index` of `job` (TensorFlow's engine names peers
        so), or None where the runtime has no tasks."""
        return None

    def barrier(self, name):
        """Returns once every rank has called it with `name`. Eager."""
        import tensorflow as tf

        self.allreduce(tf.constant(0.0), "sum", name)
