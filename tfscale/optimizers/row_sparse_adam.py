"""`RowSparseAdam`: Adam that, given a table's row gradient, updates only the rows it holds, in
the table and in its moments (tfscale.optimizers.row_updates), so a step costs O(rows in the
batch) instead of O(table rows). Other variables take FusedAdam's dense update. Keras has no
row-sparse optimizer update.

A table updated by row keeps both moments in one slot, `<table>_moments` of shape [rows, 2, dim]
(`[:, 0]` the first moment, `[:, 1]` the second), instead of Keras's two: a step gathers and
scatters the table's rows, then its moments' rows, once each (four row passes, not six; measured
in docs/results/small_batch.md). A dense gradient of such a table (the `dense` exchange) updates
the table and the slot whole, with the same arithmetic as TF's ApplyAdam. Every other variable
keeps Keras's `momentum` and `velocity` slots.

What happens to a row between the batches that hold it:
- `catch_up=True` (default): what Adam on the densified gradient would have done to it is
  applied when the row is next in a batch, from the number of steps since it last was (a per-row
  step counter, one int32 per row): the moments decay (beta ** steps), the first moment's tail keeps
  moving the row (a geometric sum), and the tables' L2 shrinks it (its Adam-normalised pull toward
  zero, summed over those steps as the second moment decays). Each sum is in closed form, so a
  catch-up costs a few element-wise passes over the batch's rows. The approximations: the learning
  rate of the skipped steps is taken as constant (the tail's at its first skipped step, the L2's at
  this step), and the L2's own contribution to the moments is left out. FBGEMM's counter-based
  regularisation also keeps a last-seen step per row. Rows are behind until their next batch;
  `catch_up_every_row` (a whole-table pass, in blocks; the tfscale.training.callbacks.CatchUpRows
  callback runs it at each epoch's end) brings every row up to date before an evaluation or an
  export, and sends rows never in a batch to the zero that Adam's L2 pulls them to.
- `catch_up=False`: "lazy" Adam, as TF1's LazyAdamOptimizer and PyTorch's SparseAdam: absent
  rows keep their weights and moments."""

import math

import keras
import tensorflow as tf

from tfscale.embedding import table_names
from tfscale.embedding.table import written_rows
from tfscale.embedding.table_dtypes import arithmetic_dtype
from tfscale.optimizers.capabilities import DeclaresTableState, TableState
from tfscale.optimizers.fused_adam import FusedAdam
from tfscale.optimizers.row_updates import RowUpdates


_MOMENTS = "_moments"


def two_slot_names(name):
    """For the path of a moments slot (`..._moments`), the paths RowSparseAdam gave the same
    moments when it kept them in two slots (Keras's `..._momentum`, `..._velocity`), whose
    values stacked on axis 1 are the slot's: how checkpoints written that way are read. None for
    any other name."""
    if not name.endswith(_MOMENTS):
        return None
    prefix = name[:-len(_MOMENTS)]
    return f"{prefix}_momentum", f"{prefix}_velocity"


