"""Top-k sparsified exchange of embedding gradients with exact error feedback
(../shared/docs/gtopk.md, steps 1-5), the "topk" and "gtopk" embedding exchanges.

Per step and per selected variable (every embedding table by default; with
`dense_gradients=True` every other trainable variable too, element-wise), on each rank:
  A = residual + gradient / loss scale;
  candidates = the k rows of A of largest L2 norm (k = ceil(density * rows); element-wise for
  dense variables), zero rows left out;
  (indices, sums, mask) = gtopk_allreduce (or topk_allgather) of the candidates;
  residual = A with the candidates in `mask` zeroed;
  gradient applied = sums / P at those indices (times the loss scale, which the optimizer's
  loss scaler then divides out again), zero elsewhere.
Other gradients are averaged as with the "allgather" exchange (tfscale.distributed.gradients).

A step whose accumulators hold inf or NaN on any rank (one extra 4-byte allreduce) leaves every
residual unchanged and hands the optimizer NaN gradients, which a loss scaler skips on every rank
(without a scaler the run's NonFiniteGuard stops it).

Residuals belong to each rank (they differ between ranks) and are float32 tf.Variables of the
variables' shapes, held here and not in the model: `per_rank_variables()` is what a checkpoint
gathers from every rank (tfscale.checkpoints)."""

import tensorflow as tf

from tfscale import embeddings
from tfscale.distributed import runtime, topk, traffic
from tfscale.distributed.gradients import exchange_gradients

TOPK_EXCHANGES = ("topk", "gtopk")
DEFAULT_DENSITY = 0.001


