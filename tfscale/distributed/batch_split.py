"""How the global batch and the data splits divide over the ranks: each rank trains on
batch_size / P examples of its own shard of the training split (so one step still consumes the
global batch) and evaluates its own shard of the test split."""

from tfscale.distributed import runtime
from tfscale.errors import UserError


def local_batch_size(global_batch_size):
    """This rank's share of `global_batch_size`; a UserError if it does not divide evenly.

    Args:
        global_batch_size: the batch of one step over all ranks.

    Returns:
        `global_batch_size // size()`, an int.

    Raises:
        UserError: `global_batch_size` is not a multiple of the number of ranks.

    Example:
        ```python
        tfscale.distributed.local_batch_size(65536)  # 16384 on each of 4 ranks
        ```
    """
    ranks = runtime.size()
    if global_batch_size % ranks:
        raise UserError(f"`batch_size={global_batch_size}` is the global batch and must divide "
                        f"evenly over the {ranks} ranks: use a multiple of {ranks}")
    return global_batch_size // ranks


def data_shard():
    """{"shard_index", "num_shards"} of this rank, for CTRSource.train_batches/test_batches.

    Returns:
        `{"shard_index": rank(), "num_shards": size()}`, to pass as keyword arguments.

    Example:
        ```python
        batches = source.train_batches(1024, **tfscale.distributed.data_shard())
        ```
    """
    return {"shard_index": runtime.rank(), "num_shards": runtime.size()}
