"""Optimizer memory accounting: the bytes an optimizer's state takes (`optimizer_state_bytes`)
and the lower bound a factored optimizer with momentum can reach (`factored_minimum_bytes`)."""

import math
from typing import NamedTuple

import keras
import tensorflow as tf


class StateBytes(NamedTuple):
    """`total` bytes, and `by_variable`: (path, bytes) per optimizer variable, in the optimizer's
    order (a list: paths need not be unique, Keras's Adafactor names two slots alike)."""

    total: int
    by_variable: list


def optimizer_state_bytes(optimizer_or_model):
    """The bytes held by every variable of an optimizer (slots, factor vectors, placeholders,
    the iteration counter and the learning rate): what its checkpoint stores.

    Given a model, measures `model.optimizer`, building it on the model's trainable variables
    first if needed. An optimizer alone must already be built."""
    optimizer = optimizer_or_model
    if isinstance(optimizer_or_model, keras.Model):
        optimizer = optimizer_or_model.optimizer
        if optimizer is None:
            raise ValueError("the model has no optimizer: compile it first")
        if not optimizer.built:
            optimizer.build(optimizer_or_model.trainable_variables)
    elif not optimizer.built:
        raise ValueError("the optimizer is not built: build it on its variables first")
    by_variable = [(getattr(v, "path", v.name), _bytes(v.shape, v.dtype))
                   for v in optimizer.variables]
    return StateBytes(sum(size for _, size in by_variable), by_variable)


def factored_minimum_bytes(model, state_dtype="float32"):
    """The optimizer-state bytes of a factored optimizer with momentum on `model`: the least that
    CAME's algorithm needs, with no per-optimizer overhead.

    Per trainable variable of shape (..., n, m) with k = prod(...) leading slices: a full-size
    momentum (k*n*m values) plus four factor vectors, the squared-gradient row/column and the
    instability row/column statistics (2*k*(n + m) values). Per variable of fewer than 2 dims
    (size s): momentum and an unfactored second moment (2*s values). Values of `state_dtype`.

    Why this is the minimum: the momentum is the update itself, so it cannot be factored without
    changing the algorithm; the second moment and the instability are only ever used through
    their rank-1 row/column factors, which is the least a per-(row, column) estimate can keep;
    vectors and scalars are not factored (a rank-1 factor of a vector is the vector). Keras's
    iteration counter and learning rate are not counted."""
    values = 0
    for variable in model.trainable_variables:
        shape = tuple(variable.shape)
        size = math.prod(shape)
        if len(shape) >= 2:
            slices = math.prod(shape[:-2])
            values += size + 2 * slices * (shape[-2] + shape[-1])
        else:
            values += 2 * size
    return values * _itemsize(state_dtype)


def _bytes(shape, dtype):
    return math.prod(shape) * _itemsize(dtype)


def _itemsize(dtype):
    return tf.as_dtype(keras.backend.standardize_dtype(dtype)).size
