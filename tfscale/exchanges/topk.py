"""The "topk" and "gtopk" exchanges: each table's gradient top-k sparsified with exact error
feedback (docs/gtopk.md, steps 1-5).

Per step and per selected variable (every embedding table; with `dense_gradients=True` every
other trainable variable too, element-wise), on each rank:
  A = residual + gradient / loss scale;
  candidates = the k rows of A of largest L2 norm (k = ceil(density * rows); element-wise for
  dense variables), zero rows left out;
  (indices, sums, mask) = the collective of the candidates: gtopk_allreduce ("gtopk") or
  topk_allgather ("topk") (tfscale.distributed.topk);
  residual = A with the candidates in `mask` zeroed;
  gradient applied = sums / P at those indices (times the loss scale, which the optimizer's
  loss scaler then divides out again), zero elsewhere.
Other gradients are averaged as the allgather exchange does. Sparsification happens in a single
process too.

A step whose accumulators hold inf or NaN on any rank (one extra 4-byte allreduce) leaves every
residual unchanged and hands the optimizer NaN gradients, which a loss scaler skips on every rank
(without a scaler the run's NonFiniteGuard stops it).

Residuals belong to each rank: `TopKResiduals`, float32 variables of the selected variables'
shapes, which checkpoints keep per rank. They are the known exception to "a step's cost follows
the batch": each step passes over every row of them (the add, the finite check, the row norms,
top_k, the scatter and the assignment), and error feedback leaves a nonzero residual in every row
a batch touched and top-k did not send, so a row-sparse residual would soon hold the whole table
(docs/gtopk.md, measured in docs/results/table_scaling.md). `describe_residuals` states their
size. Summed rows carry no per-id counts (not for CowClip), and delayed rows do not fit the error
feedback (no staleness)."""

import abc

import numpy as np
import tensorflow as tf

from tfscale import distributed
from tfscale.distributed import topk
from tfscale.distributed.per_rank import PerRankState
from tfscale.embedding.strategies import is_table
from tfscale.embedding.table_dtypes import arithmetic_dtype
from tfscale.exchanges.allgather import AllgatherExchange
from tfscale.exchanges.base import SynchronousExchange, loss_scale

DEFAULT_DENSITY = 0.001


class TopKResiduals(PerRankState):
    """Each selected variable's error-feedback residual (zeros at first), by variable path."""

    def __init__(self, is_selected):
        self._is_selected = is_selected
        self.residuals = {}

    def build(self, variables):
        with tf.init_scope():
            for variable in variables:
                if self._is_selected(variable) and variable.path not in self.residuals:
                    self.residuals[variable.path] = tf.Variable(
                        tf.zeros(variable.shape, tf.float32), trainable=False,
                        name=f"residual/{variable.path.replace('/', '.')}")

    def per_rank_variables(self):
        return {f"residual/{path}": residual for path, residual in self.residuals.items()}


