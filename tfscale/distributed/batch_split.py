"""How the global batch and the data splits divide over the ranks: each rank trains on
batch_size / P examples of its own shard of the training split (so one step still consumes the
global batch) and evaluates its own shard of the test split."""

from tfscale.distributed import runtime
from tfscale.errors import UserError


def local_batch_size(global_batch_size):
    """This rank's share of `global_batch_size`; a UserError if it does not divide evenly.

    Example:
        ```python
        tfscale.distributed.local_batch_size(65536)  # 16384 on each of 4 ranks
        ```
    """
    ranks = runtime.size()
    if global_batch_size % ranks:
        raise UserError(f"`batch_size={global_batch_size}` is the global batch and must divide "
                        f"evenly over the {ranks} Horovod ranks: use a multiple of {ranks}")
    return global_batch_size // ranks


def data_shard():
    """{"shard_index", "num_shards"} of this rank, for CTRSource.train_batches/test_batches.

    Example:
        ```python
        batches = source.train_batches(1024, **tfscale.distributed.data_shard())
        ```
    """
    return {"shard_index": runtime.rank(), "num_shards": runtime.size()}
