"""The dtypes an embedding table's rows are stored in (`TABLE_DTYPES`), and how a table stored in
half precision is read: float32 (4 bytes an element), or bfloat16 / float16 (2 bytes, half the
table's memory). Rows are read as float32 (`as_float32`: the gather, then the cast, so a lookup
costs the batch's rows) and their gradient is float32 row slices, so the exchanges, the loss
scaler and the optimizer's arithmetic all work in float32; the optimizer writes the updated rows
back rounded stochastically (tfscale.optimizers.stochastic_rounding), which FBGEMM also does for
its FP16 tables. The optimizer's state of a half-precision table stays float32."""

import tensorflow as tf

TABLE_DTYPES = ("float32", "bfloat16", "float16")
HALF_DTYPES = (tf.bfloat16, tf.float16)


def checked(table_dtype, argument="table_dtype"):
    """`table_dtype` as a name in TABLE_DTYPES; a ValueError naming `argument` otherwise.

    Args:
        table_dtype: a dtype name or a tf.DType.
        argument: the argument the value came in, for the error.

    Returns:
        A str, one of TABLE_DTYPES."""
    try:
        name = tf.as_dtype(table_dtype).name
    except TypeError:
        name = None
    if name not in TABLE_DTYPES:
        raise ValueError(f"`{argument}={table_dtype!r}`: an embedding table's rows are stored in "
                         f"one of {', '.join(TABLE_DTYPES)}")
    return name


def is_half(dtype):
    """Whether `dtype` (a name or a DType) is a half-precision table dtype."""
    return tf.as_dtype(dtype) in HALF_DTYPES


def arithmetic_dtype(dtype):
    """The dtype an optimizer computes a table's update in: float32 for a half-precision table,
    the table's own dtype otherwise."""
    return tf.float32 if is_half(dtype) else tf.as_dtype(dtype)


def as_float32(rows):
    """Rows gathered from a table, as float32; a half-precision table's rows with a float32
    gradient: the gather's own gradient, handed float32 values (TensorFlow's cast would hand it
    the table's dtype, and a float16 gradient loses small values before the loss scaler or the
    optimizer sees them)."""
    return _float32_with_float32_gradient(rows) if is_half(rows.dtype) else rows


@tf.custom_gradient
def _float32_with_float32_gradient(stored):
    """`stored` (half precision) cast to float32, its gradient passed on in float32. A function
    of the gathered rows, not of the variable: a custom gradient over a variable reads it whole
    every step."""
    return tf.cast(stored, tf.float32), lambda upstream: upstream
