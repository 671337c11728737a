"""Bytes a rank sends and receives per step in the gradient exchange, under the "allgather" and
"dense" embedding exchanges (tfscale.distributed.gradients), from the gradients' shapes (static
or not: it works inside the train step). The top-k exchanges count their own buffers
(tfscale.distributed.topk).

Model (Gloo's ring algorithms, payload only: Horovod's negotiation, the allgather's size
exchange and TCP/IP headers are left out):
- a dense tensor of n bytes is ring-allreduced (reduce-scatter, then allgather): each rank sends
  2(P-1)/P * n bytes and receives as many;
- an IndexedSlices of c bytes per rank (values plus indices, plus counts for a CountedSlices;
  every rank assumed to hold as many rows as this one: true for plain lookups' gradients at
  equal local batches, one row per occurrence; close for de-duplicated ones, one per unique id)
  is ring-allgathered: each rank sends P-1 chunks (its own, then the ones it forwards) and
  receives P-1, so (P-1) * c bytes each way;
- with the "dense" exchange an IndexedSlices counts as its dense tensor (dense_shape's bytes).
All ranks share one link when they run on one machine: that link carries P times a rank's sent
bytes per step."""

import tensorflow as tf

from tfscale import dedup
from tfscale.distributed.runtime import PLAIN_EXCHANGES


def exchange_bytes(gradients, num_ranks, embedding_exchange, compression="none"):
    """Bytes one rank sends plus receives per step (a float64 scalar tensor) to exchange
    `gradients` (tensors, IndexedSlices or None, as from `tape.gradient`) over `num_ranks` ranks
    with `embedding_exchange` ("allgather" or "dense"); each direction is half of it. With
    `compression="fp16"` allreduced tensors travel as float16 (Horovod does not compress the
    allgathered IndexedSlices)."""
    if embedding_exchange not in PLAIN_EXCHANGES:
        raise ValueError(f"exchange_bytes models the {PLAIN_EXCHANGES} exchanges, got "
                         f"{embedding_exchange!r}")
    one_way = tf.constant(0.0, tf.float64)
    for gradient in gradients:
        if gradient is None:
            continue
        if isinstance(gradient, tf.IndexedSlices) and embedding_exchange == "allgather":
            chunk = tensor_bytes(gradient.values) + tensor_bytes(gradient.indices)
            if isinstance(gradient, dedup.CountedSlices):
                chunk += tensor_bytes(gradient.counts)
            one_way += (num_ranks - 1) * chunk
        else:
            elements = tf.reduce_prod(tf.cast(gradient.dense_shape, tf.int64)) \
                if isinstance(gradient, tf.IndexedSlices) else tf.size(gradient, tf.int64)
            dtype = tf.float16 if compression == "fp16" else gradient.dtype
            one_way += 2 * (num_ranks - 1) / num_ranks * _nbytes(elements, dtype)
    return 2 * one_way


def tensor_bytes(tensor):
    """The bytes of `tensor`'s values (a float64 scalar tensor; the shape may be dynamic)."""
    return _nbytes(tf.size(tensor, tf.int64), tensor.dtype)


def _nbytes(elements, dtype):
    return tf.cast(elements, tf.float64) * tf.as_dtype(dtype).size


class TrafficCounter:
    """The bytes this rank sent and received in the last train step's gradient exchange, held in
    variables the step assigns, read for TensorBoard."""

    def __init__(self):
        self._sent = None
        self._received = None

    def record(self, sent, received):
        if self._sent is None:
            with tf.init_scope():
                self._sent = tf.Variable(0.0, dtype=tf.float64, trainable=False)
                self._received = tf.Variable(0.0, dtype=tf.float64, trainable=False)
        self._sent.assign(tf.cast(sent, tf.float64))
        self._received.assign(tf.cast(received, tf.float64))

    def summary_scalars(self):
        """{"exchange/bytes_sent": ..., "exchange/bytes_received": ...}, or {} before any step."""
        if self._sent is None:
            return {}
        return {"exchange/bytes_sent": float(self._sent.numpy()),
                "exchange/bytes_received": float(self._received.numpy())}