class TopKExchange(SynchronousExchange):
    """Top-k sparsified exchange with error feedback; subclasses choose the collective.

    Args:
        density: fraction of each variable's rows (elements for dense variables) kept per step.
        warmup_density: the density of the first `warmup_steps` optimizer steps (the reference
            uses 0.004 for the first epoch, then 0.001); None for no warm-up.
        warmup_steps: optimizer steps at `warmup_density`.
        dense_gradients: also sparsify the non-embedding gradients, element-wise.

    Raises:
        ValueError: `density` or `warmup_density` is not in (0, 1], or `warmup_steps` is
            negative.

    Example:
        ```python
        exchange = tfscale.exchanges.GTopKExchange(density=0.001, warmup_density=0.004,
                                                   warmup_steps=1000)
        ```
    """

    acts_in_one_process = True

    def __init__(self, density=DEFAULT_DENSITY, warmup_density=None, warmup_steps=0,
                 dense_gradients=False):
        super().__init__()
        for label, value in (("density", density), ("warmup_density", warmup_density)):
            if value is not None and not 0.0 < value <= 1.0:
                raise ValueError(f"`{label}={value}`: give a fraction in (0, 1]")
        if warmup_steps < 0:
            raise ValueError(f"`warmup_steps={warmup_steps}`: give 0 or more steps")
        self.density = float(density)
        self.warmup_density = None if warmup_density is None else float(warmup_density)
        self.warmup_steps = int(warmup_steps) if warmup_density is not None else 0
        self.dense_gradients = bool(dense_gradients)
        self.state = TopKResiduals(self.is_selected)
        self._others = AllgatherExchange()

    @property
    def residuals(self):
        """{variable path: residual tf.Variable} once built."""
        return self.state.residuals

    def __repr__(self):
        warmup = (f", {self.warmup_density:g} for the first {self.warmup_steps} steps"
                  if self.warmup_steps else "")
        return f"{self.name} at density {self.density:g}{warmup}"

    def per_rank_states(self):
        return [self.state]

    def describe_residuals(self, variables):
        """One line on the residuals this rank keeps for `variables` (a model's trainable
        variables), built or not: the selected tables' rows and every residual's megabytes.

        Args:
            variables: a model's trainable variables.

        Returns:
            A str."""
        selected = [v for v in variables if self.is_selected(v)]
        rows = sum(int(v.shape[0]) for v in selected if is_table(v))
        megabytes = sum(int(np.prod(v.shape)) for v in selected) * 4 / 1e6
        return (f"{self.name} error-feedback residuals: {rows:,} table rows, {megabytes:,.1f} MB "
                "float32 per rank, every row passed over each step")

    def is_selected(self, variable):
        """Whether `variable`'s gradient is top-k sparsified (rows for embedding tables).

        Args:
            variable: one of the model's trainable variables.

        Returns:
            True for an embedding table, and for any variable with `dense_gradients`."""
        return is_table(variable) or self.dense_gradients

    def density_at(self, step):
        """The density of optimizer step `step`.

        Args:
            step: the optimizer's step, an int or integer scalar tensor.

        Returns:
            A float64 scalar tensor: `warmup_density` before `warmup_steps`, else `density`."""
        if not self.warmup_steps:
            return tf.constant(self.density, tf.float64)
        return tf.where(tf.cast(step, tf.int64) < self.warmup_steps,
                        tf.constant(self.warmup_density, tf.float64),
                        tf.constant(self.density, tf.float64))

    def exchange(self, gradients, variables, optimizer):
        applied, sent, received = self.sparsify(gradients, variables, optimizer.iterations,
                                                loss_scale(optimizer, variables))
        self.scalars.record("exchange/bytes_sent", sent)
        self.scalars.record("exchange/bytes_received", received)
        return applied

    def sparsify(self, gradients, variables, step, scale=None):
        """`gradients` averaged over the ranks, the selected ones sparsified as the module says.

        Args:
            gradients: this rank's gradients, aligned with `variables` (None for unconnected
                ones).
            variables: the model's trainable variables.
            step: the optimizer's step (for the density warm-up).
            scale: the factor the gradients carry (a loss scale); None: 1.

        Returns:
            (gradients averaged over the ranks, bytes sent, bytes received), the byte counts
            float64 scalar tensors."""
        self.state.build(variables)
        num_ranks = distributed.size()
        scale = tf.constant(1.0, tf.float32) if scale is None else tf.cast(scale, tf.float32)
        chosen = [i for i, (g, v) in enumerate(zip(gradients, variables))
                  if g is not None and self.is_selected(v)]
        others = [None if i in chosen else g for i, g in enumerate(gradients)]
        sent = received = tf.constant(0.0, tf.float64)
        if distributed.is_active():
            one_way = self._others.modelled_bytes(
                others, num_ranks, distributed.gradient_compression_name()) / 2
            sent, received = sent + one_way, received + one_way
            others = self._others.average(others)
        if not chosen:
            return others, sent, received
        residuals = self.state.residuals
        accumulators = {i: residuals[variables[i].path] +
                        tf.cast(tf.convert_to_tensor(gradients[i]), tf.float32) / scale
                        for i in chosen}
        finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(a))
                                for a in accumulators.values()])
        finite = distributed.true_on_every_rank(finite, "tfscale_topk_finite")
        density = self.density_at(step)
        # NaN gradients make the loss scaler skip the step on every rank.
        step_factor = tf.where(finite, scale, tf.constant(float("nan"), tf.float32))
        result = list(others)
        for i in chosen:
            variable = variables[i]
            applied, residual, sent_now, received_now = self._sparsify(
                accumulators[i], variable, density, num_ranks)
            sent, received = sent + sent_now, received + received_now
            dtype = arithmetic_dtype(variable.dtype)  # a half-precision table's: float32
            if isinstance(applied, tf.IndexedSlices):
                applied = tf.IndexedSlices(tf.cast(applied.values * step_factor, dtype),
                                           applied.indices, applied.dense_shape)
            else:
                applied = tf.cast(applied * step_factor, dtype)
            result[i] = applied
            stored = residuals[variable.path]
            stored.assign(tf.where(finite, residual, stored))
        return result, sent, received

    def _sparsify(self, accumulator, variable, density, num_ranks):
        """(mean gradient to apply, new residual, bytes sent, bytes received) of one variable."""
        rows_mode = is_table(variable)
        rows = accumulator if rows_mode else tf.reshape(accumulator, [-1])
        count = rows.shape[0]
        k = tf.cast(tf.math.ceil(density * count), tf.int32)
        k = tf.clip_by_value(k, 1, count)
        magnitude = tf.norm(rows, axis=1) if rows_mode else tf.abs(rows)
        top = tf.math.top_k(magnitude, k=k, sorted=True)  # ties: the lower index first
        nonzero = top.values > 0
        indices = tf.cast(tf.boolean_mask(top.indices, nonzero), tf.int64)
        values = tf.gather(rows, indices)
        summed = self._collective(indices, values, k,
                                  f"tfscale_{self.name}_{variable.path.replace('/', '_')}")
        reached = tf.boolean_mask(indices, summed.mask)
        zeros = tf.zeros_like(tf.gather(rows, reached))
        residual = tf.tensor_scatter_nd_update(rows, reached[:, None], zeros)
        mean = summed.values / num_ranks
        if rows_mode:
            applied = tf.IndexedSlices(mean, summed.indices, tf.shape(rows, out_type=tf.int64))
        else:
            applied = tf.reshape(tf.scatter_nd(summed.indices[:, None], mean,
                                               tf.shape(rows, out_type=tf.int64)),
                                 variable.shape)
        return applied, tf.reshape(residual, variable.shape), summed.bytes_sent, \
            summed.bytes_received

    @abc.abstractmethod
    def _collective(self, indices, values, k, name):
        """The tfscale.distributed.topk.SparseSum of every rank's candidates."""


