"""`CAME` (Luo et al., ACL 2023, arXiv 2307.02047): Adafactor's factored second moment plus a
factored "confidence" (instability) term that scales the momentum update. The reference is
`came-pytorch` 0.1.3, which this module matches step for step (tests/test_came_parity.py).

State per variable (float32, float64 for float64 variables; never the compute dtype):
- at least 2 dims, shape (..., n, m): momentum (..., n, m); row/column statistics of the squared
  gradient (..., n) and (..., m); row/column statistics of the instability (..., n) and (..., m).
  Only the last two axes are factored; leading axes are independent slices.
- fewer dims: momentum and an unfactored second moment, both full size; no confidence term.

Weight decay is Keras's decoupled `weight_decay` (`theta -= lr * wd * theta`, with
`exclude_from_weight_decay`). Keras applies it before `update_step`, the reference between
computing the update and applying it; the update never reads theta, so both orders give the
same result. IndexedSlices gradients are densified: the factored statistics cover every row.

A partitioned table (tfscale.embedding.table; row-sharded: tfscale.embedding.row_sharding) holds 1/P
of the rows on each rank; its row statistics are per row and stay with the shard, while what spans
the whole table (the column statistics, the row statistics' mean and the update's RMS) is
summed over the shards: two
allreduces of dim + 1 values and one of a scalar per table and step, so P ranks take the step
one process takes on the whole table.
"""

import keras
from keras import ops

from tfscale import distributed
from tfscale.embedding.table import shard_of
from tfscale.optimizers.capabilities import DeclaresTableState, TableState
from tfscale.optimizers.averaged import RefusesUnaveragedGradients
from tfscale.row_gradients import densify


