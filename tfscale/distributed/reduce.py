"""Sums and maxima of small tensors over the Horovod ranks, in the graph (the tensor itself in one
process): the global counts that dynamic tables decide by (tfscale.embedding.id_rows)."""

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
    return _allreduce(tensor, name, "Sum")


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
    return _allreduce(tensor, name, "Max")


def _allreduce(tensor, name, op):
    tensor = tf.convert_to_tensor(tensor)
    if not runtime.is_active() or runtime.size() == 1:
        return tensor
    hvd = runtime.horovod()
    return hvd.allreduce(tensor, op=getattr(hvd, op), name=name)
