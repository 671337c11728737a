"""`RowSparseCAME`: CAME (tfscale.optimizers.came, docs/came.md) for embedding tables updated by
row: given a table's row gradient, a step reads and writes only the batch's rows of the table and
of its per-row state, so it costs O(rows in the batch) instead of O(table rows). Every other
variable, or a dense gradient of another variable, takes CAME's own update. Keras has no
row-sparse optimizer update, and CAME's factored statistics span every row of a table, so the
row update is a variant of the algorithm, written here.

A table [rows, dim] is a matrix: its state is the first moment [rows, dim], the squared
gradient's row and column statistics r [rows] and c [dim], and the instability's R [rows] and
C [dim]. The per-row part is one slot, `<table>_momentum_and_rows` of shape [rows, dim + 2]
(`[:, :dim]` the first moment, `[:, dim]` r, `[:, dim + 1]` R), gathered and scattered once a
step; c and C stay whole. A step, for the batch's distinct rows B (their summed gradients g,
with the tables' L2):

1. r_B and R_B move as CAME's rows do; c and C move toward the column means over B's rows
   only (the rows absent from the step have no gradient to average);
2. the factored estimates are r_i c_j / mean_j(c) and R_i C_j / mean_j(C), where the paper
   divides by mean_i(r) and mean_i(R), which would need every row;
3. the update's RMS clip is over B's rows.

Why 2 is CAME when every row is in every step: r_i is the running mean over columns of row i's
squared gradient G, and c_j the running mean over rows of column j's, both from 0 with the same
beta, so mean_i(r_i) and mean_j(c_j) are the same running mean of mean_ij(G); likewise R and C
for the instability. Then the estimates equal the paper's (tests/test_row_sparse_came.py checks
it against came-pytorch). With some rows absent, c_j / mean_j(c) is the column profile of the
batch's rows, which the number of rows averaged does not change, while mean_i(r) over the batch's
rows would follow whichever rows came.

Rows absent from a step are untouched, weights and state: no catch-up of the momentum's tail or
of decaying statistics (dense CAME keeps moving a row by its momentum while it is absent).
`embedding_update="dense"` in tfscale.optimizers.factory is the paper's CAME on every row.

A row-sharded table (tfscale.embedding.row_sharding) holds 1/P of the rows on each rank: the
column sums of the batch's rows and their count, the update's sum of squares, and the
instability's column sums are summed over the shards (three allreduces, of dim + 1 values, one
and dim), so P ranks take the step one process takes."""

import keras
import tensorflow as tf

from tfscale import distributed
from tfscale.embedding import table_names
from tfscale.embedding.table import shard_of
from tfscale.optimizers.came import CAME
from tfscale.optimizers.capabilities import TableState
from tfscale.optimizers.row_updates import RowUpdates


