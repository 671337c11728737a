"""A run's precision (docs/mixed_precision.md): the Keras dtype policy its model is built with and the
loss scaling its optimizer gets.

Models take the policy as their `dtype` (Keras 3 policies: float32 variables, float16 or bfloat16
compute); tfscale's embedding tables, the final sigmoid and the loss stay float32 whatever the
policy, and optimizers keep float32 state because the variables are float32. Loss scaling
(tfscale.optimizers.loss_scaling) is on by default for float16 only: bfloat16 has float32's exponent
range."""

from tfscale.optimizers.loss_scaling import DEFAULT_GROWTH_STEPS, LossScaleOptimizer

PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")


def dtype_policy(precision):
    """The Keras dtype policy name of `precision` (one of PRECISIONS)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    return precision


def parse_loss_scale(text, precision):
    """None (no scaling), "dynamic", or a fixed positive scale, from a flag value: "none",
    "dynamic", a number, or None for the precision's default (dynamic for mixed_float16)."""
    if text is None:
        return "dynamic" if precision == "mixed_float16" else None
    if text in ("none", "dynamic"):
        return None if text == "none" else text
    try:
        scale = float(text)
    except ValueError:
        raise ValueError(f"loss scale must be 'none', 'dynamic' or a positive number, got "
                         f"{text!r}") from None
    if not scale > 0 or scale == float("inf"):
        raise ValueError(f"a fixed loss scale must be a positive finite number, got {text!r}")
    return scale


def with_loss_scaling(optimizer, loss_scale, growth_steps=DEFAULT_GROWTH_STEPS):
    """`optimizer` wrapped for `loss_scale` (a parse_loss_scale result), or unchanged for None."""
    if loss_scale is None:
        return optimizer
    if loss_scale == "dynamic":
        return LossScaleOptimizer(optimizer, dynamic_growth_steps=growth_steps)
    return LossScaleOptimizer(optimizer, initial_scale=loss_scale, dynamic=False)
