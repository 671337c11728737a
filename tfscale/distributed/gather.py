"""Numpy arrays from every rank joined along their first axis (rank order), for evaluating over
the union of the ranks' test shards."""

import tensorflow as tf

from tfscale.distributed import runtime


def allgather_array(array, name):
    """The concatenation of every rank's `array` (first dimensions may differ between ranks);
    `array` itself in one process.

    Args:
        array: this rank's numpy array; the other dimensions and the dtype equal on every rank.
        name: identifies the collective; the same on every rank.

    Returns:
        A numpy array, the ranks' arrays joined along the first axis in rank order.

    Example:
        ```python
        labels = tfscale.distributed.allgather_array(my_labels, name="test_labels")  # every rank's
        ```
    """
    engine = runtime.engine()
    if engine is None:
        return array
    return engine.allgather(tf.convert_to_tensor(array), name).numpy()
