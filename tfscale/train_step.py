"""The train step shared by tfscale models (`TrainStepModel` for subclassed models,
`FunctionalTrainStepModel` for functional ones): it computes the loss and gradients as Keras's
own step does and prepares the gradients before the optimizer.

Why override Keras's step: an embedding lookup's gradient arrives as IndexedSlices with one row
per occurrence in the batch, and Keras's built-in optimizers turn it into a dense tensor inside
every arithmetic op of their update, squaring each occurrence instead of the id's summed
gradient in Adam's second moment. Converting it once here gives Adam's true update at the cost of
one conversion. Optimizers that set `accepts_indexed_slices` (CowClip, which needs the per-id
counts) get the slices unchanged. Loss scaling is the optimizer's (tfscale.loss_scaling wraps
the optimizer). Under Horovod the gradients are exchanged between ranks here, before the optimizer
(tfscale.distributed.gradients), by the embedding exchange fixed at `compile`; a single-process
run takes exactly the path without it, except with a top-k exchange
(tfscale.distributed.sparse_exchange), which sparsifies in any case. With de-duplicated lookups
the tables' gradients get their per-id counts here (tfscale.dedup); with `embedding_staleness`
T >= 1 the tables get the gradients of T steps ago, exchanged while this step computes
(tfscale.staleness)."""

import keras
import tensorflow as tf
from keras.src import tree
from keras.src.models.model import functional_init_arguments
from keras.src.saving import serialization_lib
from keras.src.trainers.data_adapters import data_adapter_utils

from tfscale import dedup, distributed
from tfscale.embedding_metrics import EmbeddingStepMetrics
from tfscale.errors import UserError
from tfscale.staleness import StaleEmbeddingUpdates


def densify(gradient):
    """`gradient` as a dense tensor (IndexedSlices are summed into their rows once)."""
    if isinstance(gradient, tf.IndexedSlices):
        return tf.convert_to_tensor(gradient)
    return gradient