class TopKAllgatherExchange(TopKExchange):
    """"topk": every rank's top-k candidates allgathered and summed (bytes grow with P).

    Args:
        density: fraction of each variable's rows (elements for dense variables) kept per step.
        warmup_density: the density of the first `warmup_steps` optimizer steps; None: none.
        warmup_steps: optimizer steps at `warmup_density`.
        dense_gradients: also sparsify the non-embedding gradients, element-wise.

    Raises:
        ValueError: `density` or `warmup_density` is not in (0, 1], or `warmup_steps` is
            negative.

    Example:
        ```python
        model.compile(optimizer=tfscale.optimizers.RowSparseAdam(1e-3), loss="binary_crossentropy",
                      embedding_exchange="topk")  # or TopKAllgatherExchange(density=0.01)
        ```
    """

    name = "topk"

    def _collective(self, indices, values, k, name):
        return topk.topk_allgather(indices, values, name)


class GTopKExchange(TopKExchange):
    """"gtopk": the global top-k of the sum in log2(P) pairwise rounds (gTop-k's butterfly).

    Args:
        density: fraction of each variable's rows (elements for dense variables) kept per step.
        warmup_density: the density of the first `warmup_steps` optimizer steps; None: none.
        warmup_steps: optimizer steps at `warmup_density`.
        dense_gradients: also sparsify the non-embedding gradients, element-wise.

    Raises:
        ValueError: `density` or `warmup_density` is not in (0, 1], or `warmup_steps` is
            negative.

    Example:
        ```python
        model.compile(optimizer=tfscale.optimizers.RowSparseAdam(1e-3), loss="binary_crossentropy",
                      embedding_exchange=tfscale.exchanges.GTopKExchange(density=0.01))
        ```
    """

    name = "gtopk"

    def _collective(self, indices, values, k, name):
        return topk.gtopk_allreduce(indices, values, k, name)
