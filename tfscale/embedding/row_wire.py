"""Rows on the wire between ranks: the alltoall that brings looked-up rows back from their owners
and, in the backward pass, takes the row gradients to them, in float32 or narrowed to bfloat16
(half the bytes each way; TorchRec's quantized communication narrows its embedding alltoalls the
same way). Horovod's alltoall takes no bfloat16, so narrowed rows travel bit-cast as int16 and
their gradient's alltoall is written here (for float32, Horovod's own gradient serves)."""

import tensorflow as tf

from tfscale import distributed
from tfscale.errors import UserError

WIRE_DTYPES = ("float32", "bfloat16")


def check_wire_dtype(wire_dtype):
    """A UserError naming `wire_dtype` unless it is one of WIRE_DTYPES."""
    if wire_dtype not in WIRE_DTYPES:
        raise UserError(f"`wire_dtype={wire_dtype!r}`: give one of {', '.join(WIRE_DTYPES)} (the "
                        "dtype looked-up rows and their gradients travel in between ranks)")


def wire_bytes(wire_dtype):
    """Bytes a row value takes on the wire."""
    return tf.as_dtype(wire_dtype).size


def exchange_rows(rows, splits, wire_dtype, name):
    """Float32 `rows` [n, width] sent by alltoall (`splits`: rows per destination rank), as the
    float32 rows this rank receives; their gradient travels back the same way, in the same
    dtype. `name` must be the same on every rank."""
    hvd = distributed.runtime.horovod()
    if wire_dtype == "float32":
        received, _ = hvd.alltoall(rows, splits=splits, name=name)
        return received

    @tf.custom_gradient
    def through_the_wire(values):
        received, received_splits = hvd.alltoall(_narrowed(values), splits=splits, name=name)

        def gradient(upstream):
            returned, _ = hvd.alltoall(_narrowed(upstream), splits=received_splits,
                                       name=f"{name}_gradient")
            return _widened(returned)

        return _widened(received), gradient

    return through_the_wire(rows)


def _narrowed(values):
    return tf.bitcast(tf.cast(values, tf.bfloat16), tf.int16)


def _widened(values):
    return tf.cast(tf.bitcast(values, tf.bfloat16), tf.float32)
