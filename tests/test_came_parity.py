"""tfscale's CAME against the reference implementation, `came-pytorch` 0.1.3 on torch 2.13.0
(CPU), both test-only requirements (setup.py extra "test"): the same parameters and random
gradients through both, compared after every run.

The learning rate and the weight decay are powers of two: Keras keeps the learning rate in a
float32 variable and casts the weight decay through a float32 tensor, so other values would reach
a float64 variable rounded to float32 while torch uses the Python float, and the float64
comparison would measure that rounding rather than the algorithm."""

import keras
import numpy as np
import pytest
import tensorflow as tf
import torch
from came_pytorch import CAME as ReferenceCAME

from tfscale.optimizers.came import CAME

LEARNING_RATE = 2.0 ** -6
WEIGHT_DECAY = 2.0 ** -3
SHAPES = {"1d": (7,), "2d": (5, 3), "3d": (2, 4, 3), "column": (6, 1)}


def _problem(shape, steps, seed):
    """Initial values and `steps` gradients of `shape` (the gradients' scale varies per step)."""
    rng = np.random.default_rng(seed)
    initial = rng.standard_normal(shape)
    gradients = [rng.standard_normal(shape) * rng.uniform(0.1, 3.0) for _ in range(steps)]
    return initial, gradients


def _run_tfscale(initial, gradients, dtype, weight_decay, clip_threshold):
    variable = keras.Variable(initial.astype(dtype), dtype=dtype)
    optimizer = CAME(learning_rate=LEARNING_RATE, weight_decay=weight_decay,
                     clip_threshold=clip_threshold)
    for gradient in gradients:
        optimizer.apply([tf.constant(gradient.astype(dtype))], [variable])
    return variable.numpy()


def _run_reference(initial, gradients, dtype, weight_decay, clip_threshold):
    torch_dtype = getattr(torch, dtype)
    parameter = torch.nn.Parameter(torch.tensor(initial, dtype=torch_dtype))
    optimizer = ReferenceCAME([parameter], lr=LEARNING_RATE, weight_decay=weight_decay or 0.0,
                              clip_threshold=clip_threshold)
    for gradient in gradients:
        parameter.grad = torch.tensor(gradient, dtype=torch_dtype)
        optimizer.step()
    return parameter.detach().numpy()


# With the default betas the unclipped update's RMS starts near sqrt(1000) and stays above 1, so a
# clip_threshold of 1 clips every step and 100 none.
@pytest.mark.parametrize("clip_threshold", [1.0, 100.0])
@pytest.mark.parametrize("weight_decay", [None, WEIGHT_DECAY])
@pytest.mark.parametrize("dtype,steps,rtol", [("float64", 20, 1e-10), ("float32", 5, 1e-5)])
@pytest.mark.parametrize("shape_name", sorted(SHAPES))
def test_matches_reference(shape_name, dtype, steps, rtol, weight_decay, clip_threshold):
    initial, gradients = _problem(SHAPES[shape_name], steps, seed=0)
    ours = _run_tfscale(initial, gradients, dtype, weight_decay, clip_threshold)
    reference = _run_reference(initial, gradients, dtype, weight_decay, clip_threshold)
    assert not np.allclose(ours, initial, rtol=1e-3)  # the run moved the parameter
    np.testing.assert_allclose(ours, reference, rtol=rtol, atol=rtol * 1e-3)


@pytest.mark.parametrize("dtype,steps,rtol", [("float64", 20, 1e-10), ("float32", 5, 1e-5)])
def test_keras_kernel_matches_torch_weight(dtype, steps, rtol):
    """A Keras Dense kernel (in, out) trained by CAME equals the transposed torch Linear weight
    (out, in) trained by the reference on the transposed gradients."""
    initial, gradients = _problem((6, 4), steps, seed=3)
    kernel = _run_tfscale(initial, gradients, dtype, WEIGHT_DECAY, 1.0)
    weight = _run_reference(initial.T, [g.T for g in gradients], dtype, WEIGHT_DECAY, 1.0)
    np.testing.assert_allclose(kernel, weight.T, rtol=rtol, atol=rtol * 1e-3)
