"""Sums, minima and maxima of small tensors over the ranks, in the graph (the tensor itself in
one process): the global counts that dynamic tables decide by (tfscale.embedding.id_rows), the
row statistics of tables spread over the ranks, and agreements such as "finite on every
rank"."""

import tensorflow as tf

from tfscale.distributed import runtime


def allreduce_sum(tensor, name):
    """`tensor` summed over the ranks (every rank calls it with the same `name`).

    Args:
        tensor: a tensor (or a value convertible to one) of the same shape on every rank.
        name: identifies the collective; the same on every rank.

    Returns:
        A tensor of `tensor`'s shape: the element-wise sum (`tensor` itself in one process).

    Example:
        ```python
        total = tfscale.distributed.allreduce_sum(tf.constant(my_examples), name="examples")
        ```
    """
    return _allreduce(tensor, name, "sum")


def allreduce_max(tensor, name):
    """The element-wise maximum of `tensor` over the ranks.

    Args:
        tensor: a tensor (or a value convertible to one) of the same shape on every rank.
        name: identifies the collective; the same on every rank.

    Returns:
        A tensor of `tensor`'s shape: the element-wise maximum (`tensor` itself in one process).

    Example:
        ```python
        longest = tfscale.distributed.allreduce_max(tf.constant(my_steps), name="steps")
        ```
    """
    return _allreduce(tensor, name, "max")


def allreduce_min(tensor, name):
    """The element-wise minimum of `tensor` over the ranks.

    Args:
        tensor: a tensor (or a value convertible to one) of the same shape on every rank.
        name: identifies the collective; the same on every rank.

    Returns:
        A tensor of `tensor`'s shape: the element-wise minimum (`tensor` itself in one process).

    Example:
        ```python
        shortest = tfscale.distributed.allreduce_min(tf.constant(my_steps), name="steps")
        ```
    """
    return _allreduce(tensor, name, "min")


def true_on_every_rank(flag, name):
    """Whether the boolean tensor `flag` is true on every rank, the same on every rank (one
    4-byte allreduce; `flag` itself in one process).

    Args:
        flag: a boolean scalar tensor.
        name: identifies the collective; the same on every rank.

    Returns:
        A boolean scalar tensor.

    Example:
        ```python
        finite = tfscale.distributed.true_on_every_rank(tf.reduce_all(ok), name="finite")
        ```
    """
    if runtime.engine() is None:
        return flag
    return allreduce_min(tf.cast(flag, tf.float32), name) > 0.5


def _allreduce(tensor, name, op):
    tensor = tf.convert_to_tensor(tensor)
    engine = runtime.engine()
    return tensor if engine is None else engine.allreduce(tensor, op, name)