class TopKExchange:
    """The "topk" (allgather of each rank's top k) or "gtopk" (global top-k butterfly) embedding
    gradient exchange with error feedback.

    Args:
        method: "topk" or "gtopk".
        density: fraction of each variable's rows (elements for dense variables) kept per step.
        warmup_density: the density of the first `warmup_steps` optimizer steps (the reference
            uses 0.004 for the first epoch, then 0.001); None for no warm-up.
        warmup_steps: optimizer steps at `warmup_density`.
        dense_gradients: also sparsify the non-embedding gradients, element-wise.
    """

    def __init__(self, method="gtopk", density=DEFAULT_DENSITY, warmup_density=None,
                 warmup_steps=0, dense_gradients=False):
        if method not in TOPK_EXCHANGES:
            raise ValueError(f"method must be one of {TOPK_EXCHANGES}, got {method!r}")
        for label, value in (("density", density), ("warmup_density", warmup_density)):
            if value is not None and not 0.0 < value <= 1.0:
                raise ValueError(f"{label} must be in (0, 1], got {value}")
        if warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
        self.method = method
        self.density = float(density)
        self.warmup_density = None if warmup_density is None else float(warmup_density)
        self.warmup_steps = int(warmup_steps) if warmup_density is not None else 0
        self.dense_gradients = bool(dense_gradients)
        self.residuals = {}  # variable path -> residual tf.Variable

    def __repr__(self):
        warmup = (f", {self.warmup_density:g} for the first {self.warmup_steps} steps"
                  if self.warmup_steps else "")
        return f"{self.method} at density {self.density:g}{warmup}"

    def is_selected(self, variable):
        """Whether `variable`'s gradient is top-k sparsified (rows for embedding tables)."""
        return embeddings.is_row_table(variable) or self.dense_gradients

    def build(self, variables):
        """Creates the zero residuals of the selected variables among `variables` (once)."""
        with tf.init_scope():
            for variable in variables:
                if self.is_selected(variable) and variable.path not in self.residuals:
                    self.residuals[variable.path] = tf.Variable(
                        tf.zeros(variable.shape, tf.float32), trainable=False,
                        name=f"residual/{variable.path.replace('/', '.')}")

    def per_rank_variables(self):
        """{name: residual}: each rank's own state, for checkpoints."""
        return {f"residual/{path}": residual for path, residual in self.residuals.items()}

    def density_at(self, step):
        """The density of optimizer step `step` (a scalar tensor)."""
        if not self.warmup_steps:
            return tf.constant(self.density, tf.float64)
        return tf.where(tf.cast(step, tf.int64) < self.warmup_steps,
                        tf.constant(self.warmup_density, tf.float64),
                        tf.constant(self.density, tf.float64))

    def exchange(self, gradients, variables, step, loss_scale=None):
        """(gradients averaged over ranks, bytes sent, bytes received) for `gradients` aligned
        with `variables`; the selected ones are sparsified as the module says. `step` is the
        optimizer's step (for the density warm-up), `loss_scale` the factor the gradients carry
        (None: 1)."""
        self.build(variables)
        num_ranks = runtime.size()
        scale = tf.constant(1.0, tf.float32) if loss_scale is None \
            else tf.cast(loss_scale, tf.float32)
        chosen = [i for i, (g, v) in enumerate(zip(gradients, variables))
                  if g is not None and self.is_selected(v)]
        others = [None if i in chosen else g for i, g in enumerate(gradients)]
        sent = received = tf.constant(0.0, tf.float64)
        if runtime.is_active():
            one_way = traffic.exchange_bytes(others, num_ranks, "allgather",
                                             runtime.gradient_compression_name()) / 2
            sent, received = sent + one_way, received + one_way
            others = exchange_gradients(others, "allgather")
        if not chosen:
            return others, sent, received
        accumulators = {i: self.residuals[variables[i].path] +
                        tf.cast(tf.convert_to_tensor(gradients[i]), tf.float32) / scale
                        for i in chosen}
        finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(a))
                                for a in accumulators.values()])
        if runtime.is_active():
            hvd = runtime.horovod()
            finite = hvd.allreduce(tf.cast(finite, tf.float32), op=hvd.Min,
                                   name="tfscale_topk_finite") > 0.5
        density = self.density_at(step)
        # NaN gradients make the loss scaler skip the step on every rank.
        step_factor = tf.where(finite, scale, tf.constant(float("nan"), tf.float32))
        result = list(others)
        for i in chosen:
            variable = variables[i]
            applied, residual, sent_now, received_now = self._sparsify(
                accumulators[i], variable, density, num_ranks)
            sent, received = sent + sent_now, received + received_now
            if isinstance(applied, tf.IndexedSlices):
                applied = tf.IndexedSlices(tf.cast(applied.values * step_factor, variable.dtype),
                                           applied.indices, applied.dense_shape)
            else:
                applied = tf.cast(applied * step_factor, variable.dtype)
            result[i] = applied
            stored = self.residuals[variable.path]
            stored.assign(tf.where(finite, residual, stored))
        return result, sent, received

    def _sparsify(self, accumulator, variable, density, num_ranks):
        """(mean gradient to apply, new residual, bytes sent, bytes received) of one variable."""
        rows_mode = embeddings.is_row_table(variable)
        rows = accumulator if rows_mode else tf.reshape(accumulator, [-1])
        count = rows.shape[0]
        k = tf.cast(tf.math.ceil(density * count), tf.int32)
        k = tf.clip_by_value(k, 1, count)
        magnitude = tf.norm(rows, axis=1) if rows_mode else tf.abs(rows)
        top = tf.math.top_k(magnitude, k=k, sorted=True)  # ties: the lower index first
        nonzero = top.values > 0
        indices = tf.cast(tf.boolean_mask(top.indices, nonzero), tf.int64)
        values = tf.gather(rows, indices)
        name = f"tfscale_{self.method}_{variable.path.replace('/', '_')}"
        if self.method == "gtopk":
            summed = topk.gtopk_allreduce(indices, values, k, name)
        else:
            summed = topk.topk_allgather(indices, values, name)
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


def resolve_embedding_exchange(exchange):
    """"allgather" or "dense" as they are, "topk" or "gtopk" as a TopKExchange at the default
    density, a TopKExchange as it is; anything else is a ValueError."""
    if isinstance(exchange, TopKExchange):
        return exchange
    runtime.check_embedding_exchange(exchange)
    return TopKExchange(exchange) if exchange in TOPK_EXCHANGES else exchange