@keras.saving.register_keras_serializable(package="tfscale")
class RowSparseCAME(RowUpdates, CAME):
    """CAME whose tables' row gradients update only their rows (module docstring).

    Args:
        *args: tfscale.optimizers.CAME's arguments (`learning_rate`, ...).
        table_l2: L2 on the tables' rows a batch touches (tfscale.optimizers.row_updates; 0 by
            default). Keras's `weight_decay` spares the tables.
        **kwargs: tfscale.optimizers.CAME's keyword arguments.

    Raises:
        ValueError: `table_l2` is negative or not finite.
        UserError: at `apply`, in a horovodrun job of two or more ranks, for gradients that
            tfscale's train step did not average (a plain keras.Model).

    Example:
        ```python
        model.compile(optimizer=tfscale.optimizers.RowSparseCAME(1e-3), loss="binary_crossentropy")
        ```
    """

    def build(self, var_list):
        """CAME's state for the variables updated whole; for each table updated by row, the
        per-row slot and the two column statistics (module docstring).

        Args:
            var_list: the variables this optimizer will update."""
        if self.built:
            return
        self._row_states = []
        super().build(var_list)

    def _build_state(self, variable):
        if not self.updates_rows_in_place(variable):
            self._row_states.append(None)
            return super()._build_state(variable)
        rows, dim = variable.shape
        self._row_states.append(self._add_state(
            variable, (rows, dim + 2), "momentum_and_rows", self.state_initializer(variable)))
        for slots in (self._momentums, self._velocities, self._rows, self._instability_rows):
            slots.append(None)
        self._columns.append(self._add_state(variable, (dim,), "column"))
        self._instability_columns.append(self._add_state(variable, (dim,), "instability_column"))

    def table_state(self, table):
        """Per row: the momentum and row statistics (one slot when updated by row); whole: the
        column statistics (summed over the shards in the step).

        Args:
            table: an embedding table this optimizer was built on.

        Returns:
            A tfscale.optimizers.capabilities.TableState."""
        index = self._get_variable_index(table)
        if self._row_states[index] is None:
            return super().table_state(table)
        return TableState(per_row=(self._row_states[index],),
                          whole=(self._columns[index], self._instability_columns[index]))

    def update_rows(self, variable, ids, gradient_rows, weight_rows, learning_rate):
        self._step_rows(variable, ids, self.with_table_l2(gradient_rows, weight_rows),
                        weight_rows, learning_rate)

    def update_whole(self, gradient, variable, learning_rate):
        if self._row_states[self._get_variable_index(variable)] is None:
            return super().update_whole(gradient, variable, learning_rate)
        # A dense gradient of a table updated by row (the `dense` exchange): every row is in
        # the step, so this is CAME on the whole table.
        ids = tf.range(variable.shape[0], dtype=tf.int64)
        self._step_rows(variable, ids, gradient, tf.convert_to_tensor(variable), learning_rate)

    def _step_rows(self, variable, ids, gradient_rows, weight_rows, learning_rate):
        """One step of rows `ids` of table `variable` given their summed gradients (the tables'
        L2 in them) and current values (module docstring, 1-3)."""
        index = self._get_variable_index(variable)
        state = self._row_states[index]
        dtype = state.dtype
        dim = int(variable.shape[1])
        batch = _BatchRows(shard_of(variable), f"{self.name}_{index}")
        gradient = tf.cast(gradient_rows, dtype)
        held = table_names.gather_rows(state, ids, in_place=True)
        momentum, row, instability_row = held[:, :dim], held[:, dim], held[:, dim + 1]

        squared = tf.square(gradient) + self.epsilon_1
        row = self.beta_2 * row + (1 - self.beta_2) * tf.reduce_mean(squared, axis=1)
        means, count = batch.column_means_and_count(squared, "squares")
        column = self._column_ema(self._columns[index], means, self.beta_2, count)
        update = gradient * _factored_rsqrt(row, column)
        update = update / tf.maximum(batch.rms(update, count) / self.clip_threshold, 1.0)
        momentum = self.beta_1 * momentum + (1 - self.beta_1) * update
        instability = tf.square(update - momentum) + self.epsilon_2
        instability_row = (self.beta_3 * instability_row
                           + (1 - self.beta_3) * tf.reduce_mean(instability, axis=1))
        instability_column = self._column_ema(
            self._instability_columns[index], batch.column_means(instability, count,
                                                                 "instability"),
            self.beta_3, count)
        step = tf.cast(learning_rate, dtype) * momentum * _factored_rsqrt(
            instability_row, instability_column)

        self.assign(state, tf.IndexedSlices(
            tf.concat([momentum, row[:, None], instability_row[:, None]], axis=1), ids))
        self.write_rows(variable, ids, weight_rows - tf.cast(step, weight_rows.dtype))

    def _column_ema(self, columns, means, beta, count):
        """Assigns `beta * columns + (1 - beta) * means` to `columns` and returns it; unchanged
        in a step with none of the table's rows (`count` 0)."""
        updated = tf.where(count > 0, beta * columns + (1 - beta) * means,
                           tf.convert_to_tensor(columns))
        self.assign(columns, updated)
        return updated


def _factored_rsqrt(row, column):
    """1 / sqrt(row_i column_j / mean_j(column)) for rows [n] and columns [m]: [n, m]."""
    return (tf.math.rsqrt(row)[:, None]
            * tf.math.rsqrt(column / tf.reduce_mean(column))[None, :])


class _BatchRows:
    """Sums over a step's rows of a table: over this process's rows, or, for a row shard under
    Horovod, over every rank's (allreduced under names that start with `name`)."""

    def __init__(self, shard, name):
        self._shard = shard if shard is not None and distributed.is_active() else None
        self._name = name

    def column_means_and_count(self, values, name):
        """The mean of `values` [rows here, m] over the step's rows (zeros without rows), and
        the number of those rows (a scalar of `values`' dtype), in one sum over the shards."""
        sums = tf.concat([tf.reduce_sum(values, axis=0),
                          tf.cast(tf.shape(values)[:1], values.dtype)], axis=0)
        if self._shard is not None:
            sums = self._sum_over_shards(sums, name)
        count = sums[-1]
        return sums[:-1] / tf.maximum(count, 1), count

    def column_means(self, values, count, name):
        """The mean of `values` [rows here, m] over the step's `count` rows."""
        sums = tf.reduce_sum(values, axis=0)
        if self._shard is not None:
            sums = self._sum_over_shards(sums, name)
        return sums / tf.maximum(count, 1)

    def rms(self, update, count):
        """The root mean square of `update` [rows here, m] over the step's `count` rows."""
        total = tf.reduce_sum(tf.square(update))
        if self._shard is not None:
            total = self._sum_over_shards(total, "rms")
        return tf.sqrt(total / tf.maximum(count * int(update.shape[1]), 1))

    def _sum_over_shards(self, value, name):
        return distributed.allreduce_sum(value, f"tfscale_row_came_{self._name}_{name}")
