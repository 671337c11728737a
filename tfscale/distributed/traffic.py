"""Bytes a rank sends and receives per step in the gradient exchange, under each embedding
exchange (tfscale.distributed.gradients), from the gradients' shapes.

Model (Gloo's ring algorithms, payload only: Horovod's negotiation, the allgather's size
exchange and TCP/IP headers are left out):
- a dense tensor of n bytes is ring-allreduced (reduce-scatter, then allgather): each rank sends
  2(P-1)/P * n bytes and receives as many;
- an IndexedSlices of c bytes per rank (values plus indices, every rank assumed to hold as many
  rows as this one, true for embedding gradients at equal local batches: one row per occurrence)
  is ring-allgathered: each rank sends P-1 chunks (its own, then the ones it forwards) and
  receives P-1, so (P-1) * c bytes each way;
- with the "dense" exchange an IndexedSlices counts as its dense tensor (dense_shape's bytes).
All ranks share one link when they run on one machine: that link carries P times a rank's sent
bytes per step."""

import numpy as np
import tensorflow as tf

from tfscale.distributed.runtime import check_embedding_exchange


def exchange_bytes(gradients, num_ranks, embedding_exchange):
    """Bytes one rank sends plus receives per step to exchange `gradients` (tensors,
    IndexedSlices or None, as from `tape.gradient`) over `num_ranks` ranks; each direction is
    half of it."""
    check_embedding_exchange(embedding_exchange)
    one_way = 0.0
    for gradient in gradients:
        if gradient is None:
            continue
        if isinstance(gradient, tf.IndexedSlices) and embedding_exchange == "allgather":
            chunk = _nbytes(gradient.values.shape, gradient.values.dtype) + \
                _nbytes(gradient.indices.shape, gradient.indices.dtype)
            one_way += (num_ranks - 1) * chunk
        else:
            shape = tf.get_static_value(gradient.dense_shape) \
                if isinstance(gradient, tf.IndexedSlices) else gradient.shape
            one_way += 2 * (num_ranks - 1) / num_ranks * _nbytes(shape, gradient.dtype)
    return 2 * one_way


def _nbytes(shape, dtype):
    return int(np.prod(shape, dtype=np.int64)) * tf.as_dtype(dtype).size