class TrainStep:
    """Mixin holding tfscale's `train_step`; combine it with keras.Model (see the two classes
    below, one for subclassed and one for functional models)."""

    def compile(self, *args, jit_compile="auto", embedding_exchange=None, embedding_staleness=0,
                **kwargs):
        """keras.Model.compile; under Horovod without XLA, which has no kernels for Horovod's
        ops (Keras's "auto" turns XLA on when there is a GPU). `embedding_exchange` is how this
        model's train step sends embedding gradients: "allgather", "dense", "topk", "gtopk" (at
        the default density) or a tfscale.distributed.TopKExchange; default: the one chosen at
        tfscale.distributed.init. The top-k exchanges sparsify even in a single process.
        `embedding_staleness` T >= 1 applies each step's embedding gradients T steps later,
        exchanged while those steps compute (tfscale.staleness); 0: synchronous."""
        exchange = distributed.resolve_embedding_exchange(
            embedding_exchange or distributed.embedding_exchange())
        staleness = int(embedding_staleness)
        if staleness < 0:
            raise UserError(f"--embedding_staleness={staleness}: give 0 (synchronous) or a "
                            "positive number of steps")
        if staleness and isinstance(exchange, distributed.TopKExchange):
            raise UserError(f"--embedding_staleness={staleness} cannot be used with "
                            f"--embedding_comm={exchange.method} (its error feedback is not "
                            "built for delayed rows); use --embedding_comm=allgather or dense")
        if distributed.is_active() or isinstance(exchange, distributed.TopKExchange) \
                or staleness:
            if jit_compile is True:
                raise ValueError("jit_compile=True cannot be used with Horovod, a top-k "
                                 "exchange or stale embedding updates: their collectives and "
                                 "dynamic shapes have no XLA kernels")
            jit_compile = False
        super().compile(*args, jit_compile=jit_compile, **kwargs)
        if exchange != "allgather" and self._wants_slices():
            # Densified or top-k rows cannot be turned back into slices with per-id counts: the
            # sum of an id's occurrences does not say how many there were.
            method = exchange if isinstance(exchange, str) else exchange.method
            raise UserError(f"--embedding_comm={method} cannot be used with --optimizer=cowclip: "
                            "CowClip clips each id by its number of occurrences in the global "
                            "batch, which only the allgathered embedding gradients carry; use "
                            "--embedding_comm=allgather")
        self._embedding_exchange = exchange
        self._exchange_traffic = distributed.TrafficCounter()
        self._embedding_metrics = EmbeddingStepMetrics()
        self._stale_updates = None
        if staleness:
            self._stale_updates = StaleEmbeddingUpdates(staleness,
                                                        with_counts=self._wants_slices())

    def per_rank_variables(self):
        """{name: tf.Variable} of state that differs between ranks (a top-k exchange's
        residuals, the stale embedding updates' queues), for checkpoints; the model must be
        built."""
        named = {}
        if isinstance(self._embedding_exchange, distributed.TopKExchange):
            self._embedding_exchange.build(self.trainable_variables)
            named.update(self._embedding_exchange.per_rank_variables())
        if self._stale_updates is not None:
            self._stale_updates.build(self.trainable_variables)
            named.update(self._stale_updates.per_rank_variables())
        return named

    def summary_scalars(self):
        """{name: value} for TensorBoard: bytes this rank sent and received in the last step's
        gradient exchange, the embedding exchange's time, the unique-id rate and the staleness
        of the applied embedding gradients (each once a step has recorded it)."""
        return {**self._exchange_traffic.summary_scalars(),
                **self._embedding_metrics.summary_scalars()}

    def compile_from_config(self, config):
        """Keras's, which skips loading the compile state of any model that overrides `compile`;
        ours only adds checks around Keras's, so a saved model reloads compiled."""
        self.compile(**serialization_lib.deserialize_keras_object(config))
        if self.built:
            self.optimizer.build(self.trainable_variables)

    def train_step(self, data):
        x, y, sample_weight = data_adapter_utils.unpack_x_y_sample_weight(data)
        stale = self._stale_updates
        if stale is not None:
            scale, step, queued, pending = self._start_stale_embedding_update()
        with dedup.recording() as lookups, tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight,
                                     training=True)
            batch_size = tf.shape(next(t for t in tree.flatten(x) if t is not None))[0]
            self._track_loss(loss, batch_size)
            loss = self.optimizer.scale_loss(loss)
        variables = self.trainable_variables  # complete now, also for a model built by the call
        gradients = tape.gradient(loss, variables)
        if self._wants_slices():
            gradients = dedup.attach_counts(gradients, variables, lookups)
        self._embedding_metrics.record_unique_rate(lookups)
        if stale is None:
            self.optimizer.apply(self._for_optimizer(self._exchange(gradients, variables)),
                                 variables)
        else:
            applying = self._for_optimizer(
                self._with_stale_embeddings(gradients, queued, pending))
            applied = self.optimizer.check_finite(applying) if scale is not None else True
            # The tables' update needs nothing from this step's forward pass, and tf.function
            # orders it after the ops reading the tables but not after the ops using what they
            # read: without this wait the forward pass sometimes saw the updated rows (runs
            # differed from one another from some step on).
            with tf.control_dependencies([loss]):
                self.optimizer.apply(applying, variables)
            stale.push(gradients, variables, applied, scale, step)
        return self.compute_metrics(x, y, y_pred, sample_weight=sample_weight)

    def _wants_slices(self):
        """Whether the optimizer takes embedding gradients as (counted) slices: CowClip."""
        return getattr(self.optimizer, "accepts_indexed_slices", False)

    def _for_optimizer(self, gradients):
        """`gradients` densified, unless the optimizer takes slices."""
        return gradients if self._wants_slices() else [densify(g) for g in gradients]

    def _start_stale_embedding_update(self):
        """Pops the oldest queued embedding gradients and starts their exchange before the
        forward pass, which does not depend on it: the exchange overlaps this step's
        computation. Returns (loss scale, optimizer step, queued, exchanged)."""
        if not self.built:
            raise ValueError("build the model before training it with embedding_staleness "
                             "(the queues need its embedding tables before the first step)")
        scale = self._loss_scale()
        step = tf.identity(self.optimizer.iterations)
        queued, origin = self._stale_updates.pop(self.trainable_variables, scale)
        self._embedding_metrics.record(
            "embedding/staleness", tf.where(origin >= 0, tf.cast(step, tf.int64) - origin, 0))
        return scale, step, queued, self._exchange_embeddings(queued)

    def _with_stale_embeddings(self, fresh, queued, pending):
        """This step's gradients with each queued table's replaced by its exchanged queued
        one, the others averaged over the ranks."""
        if distributed.is_active():
            self._record_traffic([q if q is not None else g for g, q in zip(fresh, queued)])
            fresh = distributed.exchange_gradients(
                [None if q is not None else g for g, q in zip(fresh, queued)],
                self._embedding_exchange)
        return [p if p is not None else g for g, p in zip(fresh, pending)]

    def _exchange(self, gradients, variables):
        """The synchronous step's exchange of all gradients (nothing in a single process, except
        that a top-k exchange sparsifies in any case)."""
        exchange = self._embedding_exchange
        if isinstance(exchange, distributed.TopKExchange):
            gradients, sent, received = exchange.exchange(
                gradients, variables, self.optimizer.iterations, loss_scale=self._loss_scale())
            self._exchange_traffic.record(sent, received)
            return gradients
        if not distributed.is_active():
            return gradients
        # By default embedding gradients travel as IndexedSlices even to optimizers that densify
        # them: the allgather's bytes grow with the batch's ids, a dense allreduce's with the
        # table's size. Densifying after the exchange gives the same dense gradient.
        self._record_traffic(gradients)
        gradients, seconds = self._embedding_metrics.timed(
            gradients, lambda: distributed.exchange_gradients(gradients, exchange))
        self._embedding_metrics.record("exchange/seconds", seconds)
        return gradients

    def _exchange_embeddings(self, queued):
        """The queued embedding gradients averaged over the ranks (stale embedding updates)."""
        if not distributed.is_active():
            return queued
        pending, seconds = self._embedding_metrics.timed(
            queued, lambda: distributed.exchange_gradients(
                queued, self._embedding_exchange, name_suffix="_stale_embeddings"))
        self._embedding_metrics.record("exchange/embedding_seconds", seconds)
        return pending

    def _record_traffic(self, gradients):
        """Records the modelled bytes this rank sends and receives to exchange `gradients`."""
        one_way = distributed.exchange_bytes(
            gradients, distributed.size(), self._embedding_exchange,
            distributed.gradient_compression_name()) / 2
        self._exchange_traffic.record(one_way, one_way)

    def _loss_scale(self):
        """The factor this step's gradients carry: the loss scaler's scale (read before the
        optimizer changes it; the optimizer is built first if need be), or None."""
        if not isinstance(self.optimizer, keras.optimizers.LossScaleOptimizer):
            return None
        if not self.optimizer.built:
            self.optimizer.build(self.trainable_variables)
        return tf.identity(self.optimizer.dynamic_scale)

    def _track_loss(self, loss, batch_size):
        """Adds the batch's loss to the running mean; with a loss scaler, a non-finite loss is
        left out (the scaler skips that step, and one NaN must not hide the rest of the
        epoch's loss)."""
        if isinstance(self.optimizer, keras.optimizers.LossScaleOptimizer):
            finite = tf.math.is_finite(loss)
            loss = tf.where(finite, loss, tf.zeros_like(loss))
            batch_size = tf.where(finite, batch_size, tf.zeros_like(batch_size))
        self._loss_tracker.update_state(loss, sample_weight=batch_size)


@keras.saving.register_keras_serializable(package="tfscale")
class TrainStepModel(TrainStep, keras.Model):
    """Base class of subclassed models with tfscale's train step.

    Not for functional construction: Keras builds `SomeModel(inputs, outputs)` by rewriting the
    base classes of SomeModel and of every class above it to Functional, which would turn every
    other subclass of this class into a broken functional model. Use FunctionalTrainStepModel."""

    def __new__(cls, *args, **kwargs):
        if functional_init_arguments(args, kwargs):
            raise TypeError(f"{cls.__name__} is for subclassed models; build a functional model "
                            "with tfscale.train_step.FunctionalTrainStepModel(inputs, outputs)")
        return super().__new__(cls, *args, **kwargs)


@keras.saving.register_keras_serializable(package="tfscale")
class FunctionalTrainStepModel(TrainStep, keras.Model):
    """`FunctionalTrainStepModel(inputs, outputs)`: a functional model with tfscale's train
    step."""
