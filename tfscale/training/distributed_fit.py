"""What a TrainStep model's `fit`, `evaluate` and `load_weights` add in a job of two or more
ranks, on either engine (tfscale.training.train_step calls these; in one process they change
nothing but the memory warning of dynamic tables, logged in any process):

- before `fit`'s first update: the model built (called on the data's first row) and its
  optimizer built (a warning when its dynamic tables once full would not fit in memory), then
  every variable but each rank's own shards set to rank 0's;
- after `load_weights`: rank 0's weights on every rank;
- the callbacks of every rank but 0 without Keras's file writers (TensorBoard, ModelCheckpoint,
  CSVLogger) and its progress bar, so files and lines are written once;
- evaluation data (`evaluate`'s, `fit`'s validation data) of a model with tables spread over the
  ranks passed in step: ranks whose part has ended pass empty batches while the others' lookups
  need them;
- the metrics `fit` reports at each epoch's end and `evaluate` returns: over every rank's rows,
  by summing each metric's state over the ranks (Keras's metrics keep totals and counts, so this
  equals one process's metric over all the rows; an AUC's buckets too).

Horovod's own Keras callbacks (BroadcastGlobalVariablesCallback, MetricAverageCallback) do not
run under Keras 3 (and tf.distribute's need a strategy scope around the model), and averaging per-rank metrics is not the metric of all rows: hence these."""

import warnings

import keras
import tensorflow as tf

from tfscale import distributed
from tfscale.data.rank_batches import padded_dataset, zero_batch
from tfscale.distributed import runtime
from tfscale.embedding.table import model_tables
from tfscale.errors import UserError
from tfscale.optimizers import table_state

# Keras callbacks that write files: kept on rank 0 only.
CHIEF_ONLY_CALLBACKS = (keras.callbacks.TensorBoard, keras.callbacks.ModelCheckpoint,
                        keras.callbacks.CSVLogger)


def start_fit(model, x, callbacks, verbose):
    """Before `model.fit(x, ...)`: the model and its optimizer built; in a Horovod job, set to
    rank 0's when no step has run yet. Returns (callbacks, verbose) for this rank."""
    if not model.built:  # in one process too: the step needs the variables before its call
        model(_first_features(x), training=False)
    if not model.optimizer.built:
        model.optimizer.build(model.trainable_variables)
    table_state.warn_when_beyond_memory(model)
    if not distributed.is_active():
        return callbacks, verbose
    callbacks = _rank_callbacks(model, callbacks)
    if int(model.optimizer.iterations) == 0:
        broadcast_from_rank_0(model)
    return callbacks, verbose if distributed.is_chief() else 0


def evaluation_data(model, data):
    """`data` (evaluate's x, fit's validation data) as every rank must pass it in a Horovod job:
    a tf.data.Dataset is padded with empty batches to the longest rank's when the model's
    lookups are collectives (TableStrategy.lookups_span_ranks); anything else as it is."""
    if (not distributed.is_active() or not isinstance(data, tf.data.Dataset)
            or not any(t.strategy.lookups_span_ranks for t in model_tables(model))):
        return data
    return padded_dataset(data)


def broadcast_from_rank_0(model):
    """Every variable of `model` and of its built optimizer set to rank 0's, but each rank's own
    (tables spread over the ranks, their optimizer state)."""
    distributed.broadcast_model_and_optimizer(model, local=table_state.local_variables(model))


def check_load_weights(model):
    """Before `load_weights` under Horovod: refused for a model with tables spread over the
    ranks (a weights file holds one rank's rows of them)."""
    if distributed.is_active() and table_state.local_variables(model):
        raise UserError("`load_weights` would give every rank the rows of rank 0's shards: "
                        "save and restore a model with tables spread over the ranks with "
                        "`tfscale.callbacks.Checkpoint`, which keeps each rank's rows")


def after_load_weights(model):
    """After every rank's `load_weights`: rank 0's model weights on every rank (a rank that
    read another file, or none, must not train from other weights)."""
    engine = runtime.engine()
    if engine is None:
        return
    engine.broadcast_variables([v.value for v in model.variables], root_rank=0)


def results_over_ranks(metrics, results):
    """`results()` (the model's metric results) computed from the sum over the ranks of each of
    `metrics`' state variables; the local state is left as it was. Call eagerly, on every
    rank."""
    if not distributed.is_active() or not tf.executing_eagerly():
        return results()
    _warn_of_own_metrics(metrics)
    variables = [v for metric in metrics for v in metric.variables]
    if not variables:
        return results()
    local = [tf.identity(v.value) for v in variables]
    summed = runtime.engine().grouped_allreduce([tf.cast(value, tf.float64) for value in local],
                                                "sum", "tfscale_metric_states")
    for variable, total in zip(variables, summed):
        variable.assign(tf.cast(total, variable.dtype))
    try:
        return results()
    finally:
        for variable, value in zip(variables, local):
            variable.assign(value)


def _warn_of_own_metrics(metrics):
    own = sorted({type(m).__name__ for m in _leaf_metrics(metrics)
                  if not type(m).__module__.startswith(("keras", "tfscale"))})
    if own:
        warnings.warn(f"metrics {', '.join(own)} are combined over the ranks by summing their "
                      "state variables, which is exact only for totals and counts (as Keras's "
                      "metrics keep)", stacklevel=3)


def _leaf_metrics(metrics):
    for metric in metrics:
        inner = getattr(metric, "metrics", None)  # Keras's CompileMetrics holds the user's
        if isinstance(inner, (list, tuple)) and inner and inner[0] is not metric:
            yield from _leaf_metrics(inner)
        else:
            yield metric


def _rank_callbacks(model, callbacks):
    """`callbacks` as this rank runs them: file writers on rank 0 only; BackupAndRestore
    refused (it would restore rank 0 alone)."""
    callbacks = list(callbacks or [])
    for callback in callbacks:
        if isinstance(callback, keras.callbacks.BackupAndRestore):
            raise UserError("keras.callbacks.BackupAndRestore restores one rank: under "
                            "horovodrun use `tfscale.callbacks.Checkpoint(directory)`, which "
                            "resumes every rank (at any number of ranks)")
        if isinstance(callback, keras.callbacks.ModelCheckpoint) and \
                table_state.local_variables(model):
            raise UserError("keras.callbacks.ModelCheckpoint saves rank 0's rows only of "
                            "tables spread over the ranks: use "
                            "`tfscale.callbacks.Checkpoint(directory)`")
    if distributed.is_chief():
        return callbacks
    return [c for c in callbacks if not isinstance(c, CHIEF_ONLY_CALLBACKS)]


def _first_features(x):
    """One row shaped as `x`'s features, to build a model before its first step: the first row
    of arrays, zeros (empty strings) for a tf.data.Dataset, whose iteration may be a collective.
    Not an empty batch: some layers' eager kernels refuse those."""
    if isinstance(x, tf.data.Dataset):
        spec = x.element_spec
        return zero_batch(spec[0] if isinstance(spec, tuple) else spec, rows=1)
    if x is None or not all(hasattr(a, "shape") for a in tf.nest.flatten(x)):
        raise UserError("the model must be built before `fit` when `x` is "
                        "neither arrays nor a tf.data.Dataset: call it once on a batch first")
    return tf.nest.map_structure(lambda array: array[:1], x)
