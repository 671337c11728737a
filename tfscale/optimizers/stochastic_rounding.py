"""Stochastic rounding of float32 values to a half-precision dtype (bfloat16, float16): each
value becomes one of the two half-precision numbers around it, the farther one with probability
its distance over the gap between them, so the rounding is unbiased: the mean of many rounded
values is the float32 value. Round-to-nearest drops any update smaller than half a unit in the
last place (for bfloat16, 2**-9 of the weight): a row of a half-precision table updated by
small steps would never move. FBGEMM writes its FP16 tables the same way. TensorFlow has no
stochastic-rounding cast; this is one in element-wise ops (a few passes over the batch's rows)."""

import tensorflow as tf

from tfscale.embedding.table_dtypes import HALF_DTYPES


def stochastically_rounded(values, dtype, seed):
    """`values` (float32) rounded stochastically to `dtype` (module docstring).

    Args:
        values: a float32 tensor.
        dtype: tf.bfloat16 or tf.float16.
        seed: int32 or int64 [2], the stateless random seed (the same seed rounds the same
            values alike). Values beyond `dtype`'s range round to its infinities, as a cast
            does.

    Returns:
        A tensor of `values`' shape and `dtype`."""
    dtype = tf.as_dtype(dtype)
    if dtype not in HALF_DTYPES:
        raise ValueError(f"`dtype={dtype.name}`: stochastic rounding is to bfloat16 or float16")
    nearest = tf.cast(values, dtype)
    nearest_value = tf.cast(nearest, tf.float32)
    # The other neighbour: one step up or down in magnitude (sign and magnitude bits, so +1 on
    # the bits moves away from zero on either side).
    away = tf.abs(values) > tf.abs(nearest_value)
    bits = tf.bitcast(nearest, tf.int16)
    other = tf.bitcast(tf.where(away, bits + 1, bits - 1), dtype)
    gap = tf.abs(tf.cast(other, tf.float32) - nearest_value)
    probability = tf.math.divide_no_nan(tf.abs(values - nearest_value), gap)
    probability = tf.where(tf.math.is_finite(probability), probability, 0.0)
    draws = tf.random.stateless_uniform(tf.shape(values), seed, dtype=tf.float32)
    return tf.where(draws < probability, other, nearest)
