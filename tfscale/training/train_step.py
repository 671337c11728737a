"""The train step of tfscale models (`TrainStepModel` for subclassed models,
`FunctionalTrainStepModel` for functional ones): Keras's own step (forward pass, gradients,
update) with the gradients exchanged between the ranks before the update.

Why override Keras's step:
- the exchange (tfscale.exchanges) fixed at `compile` averages the gradients over the
  ranks before the optimizer, so the loss scaler, CowClip and the optimizer see the same reduced
  gradients on every rank and take the same decisions; a stale exchange starts before the
  forward pass;
- an embedding lookup's gradient arrives as rows (IndexedSlices), which Keras's built-in
  optimizers densify inside every arithmetic op of their update, squaring each occurrence instead
  of the id's summed gradient in Adam's second moment. They are densified once here, after the
  exchange, except for those whose optimizer takes row slices (the row-sparse optimizers;
  CowClip, which also needs per-id counts: tfscale.embedding.dedup records de-duplicated lookups'
  counts).

The step works with the model's Tables (tfscale.embedding.table, found by
tfscale.embedding.strategies.table_of): it tells each how its optimizer updates it, which decides
how its lookups read it, and collects their lookups."""

import inspect
import warnings

import keras
import tensorflow as tf
# Keras has no public form of the test it uses to tell a functional construction
# `Model(inputs, outputs)` from a subclassed one.
from keras.src.models.model import functional_init_arguments

from tfscale import distributed, exchanges
from tfscale.embedding import dedup
from tfscale.embedding.strategies import table_of, tables_of
from tfscale.embedding.table import model_tables
from tfscale.embedding.table_dtypes import is_half
from tfscale.errors import UserError
from tfscale.optimizers.averaged import averaged_by_train_step
from tfscale.optimizers.came import CAME
from tfscale.optimizers.capabilities import (keeps_half_precision_rows, optimizer_for,
                                             takes_counted_slices, takes_row_slices,
                                             updates_rows_in_place, wrapped_optimizers)
from tfscale.optimizers.cowclip import CowClip
from tfscale.optimizers import table_state
from tfscale.optimizers.fused_adam import FusedAdam
from tfscale.row_gradients import densify
from tfscale.step_scalars import StepScalars, scalars_of
from tfscale.training import distributed_fit

# tfscale's optimizers that update a row-sharded table whole, correctly (the papers' dense
# update, one flag away: docs/row_updates.md); any other optimizer must update shards by row.
DENSE_SHARD_OPTIMIZERS = (FusedAdam, CAME, CowClip)