@keras.saving.register_keras_serializable(package="tfscale")
class CAME(RefusesUnaveragedGradients, DeclaresTableState, keras.optimizers.Optimizer):
    """Confidence-guided Adaptive Memory Efficient optimizer.

    Args:
        learning_rate: float, schedule or callable. The default, 1e-3, was CAME's best in a
            bracketed sweep on a small transformer (batch 32, 3,000 steps) and on DeepFM
            (batch 8,192), where Adam's best was 1e-2; with a small batch or few steps 3e-4
            was (docs/results/came.md). The reference has no default (its README uses 2e-4;
            the authors advise 0.5-0.9x the AdamW rate). There is no bias correction: the
            instability average starts at 0, so at step t the update is about
            1 / sqrt(1 - beta_3^t) times what a bias-corrected one would be (100x at step 1,
            2x at step 3,000 with beta_3 = 0.9999; a first step moves each element by about
            11x lr). Use a warmup, and a rate about a tenth of Adam's.
        beta_1: decay of the momentum of the clipped update.
        beta_2: decay of the squared-gradient statistics.
        beta_3: decay of the instability statistics (the paper's 0.9999; in a 3,000-step run
            0.999 did better, docs/results/came.md).
        epsilon_1: added to the squared gradient.
        epsilon_2: added to the instability.
        clip_threshold: the update is scaled down to RMS <= clip_threshold (per variable).
        weight_decay: as `keras.optimizers.Optimizer`'s, and so are the arguments after it.

    Raises:
        UserError: at `apply`, in a horovodrun job of two or more ranks, for gradients that
            tfscale's train step did not average (a plain keras.Model).

    Example:
        ```python
        model.compile(optimizer=tfscale.optimizers.CAME(1e-3), loss="binary_crossentropy")
        ```
    """

    def __init__(self, learning_rate=1e-3, beta_1=0.9, beta_2=0.999, beta_3=0.9999,
                 epsilon_1=1e-30, epsilon_2=1e-16, clip_threshold=1.0, weight_decay=None,
                 clipnorm=None, clipvalue=None, global_clipnorm=None, use_ema=False,
                 ema_momentum=0.99, ema_overwrite_frequency=None, loss_scale_factor=None,
                 gradient_accumulation_steps=None, name=None, **kwargs):
        super().__init__(
            learning_rate=learning_rate, name=name, weight_decay=weight_decay,
            clipnorm=clipnorm, clipvalue=clipvalue, global_clipnorm=global_clipnorm,
            use_ema=use_ema, ema_momentum=ema_momentum,
            ema_overwrite_frequency=ema_overwrite_frequency,
            loss_scale_factor=loss_scale_factor,
            gradient_accumulation_steps=gradient_accumulation_steps, **kwargs)
        self.beta_1 = beta_1
        self.beta_2 = beta_2
        self.beta_3 = beta_3
        self.epsilon_1 = epsilon_1
        self.epsilon_2 = epsilon_2
        self.clip_threshold = clip_threshold

    def build(self, var_list):
        """Creates the state of each variable (see the module docstring); slots a variable does
        not use are None.

        Args:
            var_list: the variables this optimizer will update."""
        if self.built:
            return
        super().build(var_list)
        self._momentums, self._velocities = [], []
        self._rows, self._columns, self._instability_rows, self._instability_columns = \
            [], [], [], []
        for variable in var_list:
            self._build_state(variable)

    def _build_state(self, variable):
        """Appends `variable`'s state to the lists of each kind of state (None where it keeps
        none of that kind)."""
        shape = tuple(variable.shape)
        factored = len(shape) >= 2
        self._momentums.append(self._add_state(variable, shape, "momentum"))
        self._velocities.append(
            None if factored else self._add_state(variable, shape, "velocity"))
        row_shape, column_shape = shape[:-1], shape[:-2] + shape[-1:]
        for slots, slot_shape, suffix in (
            (self._rows, row_shape, "row"),
            (self._columns, column_shape, "column"),
            (self._instability_rows, row_shape, "instability_row"),
            (self._instability_columns, column_shape, "instability_column"),
        ):
            slots.append(self._add_state(variable, slot_shape, suffix) if factored else None)

    def table_state(self, table):
        """Per row: the momentum and the row statistics; whole: the column statistics (summed
        over the shards in `update_step`).

        Args:
            table: an embedding table this optimizer was built on.

        Returns:
            A tfscale.optimizers.capabilities.TableState."""
        index = self._get_variable_index(table)
        return TableState(
            per_row=(self._momentums[index], self._rows[index], self._instability_rows[index]),
            whole=(self._columns[index], self._instability_columns[index]))

    def _add_state(self, variable, shape, suffix, initializer="zeros"):
        prefix = getattr(variable, "path", variable.name).replace("/", "_").replace(":", "_")
        return self.add_variable(shape=shape, dtype=state_dtype(variable.dtype),
                                 initializer=initializer, name=f"{prefix}_{suffix}")

    def update_step(self, gradient, variable, learning_rate):
        """One CAME step of `variable` (docs/came.md steps 1-10; weight decay is the base
        class's).

        Args:
            gradient: the gradient of `variable` (IndexedSlices are densified).
            variable: the variable to update.
            learning_rate: this step's learning rate."""
        index = self._get_variable_index(variable)
        dtype = state_dtype(variable.dtype)
        gradient = ops.cast(densify(gradient), dtype)
        squared = ops.square(gradient) + self.epsilon_1
        factored = len(variable.shape) >= 2
        whole = _WholeTable(shard_of(variable), f"{self.name}_{index}")
        if factored:
            update = self._factored(self._rows[index], self._columns[index], squared,
                                    self.beta_2, whole, "squares") * gradient
        else:
            velocity = self._ema(self._velocities[index], squared, self.beta_2)
            update = ops.rsqrt(velocity) * gradient
        update = update / ops.maximum(whole.rms(update) / self.clip_threshold, 1.0)
        momentum = self._ema(self._momentums[index], update, self.beta_1)
        if factored:
            instability = ops.square(update - momentum) + self.epsilon_2
            step = self._factored(self._instability_rows[index],
                                  self._instability_columns[index], instability, self.beta_3,
                                  whole, "instability") * momentum
        else:
            step = momentum
        step = ops.cast(learning_rate, dtype) * step
        self.assign_sub(variable, ops.cast(step, variable.dtype))

    def _factored(self, rows, columns, values, beta, whole, name):
        """Updates the row and column averages of `values` (..., n, m) in the slots `rows` and
        `columns` and returns 1 / sqrt of their rank-1 estimate
        V = (row / mean(row))[..., :, None] * column[..., None, :] (means per leading slice)."""
        row = self._ema(rows, ops.mean(values, axis=-1), beta)
        column_mean, row_mean = whole.column_and_row_means(values, row, name)
        column = self._ema(columns, column_mean, beta)
        row_factor = ops.rsqrt(row / row_mean)
        return ops.expand_dims(row_factor, -1) * ops.expand_dims(ops.rsqrt(column), -2)

    def _ema(self, average, value, beta):
        """Assigns `beta * average + (1 - beta) * value` to `average` and returns it."""
        updated = beta * average + (1.0 - beta) * value
        self.assign(average, updated)
        return updated

    def get_config(self):
        config = super().get_config()
        config.update({
            "beta_1": self.beta_1,
            "beta_2": self.beta_2,
            "beta_3": self.beta_3,
            "epsilon_1": self.epsilon_1,
            "epsilon_2": self.epsilon_2,
            "clip_threshold": self.clip_threshold,
        })
        return config


def state_dtype(variable_dtype):
    """The dtype of CAME's state and math for a variable of `variable_dtype`: float32, or
    float64 for float64 variables (float16 cannot hold epsilon_1, bfloat16 is too coarse)."""
    return "float64" if keras.backend.standardize_dtype(variable_dtype) == "float64" else "float32"


class _WholeTable:
    """Means over every row of a variable: over its own rows, or, for a row shard under Horovod,
    over every rank's shard (sums allreduced under names that start with `name`)."""

    def __init__(self, shard, name):
        self._shard = shard if shard is not None and distributed.is_active() else None
        self._name = name

    def column_and_row_means(self, values, row, name):
        """The mean of `values` (..., n, m) over its rows (..., m) and of `row` (..., n), with
        keepdims (..., 1)."""
        if self._shard is None:
            return ops.mean(values, axis=-2), ops.mean(row, axis=-1, keepdims=True)
        sums = self._sum_over_shards(
            ops.concatenate([ops.sum(values, axis=0), ops.sum(row, keepdims=True)], axis=0),
            name)
        return sums[:-1] / self._shard.total_rows, sums[-1:] / self._shard.total_rows

    def rms(self, update):
        """The root mean square of every element of `update`."""
        if self._shard is None:
            return ops.sqrt(ops.mean(ops.square(update)))
        total = self._shard.total_rows * int(update.shape[-1])
        return ops.sqrt(self._sum_over_shards(ops.sum(ops.square(update)), "rms") / total)

    def _sum_over_shards(self, value, name):
        return distributed.allreduce_sum(value, f"tfscale_came_{self._name}_{name}")