@keras.saving.register_keras_serializable(package="tfscale")
class RowSparseAdam(DeclaresTableState, RowUpdates, FusedAdam):
    """FusedAdam whose tables' row gradients update only their rows. amsgrad updates tables
    whole.

    Args:
        *args: keras.optimizers.Adam's arguments (`learning_rate`, ...).
        catch_up: whether a row absent from batches is caught up with Adam's dense update when
            next seen (module docstring).
        catch_up_l2: the L2 that update pulls absent rows with (default `table_l2`; an optimizer
            that adds its tables' L2 to the batch's rows itself, as CowClip does before
            clipping, gives it here and no `table_l2`).
        **kwargs: `table_l2`, L2 on the tables (tfscale.optimizers.row_updates; 0 by default),
            and keras.optimizers.Adam's keyword arguments.

    Raises:
        ValueError: `table_l2` or `catch_up_l2` is negative or not finite.
        UserError: at `apply`, in a horovodrun job of two or more ranks, for gradients that
            tfscale's train step did not average (a plain keras.Model).
    """

    def __init__(self, *args, catch_up=True, catch_up_l2=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.catch_up = bool(catch_up)
        self.catch_up_l2 = self.table_l2 if catch_up_l2 is None else float(catch_up_l2)
        if not (math.isfinite(self.catch_up_l2) and self.catch_up_l2 >= 0):
            raise ValueError(f"`catch_up_l2={catch_up_l2}`: give a finite number of 0 or more")

    def updates_rows_in_place(self, variable):
        return not self.amsgrad and super().updates_rows_in_place(variable)

    def build(self, var_list):
        """Keras's Adam slots for the variables updated whole; one moments slot (and, with
        `catch_up`, a last-step slot) for each table updated by row.

        Args:
            var_list: the variables this optimizer will update."""
        if self.built:
            return
        if self.amsgrad:  # every variable updated whole
            super().build(var_list)
            self._moments, self._last_steps = [None] * len(var_list), [None] * len(var_list)
            return
        super(keras.optimizers.Adam, self).build(var_list)  # Keras's bookkeeping, not its slots
        self._momentums, self._velocities, self._moments = [], [], []
        for variable in var_list:
            by_row = self.updates_rows_in_place(variable)
            momentum, velocity = ([None], [None]) if by_row else self.add_optimizer_variables(
                [variable], ["momentum", "velocity"])
            self._momentums += momentum
            self._velocities += velocity
            self._moments.append(self.add_variable(
                shape=(variable.shape[0], 2, *variable.shape[1:]),
                dtype=arithmetic_dtype(variable.dtype),
                initializer=self.state_initializer(variable),
                name=f"{variable.path.replace('/', '_')}{_MOMENTS}") if by_row else None)
        self._last_steps = [self._last_step_slot(variable) for variable in var_list]

    def _last_step_slot(self, variable):
        """Per row of a table updated by row, the step that last updated it (0: none yet)."""
        if not (self.catch_up and self.updates_rows_in_place(variable)):
            return None
        return self.add_variable(shape=(variable.shape[0],), dtype="int32",
                                 initializer=self.state_initializer(variable),
                                 name=f"{variable.path.replace('/', '_')}_last_step")

    def table_state(self, table):
        """Per row: the moments (one slot when updated by row, Keras's slots otherwise) and,
        with `catch_up`, the last step (a fresh row's: the last applied step, so it has nothing
        to catch up).

        Args:
            table: an embedding table this optimizer was built on.

        Returns:
            A tfscale.optimizers.capabilities.TableState."""
        index = self._get_variable_index(table)
        moments, last_step = self._moments[index], self._last_steps[index]
        if moments is None:
            hats = (self._velocity_hats[index],) if self.amsgrad else ()
            return TableState(per_row=(self._momentums[index], self._velocities[index], *hats))
        if last_step is None:
            return TableState(per_row=(moments,))
        return TableState(per_row=(moments, last_step), fresh=(0, self.iterations))

    def update_step(self, gradient, variable, learning_rate):
        last_steps = self._last_steps[self._get_variable_index(variable)] if self.catch_up \
            else None
        if last_steps is not None and not isinstance(gradient, tf.IndexedSlices):
            # A dense update moves every row this step: none is behind.
            self.assign(last_steps, tf.fill(last_steps.shape, tf.cast(self.iterations + 1,
                                                                      tf.int32)))
        return super().update_step(gradient, variable, learning_rate)

    def update_whole(self, gradient, variable, learning_rate):
        moments = self._moments[self._get_variable_index(variable)]
        if moments is None:
            return super().update_whole(gradient, variable, learning_rate)
        # TF's ApplyAdam, on the moments slot read and written whole.
        dtype = variable.dtype
        gradient = tf.cast(gradient, dtype)
        beta_1, beta_2 = tf.cast(self.beta_1, dtype), tf.cast(self.beta_2, dtype)
        m, v = tf.unstack(tf.convert_to_tensor(moments), axis=1)
        m += (gradient - m) * (1 - beta_1)
        v += (tf.square(gradient) - v) * (1 - beta_2)
        self.assign(moments, tf.stack([m, v], axis=1))
        alpha = self._corrected_rate(tf.cast(learning_rate, dtype),
                                     tf.cast(self.iterations + 1, dtype))
        self.assign_sub(variable, alpha * m / (tf.sqrt(v) + tf.cast(self.epsilon, dtype)))

    def catch_up_every_row(self, block_rows=1 << 18):
        """Applies the pending catch-up to every row of every table this optimizer updates by
        row, `block_rows` rows at a time (module docstring); nothing without `catch_up`.

        Args:
            block_rows: the rows caught up at once (memory: a few copies of that many rows)."""
        if not (self.catch_up and self.built):
            return
        step_number = tf.cast(self.iterations, tf.int32)
        local_step = tf.cast(step_number + 1, tf.float32)
        for variable, last_steps in zip(self._trainable_variables, self._last_steps):
            if last_steps is None:
                continue
            index = self._get_variable_index(variable)
            dtype = arithmetic_dtype(variable.dtype)
            learning_rate = tf.cast(self._get_current_learning_rate(), dtype)
            rows = written_rows(variable)  # a dynamic table's: the rows handed out so far
            for start in range(0, rows, block_rows):
                ids = tf.range(start, min(start + block_rows, rows), dtype=tf.int64)
                self._catch_up_block(variable, index, last_steps, ids, step_number,
                                     tf.cast(local_step, dtype), learning_rate)

    def _catch_up_block(self, variable, index, last_steps, ids, step_number, local_step,
                        learning_rate):
        """Catches rows `ids` of `variable` up to the end of step `step_number` (the last
        applied)."""
        moments = self._moments[index]
        dtype = moments.dtype
        last = table_names.gather_rows(last_steps, ids, in_place=True)
        weight_rows, m_rows, v_rows = self._caught_up(
            tf.cast(table_names.gather_rows(variable, ids, in_place=True), dtype),
            *tf.unstack(table_names.gather_rows(moments, ids, in_place=True), axis=1),
            tf.cast(last, dtype)[:, None], local_step, learning_rate,
            tf.cast(self.epsilon, dtype))
        self.write_rows(variable, ids, weight_rows)
        self.assign(moments, tf.IndexedSlices(tf.stack([m_rows, v_rows], axis=1), ids))
        self.assign(last_steps, tf.IndexedSlices(tf.fill(tf.shape(ids), step_number), ids))

    def update_rows(self, variable, ids, gradient_rows, weight_rows, learning_rate):
        dtype = gradient_rows.dtype
        index = self._get_variable_index(variable)
        moments = self._moments[index]
        beta_1, beta_2 = tf.cast(self.beta_1, dtype), tf.cast(self.beta_2, dtype)
        epsilon = tf.cast(self.epsilon, dtype)
        step_number = tf.cast(self.iterations + 1, tf.int32)
        local_step = tf.cast(step_number, dtype)
        alpha = self._corrected_rate(learning_rate, local_step)

        m_rows, v_rows = tf.unstack(table_names.gather_rows(moments, ids, in_place=True), axis=1)
        if self.catch_up:
            last_steps = self._last_steps[index]
            last = tf.cast(table_names.gather_rows(last_steps, ids, in_place=True), dtype)[:, None]
            weight_rows, m_rows, v_rows = self._caught_up(
                weight_rows, m_rows, v_rows, last, local_step, learning_rate, epsilon)
            self.assign(last_steps, tf.IndexedSlices(
                tf.fill(tf.shape(ids), step_number), ids))
        gradient_rows = self.with_table_l2(gradient_rows, weight_rows)

        m_rows = beta_1 * m_rows + (1 - beta_1) * gradient_rows
        v_rows = beta_2 * v_rows + (1 - beta_2) * tf.square(gradient_rows)
        self.assign(moments, tf.IndexedSlices(tf.stack([m_rows, v_rows], axis=1), ids))
        step = alpha * m_rows / (tf.sqrt(v_rows) + epsilon)
        # Read, subtract, write back: TensorFlow's CPU scatter-subtract costs several times a
        # gather plus a scatter-assign of the same rows (the same subtraction, bitwise).
        self.write_rows(variable, ids, weight_rows - step)

    def _caught_up(self, weight_rows, m_rows, v_rows, last, local_step, learning_rate, epsilon):
        """Rows, first and second moments after the steps from `last` ([n, 1], the step that
        last updated each row) to step `local_step` (excluded) of Adam with no data gradient
        (module docstring)."""
        dtype = weight_rows.dtype
        beta_1, beta_2 = tf.cast(self.beta_1, dtype), tf.cast(self.beta_2, dtype)
        alpha = self._corrected_rate(learning_rate, local_step)
        skipped = local_step - 1 - last
        root_v = tf.sqrt(v_rows)
        # The first moment's tail: sum over j = 1..skipped of alpha_j * beta_1**j m /
        # (sqrt(beta_2**j v) + eps) ~ alpha_1 * m / (sqrt(v) + eps) * sum r**j, with alpha_1 the
        # bias-corrected rate of the first skipped step (the tail is spent within tens of steps).
        alpha_1 = self._corrected_rate(learning_rate, last + 1)
        ratio = beta_1 / tf.sqrt(beta_2)
        tail = -ratio * _power_minus_1(ratio, skipped) / (1 - ratio)
        weight_rows -= alpha_1 * m_rows / (root_v + epsilon) * tail
        if self.catch_up_l2:
            # The L2's pull, alpha * 2 * l2 * w / (sqrt(beta_2**j v) + eps) a step, with v the
            # row's mean second moment (one value a row keeps the logs and powers off [n, dim]):
            # the sum of 1 / (sqrt(v) q**-j + eps) (q = beta_2**-1/2), taken as q**j / sqrt(v)
            # while that is below 1 / eps (n steps) and 1 / eps after.
            root_v_row = tf.sqrt(tf.reduce_mean(v_rows, axis=1, keepdims=True))
            q = 1 / tf.sqrt(beta_2)
            below = tf.math.log(tf.maximum(root_v_row, epsilon) / epsilon) / tf.math.log(q)
            n = tf.minimum(tf.floor(below), skipped)
            pull = (q * _power_minus_1(q, n) / (q - 1) / tf.maximum(root_v_row, epsilon)
                    + (skipped - n) / epsilon)
            weight_rows *= tf.exp(-alpha * 2 * self.catch_up_l2 * pull)
        return (weight_rows, tf.exp(skipped * tf.math.log(beta_1)) * m_rows,
                tf.exp(skipped * tf.math.log(beta_2)) * v_rows)

    def _corrected_rate(self, learning_rate, local_step):
        """Adam's bias-corrected learning rate at step `local_step` (1-based; a tensor of the
        rate's dtype, any shape)."""
        dtype = learning_rate.dtype
        beta_1, beta_2 = tf.cast(self.beta_1, dtype), tf.cast(self.beta_2, dtype)
        return learning_rate * tf.sqrt(-_power_minus_1(beta_2, local_step)) / (
            -_power_minus_1(beta_1, local_step))

    def get_config(self):
        return {**super().get_config(), "catch_up": self.catch_up,
                "catch_up_l2": self.catch_up_l2}


def _power_minus_1(base, exponent):
    """base ** exponent - 1 for a scalar `base` > 0 and a tensor `exponent`, as
    expm1(exponent * log(base)): TensorFlow's CPU Pow is an element-wise std::pow, many times
    the cost of Expm1, and the catch-up takes several a row; expm1 also keeps 1 - beta ** t exact
    to float rounding where it is small (Adam's first steps)."""
    return tf.math.expm1(exponent * tf.math.log(base))