class TrainStep:
    """Mixin holding tfscale's `train_step`; combine it with keras.Model (see the two classes
    below, one for subclassed and one for functional models)."""

    def compile(self, *args, jit_compile="auto", embedding_exchange=exchanges.DEFAULT,
                embedding_staleness=0, **kwargs):
        """keras.Model.compile, plus `embedding_exchange` and `embedding_staleness`.

        The step runs without XLA in a job of several processes and with exchanges that act in
        one process (their collectives and dynamic shapes have no XLA kernels; Keras's "auto"
        turns XLA on when there is a GPU). In a launched job, `tfscale.distributed.init()` must have run.

        Args:
            *args: keras.Model.compile's arguments (`optimizer`, `loss`, ...).
            jit_compile: as keras.Model.compile's; turned off where the step cannot use XLA.
            embedding_exchange: how the train step averages gradients over the ranks: a
                name in tfscale.exchanges.EXCHANGES ("allgather", "dense", "topk", "gtopk") or
                an EmbeddingExchange. The top-k exchanges sparsify even in a single process.
            embedding_staleness: T >= 1 applies each step's embedding gradients T steps later,
                exchanged while those steps compute (tfscale.exchanges.stale); 0: synchronous.
            **kwargs: keras.Model.compile's other keyword arguments.

        Raises:
            UserError: in a launched job before `tfscale.distributed.init()`;
                `embedding_staleness` negative, or given with an exchange that cannot run stale
                or with tables whose rows change hands (dynamic); an optimizer that clips by
                per-id counts (CowClip) with an exchange that does not carry them; tables spread
                over the ranks with a top-k exchange, or with an optimizer that would update
                them whole.
            ValueError: `embedding_exchange` names no exchange, or `jit_compile=True` with
                several processes, with a top-k exchange or with `embedding_staleness`."""
        distributed.require_started(f"compiling {type(self).__name__}")
        exchange = exchanges.get(embedding_exchange)
        staleness = int(embedding_staleness)
        if staleness < 0:
            raise UserError(f"`embedding_staleness={staleness}`: give 0 (synchronous) or a "
                            "positive number of steps")
        if staleness and not exchange.can_run_stale:
            raise UserError(f"`embedding_staleness={staleness}` cannot be used with "
                            f"`embedding_exchange={exchange.name}` (it cannot apply delayed rows); "
                            f"use `embedding_exchange=allgather` or dense")
        if distributed.is_active() or exchange.acts_in_one_process or staleness:
            if jit_compile is True:
                raise ValueError("jit_compile=True cannot be used in a job of several processes, "
                                 "with a top-k exchange or with stale embedding updates: their "
                                 "collectives and dynamic shapes have no XLA kernels")
            jit_compile = False
        super().compile(*args, jit_compile=jit_compile, **kwargs)
        averaged_by_train_step(wrapped_optimizers(self.optimizer))
        with_counts = takes_counted_slices(self.optimizer)
        if with_counts and not exchange.carries_counts:
            raise UserError(f"`embedding_exchange={exchange.name}` cannot be used with "
                            f"{type(self.optimizer).__name__}: it clips each id by its number of "
                            "occurrences in the global batch, which only the allgathered "
                            "embedding gradients carry; use `embedding_exchange=allgather`")
        # By layer, not by variable: a subclassed model compiled before its first call has no
        # variables yet, and its shards' gradients must still stay out of the averaging.
        tables = model_tables(self)
        late = [table for table in tables if not table.strategy.takes_late_gradients]
        if staleness and late:
            raise UserError(f"`embedding_staleness={staleness}` cannot be used with tables of "
                            f"`sharding={late[0].strategy.name}` ({late[0].name}): a row can be "
                            "given to another id before a late gradient reaches it; use "
                            "`embedding_staleness=0`, or tables of another `sharding`")
        partitioned = [table for table in tables if table.partitioned]
        if partitioned:
            exchange = exchanges.RowShardedExchange(exchange,
                                                    partitioned[0].strategy.description)
        if staleness:
            exchange = exchanges.StaleExchange(exchange, staleness, with_counts=with_counts)
        self._embedding_exchange = exchange
        self._step_scalars = StepScalars()
        for table in tables:  # said at compile when the model is built, else at the first step
            if table.variable is None:
                continue
            _refuse_half_precision_rows_unkept(table.variable, self.optimizer)
            if not updates_rows_in_place(self.optimizer, table.variable):
                _refuse_whole_update_of_partitioned(
                    table, optimizer_for(self.optimizer, table.variable))

    @property
    def embedding_exchange(self):
        """The EmbeddingExchange the train step uses (fixed at `compile`)."""
        return self._embedding_exchange

    def per_rank_variables(self):
        """{name: tf.Variable} of state that differs between ranks (the exchange's: top-k
        residuals, staleness queues), for checkpoints; the model must be built.

        Returns:
            A dict from name to tf.Variable."""
        named = {}
        for state in self._embedding_exchange.per_rank_states():
            state.build(self.trainable_variables)
            named.update(state.per_rank_variables())
        return named

    def summary_scalars(self):
        """{name: value} for TensorBoard: the unique-id rate of the last step's lookups, the
        exchange's scalars (bytes sent and received, exchange time, staleness) and those of
        the model's layers that report any (a row-sharded FieldEmbedding's alltoall).

        Returns:
            A dict from scalar name to value."""
        return {**scalars_of(self._embedding_exchange, *self.layers),
                **self._step_scalars.summary_scalars()}

    def fit(self, *args, **kwargs):
        """keras.Model.fit; in a job of several ranks also (tfscale.training.distributed_fit):
        every rank's data run for the same number of steps, or refused before the first step;
        the model and optimizer built and set to rank 0's before the first update, Keras's
        file-writing callbacks and progress bar on rank 0 only, and the epoch's metrics over
        every rank's rows. Give each rank its part of the data with
        `tfscale.data.rank_batches`.

        Raises:
            tfscale.distributed.RankLost: a collective failed because another rank died or hung
                (the message names it)."""
        arguments = inspect.signature(keras.Model.fit).bind(self, *args, **kwargs).arguments
        del arguments["self"]
        with distributed_fit.rank_loss_said():
            return super().fit(**distributed_fit.start_fit(self, arguments))

    def evaluate(self, *args, **kwargs):
        """keras.Model.evaluate; in a job of several ranks its metrics cover every rank's rows,
        and with tables spread over the ranks every rank passes as many batches
        (distributed_fit)."""
        arguments = inspect.signature(keras.Model.evaluate).bind(self, *args, **kwargs).arguments
        del arguments["self"]
        extra = arguments.pop("kwargs", {})
        if not extra.get("_use_cached_eval_dataset"):  # fit's validation: agreed in fit
            arguments = distributed_fit.start_evaluate(self, arguments)
        with distributed_fit.rank_loss_said():
            return super().evaluate(**arguments, **extra)

    def load_weights(self, *args, **kwargs):
        """keras.Model.load_weights; in a job of several ranks every rank then holds rank 0's
        weights."""
        distributed_fit.check_load_weights(self)
        super().load_weights(*args, **kwargs)
        distributed_fit.after_load_weights(self)

    def get_metrics_result(self):
        """keras.Model.get_metrics_result; when Keras reads it eagerly (at an epoch's end, after
        `evaluate`) in a job of several ranks, over every rank's rows (distributed_fit.results_over_ranks).
        Inside the step it stays this rank's, so each step costs no metric collective."""
        return distributed_fit.results_over_ranks(self.metrics, super().get_metrics_result)

    def compile_from_config(self, config):
        """Keras's, which skips loading the compile state of any model that overrides `compile`;
        ours only adds checks around Keras's, so a saved model reloads compiled."""
        self.compile(**keras.saving.deserialize_keras_object(config))
        if self.built:
            self.optimizer.build(self.trainable_variables)

    def train_step(self, data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        embedding_tables = self._set_table_updates()  # at tracing: how the lookups read them
        exchange = self._embedding_exchange.begin_step(self.trainable_variables, self.optimizer)

        # Forward pass
        for table in embedding_tables:
            table.start_step()
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight,
                                     training=True)
            self._track_loss(loss, _batch_size(x))
            loss = self.optimizer.scale_loss(loss)

        # Gradients
        variables = self.trainable_variables  # complete now, also for a model built by the call
        gradients = tape.gradient(loss, variables)
        lookups = dedup.LookupRecord.of_step(tables_of(variables))
        takes_slices = [takes_row_slices(self.optimizer, v) for v in variables]
        if any(takes_slices):
            gradients = dedup.attach_counts(gradients, variables, lookups)
        if lookups.tables:
            self._step_scalars.record("embedding/unique_id_rate", lookups.unique_rate())

        # Rows given to new ids in this step start with fresh optimizer state, which must exist
        # by then: an optimizer not built before the first step (train_on_batch, a loop of the
        # user's own) is built here rather than in its update, or those rows' state would be
        # read unwritten.
        if not self.optimizer.built:
            self.optimizer.build(variables)
        for table in tables_of(variables):
            lookup = table.step_lookup()
            if lookup is not None and lookup.fresh_rows is not None:
                table_state.reset_rows(self.optimizer, table.variable, lookup.fresh_rows)

        # Exchange
        gradients = exchange.exchange(gradients, variables)
        gradients = [g if slices else densify(g) for g, slices in zip(gradients, takes_slices)]

        # Update, once the forward pass has used the rows it read (an update that needs nothing
        # from this step's forward pass, as a stale one, would not wait for it otherwise)
        with tf.control_dependencies([loss]):
            self.optimizer.apply(gradients, variables)
        exchange.finish(gradients)
        return self.compute_metrics(x, y, y_pred, sample_weight=sample_weight)

    def _set_table_updates(self):
        """The model's built Tables, each told whether its optimizer updates it by row. An
        embedding table updated whole (a Table or a user's Keras Embedding) is said once, since
        its step then costs every row of it; a partitioned Table is refused unless by tfscale's
        dense update."""
        whole = []
        for variable in self.trainable_variables:
            table = table_of(variable)
            if table is None:
                continue
            _refuse_half_precision_rows_unkept(variable, self.optimizer)
            by_row = updates_rows_in_place(self.optimizer, variable)
            table.set_updated_by_row(by_row)
            if by_row:
                continue
            optimizer = optimizer_for(self.optimizer, variable)
            _refuse_whole_update_of_partitioned(table, optimizer)
            whole.append(f"{variable.path} (by {type(optimizer).__name__})")
        if whole:
            warnings.warn(
                f"embedding tables updated whole every step, so a step's cost grows with the "
                f"table: {', '.join(whole)}; a tfscale row-sparse optimizer (RowSparseAdam, "
                "RowSparseAdagrad, RowSparseCAME, RowSparseSGD, CowClip(mode='scalable')) "
                "updates only the batch's rows", stacklevel=2)
        return tables_of(self.trainable_variables)

    def test_step(self, data):
        """Keras's test step, its loss tracked as the train step's (an empty batch, which a rank
        whose evaluation part has ended passes, adds nothing)."""
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        y_pred = self(x, training=False)
        loss = self.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight,
                                 training=False)
        self._track_loss(loss, _batch_size(x))
        return self.compute_metrics(x, y, y_pred, sample_weight=sample_weight)

    def _track_loss(self, loss, batch_size):
        """Adds the batch's loss to the running mean, leaving out an empty batch's (its mean is
        0/0) and, with a loss scaler, a non-finite loss (the scaler skips that step, and one NaN
        must not hide the rest of the epoch's loss)."""
        kept = batch_size > 0
        if isinstance(self.optimizer, keras.optimizers.LossScaleOptimizer):
            kept = tf.logical_and(kept, tf.math.is_finite(loss))
        loss = tf.where(kept, loss, tf.zeros_like(loss))
        batch_size = tf.where(kept, batch_size, tf.zeros_like(batch_size))
        self._loss_tracker.update_state(loss, sample_weight=batch_size)


