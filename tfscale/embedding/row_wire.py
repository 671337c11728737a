"""The dtypes looked-up rows of tables spread over the ranks may travel in between ranks
(`wire_dtype`): float32, or bfloat16 for half the bytes each way (the alltoall itself:
tfscale.distributed.owner_routing)."""

import tensorflow as tf

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
