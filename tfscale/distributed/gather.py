"""Numpy arrays from every rank joined along their first axis (rank order), for evaluating over
the union of the ranks' test shards."""

import tensorflow as tf

from tfscale.distributed import runtime


def allgather_array(array, name):
    """The concatenation of every rank's `array` (first dimensions may differ between ranks);
    `array` itself outside Horovod. `name` must be the same on every rank.

    Example:
        ```python
        labels = tfscale.distributed.allgather_array(my_labels, name="test_labels")  # every rank's
        ```
    """
    hvd = runtime.horovod()
    if hvd is None:
        return array
    return hvd.allgather(tf.convert_to_tensor(array), name=name).numpy()