def _refuse_half_precision_rows_unkept(variable, optimizer):
    """A UserError when table `variable` stores its rows in half precision and `optimizer` would
    not update it by row and write its rows back (tfscale.optimizers.row_updates)."""
    if not is_half(variable.dtype) or keeps_half_precision_rows(optimizer, variable):
        return
    name = type(optimizer_for(optimizer, variable)).__name__
    raise UserError(
        f"{variable.path} stores its rows in {tf.as_dtype(variable.dtype).name} "
        f"(`table_dtype={tf.as_dtype(variable.dtype).name}`) but {name} cannot keep "
        "half-precision rows: give the tables a tfscale row-sparse optimizer (RowWiseAdagrad, "
        "RowSparseAdam, RowSparseAdagrad, RowSparseCAME, RowSparseSGD, CowClip over one of "
        "them), or `table_dtype=\"float32\"`")


def _refuse_whole_update_of_partitioned(table, optimizer):
    """A UserError when `optimizer`, which updates `table` whole, would update a table spread
    over the ranks whole (only tfscale's dense updates keep a shard correct)."""
    if table.partitioned and not isinstance(optimizer, DENSE_SHARD_OPTIMIZERS):
        raise UserError(
            f"{type(optimizer).__name__} would update the {table.strategy.description} table "
            f"{table.variable.path} whole every step: give it an optimizer that updates it by "
            "row (`embedding_update=row`: RowSparseAdam, RowSparseAdagrad, RowSparseCAME, "
            "RowSparseSGD, CowClip()), or tables of `sharding=replicated`")


def _batch_size(x):
    """The number of examples in the batch `x` (a structure of tensors)."""
    return tf.shape(next(t for t in keras.tree.flatten(x) if t is not None))[0]


@keras.saving.register_keras_serializable(package="tfscale")
class TrainStepModel(TrainStep, keras.Model):
    """Base class of subclassed models with tfscale's train step.

    Not for functional construction: Keras builds `SomeModel(inputs, outputs)` by rewriting the
    base classes of SomeModel and of every class above it to Functional, which would turn every
    other subclass of this class into a broken functional model. Use FunctionalTrainStepModel.

    Raises:
        TypeError: the class is called as `SomeModel(inputs, outputs)` (functional
            construction)."""

    def __new__(cls, *args, **kwargs):
        if functional_init_arguments(args, kwargs):
            raise TypeError(f"{cls.__name__} is for subclassed models; build a functional model "
                            "with tfscale.FunctionalTrainStepModel(inputs, outputs)")
        return super().__new__(cls, *args, **kwargs)


@keras.saving.register_keras_serializable(package="tfscale")
class FunctionalTrainStepModel(TrainStep, keras.Model):
    """`FunctionalTrainStepModel(inputs, outputs)`: a functional model with tfscale's train
    step."""
