"""The bytes one rank sends (and as many it receives) to allreduce or allgather a gradient, from
its shape (static or not: it works inside the train step). The allgather and dense exchanges
add these up; the top-k exchanges count their own buffers (tfscale.distributed.topk).

Model (Gloo's ring algorithms, payload only: Horovod's negotiation, the allgather's size
exchange and TCP/IP headers are left out):
- a dense tensor of n bytes is ring-allreduced (reduce-scatter, then allgather): each rank sends
  2(P-1)/P * n bytes and receives as many;
- a row gradient of c bytes per rank (values plus indices, plus counts for a CountedSlices;
  every rank assumed to hold as many rows as this one: true for plain lookups' gradients at
  equal local batches, one row per occurrence; close for de-duplicated ones, one per unique id)
  is ring-allgathered: each rank sends P-1 chunks (its own, then the ones it forwards) and
  receives P-1, so (P-1) * c bytes each way.
All ranks share one link when they run on one machine: that link carries P times a rank's sent
bytes per step."""

import tensorflow as tf

from tfscale.row_gradients import CountedSlices


def allreduce_bytes(gradient, num_ranks, compression="none"):
    """One direction's bytes (float64 scalar tensor) of ring-allreducing `gradient` (a tensor, or
    an IndexedSlices as its dense tensor); float16 on the wire with `compression="fp16"`."""
    elements = tf.reduce_prod(tf.cast(gradient.dense_shape, tf.int64)) \
        if isinstance(gradient, tf.IndexedSlices) else tf.size(gradient, tf.int64)
    dtype = tf.float16 if compression == "fp16" else gradient.dtype
    return 2 * (num_ranks - 1) / num_ranks * _nbytes(elements, dtype)


def allgather_bytes(gradient, num_ranks):
    """One direction's bytes of ring-allgathering the row gradient `gradient` (Horovod does not
    compress allgathers)."""
    chunk = tensor_bytes(gradient.values) + tensor_bytes(gradient.indices)
    if isinstance(gradient, CountedSlices):
        chunk += tensor_bytes(gradient.counts)
    return (num_ranks - 1) * chunk


def tensor_bytes(tensor):
    """The bytes of `tensor`'s values (a float64 scalar tensor; the shape may be dynamic)."""
    return _nbytes(tf.size(tensor, tf.int64), tensor.dtype)


def _nbytes(elements, dtype):
    return tf.cast(elements, tf.float64) * tf.as_dtype(dtype).size
