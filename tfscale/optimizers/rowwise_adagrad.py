"""`RowWiseAdagrad`: row-wise Adagrad for embedding tables, FBGEMM's EXACT_ROWWISE_ADAGRAD (what
TorchRec and the MLPerf DLRM-DCNv2 reference train their tables with): one accumulator a row
instead of one a value, so a table of width d keeps 4 bytes of optimizer state a row, not 4 d
(Adam: 8 d + 4). For row i of a table, given its gradient g_i summed over its occurrences in the
global batch (plus the tables' L2, 2 * table_l2 * w_i):

    a_i <- a_i + mean_j(g_ij ** 2)                         (j over the row's d values)
    w_i <- w_i - learning_rate * g_i / (sqrt(a_i) + epsilon)

epsilon outside the root, as FBGEMM has it. A row absent from the batch has g_i = 0 and is left
unchanged by this update, so updating the batch's rows only (tfscale.optimizers.row_updates) is
exactly row-wise Adagrad on the densified gradient; a dense gradient of a table (the `dense`
exchange) takes the same formula over every row. Every other variable (dense weights) takes Keras's
element-wise Adagrad; tfscale's launcher gives them their own optimizer instead."""

import keras
import tensorflow as tf

from tfscale.embedding import table_names
from tfscale.embedding.table_dtypes import arithmetic_dtype
from tfscale.optimizers.row_sparse_adagrad import RowSparseAdagrad


@keras.saving.register_keras_serializable(package="tfscale")
class RowWiseAdagrad(RowSparseAdagrad):
    """Row-wise Adagrad (module docstring): one float32 accumulator a row of each table, which
    starts at `initial_accumulator_value` (RowSparseAdagrad's per-value accumulator, shared by
    the row).

    Args:
        learning_rate: the tables' learning rate (a float or a Keras schedule).
        initial_accumulator_value: where each row's accumulator starts (FBGEMM: 0).
        epsilon: added to the accumulator's root in the denominator.
        **kwargs: `table_l2` and `rounding_seed` (tfscale.optimizers.row_updates) and
            keras.optimizers.Adagrad's keyword arguments (`name`, `clipnorm`, ...).

    Raises:
        ValueError: `table_l2` is negative or not finite.
        UserError: at `apply`, in a job of two or more ranks, for gradients that tfscale's
            train step did not average (a plain keras.Model).

    Example:
        ```python
        optimizer_map = keras.optimizers.OptimizerMap(keras.optimizers.Adam(1e-3))  # dense
        optimizer_map[r".*/embeddings"] = tfscale.optimizers.RowWiseAdagrad(0.01)  # tables
        model.compile(optimizer=keras.optimizers.MultiOptimizer(optimizer_map),
                      loss="binary_crossentropy")
        ```
    """

    def __init__(self, learning_rate=0.01, initial_accumulator_value=0.0, epsilon=1e-8,
                 **kwargs):
        super().__init__(learning_rate=learning_rate,
                         initial_accumulator_value=initial_accumulator_value, epsilon=epsilon,
                         **kwargs)

    def build(self, var_list):
        """One accumulator a row ([rows]) for each table updated by row; Keras's element-wise
        accumulator for every other variable.

        Args:
            var_list: the variables this optimizer will update."""
        if self.built:
            return
        super(keras.optimizers.Adagrad, self).build(var_list)  # Keras's bookkeeping, not its slots
        start = keras.initializers.Constant(self.initial_accumulator_value)
        self._accumulators = [
            self.add_variable(shape=(variable.shape[0],), dtype=arithmetic_dtype(variable.dtype),
                              initializer=self.state_initializer(variable, start),
                              name=f"{variable.path.replace('/', '_')}_row_accumulator")
            if self.updates_rows_in_place(variable)
            else self.add_variable_from_reference(variable, "accumulator", initializer=start)
            for variable in var_list]

    def update_rows(self, variable, ids, gradient_rows, weight_rows, learning_rate):
        gradient_rows = self.with_table_l2(gradient_rows, weight_rows)
        accumulator = self._accumulators[self._get_variable_index(variable)]
        accumulated = (table_names.gather_rows(accumulator, ids, in_place=True)
                       + tf.reduce_mean(tf.square(gradient_rows), axis=1))
        self.assign(accumulator, tf.IndexedSlices(accumulated, ids))
        self.write_rows(variable, ids, weight_rows - self._scaled(
            gradient_rows, accumulated, learning_rate))

    def update_whole(self, gradient, variable, learning_rate):
        if not self.updates_rows_in_place(self._built_on(variable)):
            return super().update_whole(gradient, variable, learning_rate)
        accumulator = self._accumulators[self._get_variable_index(variable)]
        gradient = tf.cast(gradient, variable.dtype)
        accumulated = tf.convert_to_tensor(accumulator) + tf.reduce_mean(tf.square(gradient),
                                                                         axis=1)
        self.assign(accumulator, accumulated)
        self.assign_sub(variable, self._scaled(gradient, accumulated,
                                               tf.cast(learning_rate, variable.dtype)))

    def _scaled(self, gradient_rows, accumulated, learning_rate):
        """learning_rate * g_i / (sqrt(a_i) + epsilon), row by row."""
        denominator = tf.sqrt(accumulated) + tf.cast(self.epsilon, accumulated.dtype)
        return learning_rate * gradient_rows / denominator[:, None]
