"""What a TrainStep model's `fit`, `evaluate` and `load_weights` add in a job of two or more
ranks, on either engine (tfscale.training.train_step calls these; in one process they change
nothing but the memory warning of dynamic tables, logged in any process):

- before `fit`'s first update: the model built (called on the data's first row) and its
  optimizer built (a warning when its dynamic tables once full would not fit in memory), then
  every variable but each rank's own shards set to rank 0's;
- before `fit`'s first step, its data as every rank's steps need it (one allgather of every
  rank's length; `_agreed_data` decides): the same number of steps on every rank, or a refusal
  on every rank naming each rank's length; a tf.data.Dataset of unknown length ended on every
  rank at the first rank that runs out;
- after `load_weights`: rank 0's weights on every rank;
- the callbacks of every rank but 0 without Keras's file writers (TensorBoard, ModelCheckpoint,
  CSVLogger) and its progress bar, so files and lines are written once;
- evaluation data (`evaluate`'s, `fit`'s validation data) of a model with tables spread over the
  ranks passed in step: ranks whose part has ended pass empty batches while the others' lookups
  need them (arrays: the same number of batches on every rank, or refused);
- the metrics `fit` reports at each epoch's end and `evaluate` returns: over every rank's rows,
  by summing each metric's state over the ranks (Keras's metrics keep totals and counts, so this
  equals one process's metric over all the rows; an AUC's buckets too).

Horovod's own Keras callbacks (BroadcastGlobalVariablesCallback, MetricAverageCallback) do not
run under Keras 3 (and tf.distribute's need a strategy scope around the model), and averaging per-rank metrics is not the metric of all rows: hence these."""

import contextlib
import math
import typing
import warnings

import keras
import tensorflow as tf

from tfscale import distributed
from tfscale.data.rank_batches import agreed_batches, padded_dataset, zero_batch
from tfscale.distributed import runtime
from tfscale.embedding.table import model_tables
from tfscale.errors import UserError
from tfscale.optimizers import table_state

# Keras callbacks that write files: kept on rank 0 only.
CHIEF_ONLY_CALLBACKS = (keras.callbacks.TensorBoard, keras.callbacks.ModelCheckpoint,
                        keras.callbacks.CSVLogger)


def start_fit(model, arguments):
    """`model.fit`'s bound `arguments` as this rank passes them to Keras: the model and its
    optimizer built; in a job of several ranks, its data and validation data agreed over the
    ranks (`_agreed_data`), the model set to rank 0's when no step has run yet, and this
    rank's callbacks and verbosity."""
    x = arguments.get("x")
    if not model.built:  # in one process too: the step needs the variables before its call
        model(_first_features(x), training=False)
    if not model.optimizer.built:
        model.optimizer.build(model.trainable_variables)
    table_state.warn_when_beyond_memory(model)
    if not distributed.is_active():
        return arguments
    arguments = {**arguments, **_agreed_fit_data(model, arguments)}
    arguments["callbacks"] = _rank_callbacks(model, arguments.get("callbacks"))
    if int(model.optimizer.iterations) == 0:
        broadcast_from_rank_0(model)
    if not distributed.is_chief():
        arguments["verbose"] = 0
    return arguments


def start_evaluate(model, arguments):
    """`model.evaluate`'s bound `arguments` as this rank passes them to Keras: in a job of
    several ranks, the data of a model whose lookups are collectives (tables spread over the
    ranks) agreed over the ranks (`_agreed_data`). Other models' ranks evaluate all their rows
    in their own number of steps: no step of theirs waits for another rank."""
    if not distributed.is_active() or not _lookups_span_ranks(model):
        return arguments
    x = arguments.get("x")
    lengths = runtime.engine().allgather_object(
        _length(x, arguments.get("batch_size"), arguments.get("steps")),
        "tfscale_evaluate_lengths")
    return {**arguments, "x": _agreed_data(x, lengths, 1, "`evaluate`'s data", "steps",
                                           evaluation=True)}


class _Length(typing.NamedTuple):
    """One rank's data as `fit` or `evaluate` reads it: its `kind` ("arrays", "dataset" or
    another type's name), `rows` (arrays), `batches` a pass (None: unknown; math.inf: endless)
    and the `steps` an epoch given (None: one pass)."""
    kind: str
    rows: int | None
    batches: float | None
    steps: int | None


def _agreed_fit_data(model, arguments):
    """{"x": ..., "validation_data": ...} of `fit`'s bound `arguments` agreed over the ranks
    (`_agreed_data`) after one allgather of every rank's lengths; validation data only for a
    model whose lookups are collectives (`start_evaluate`)."""
    get = arguments.get
    x, validation, epochs = get("x"), get("validation_data"), get("epochs", 1)
    split = get("validation_split", 0.0) if validation is None else 0.0
    lengths = {"x": _length(x, get("batch_size"), get("steps_per_epoch"), (0.0, 1.0 - split))}
    if _lookups_span_ranks(model) and (validation is not None or split):
        features, part = ((x, (1.0 - split, 1.0)) if split else
                          (keras.utils.unpack_x_y_sample_weight(validation)[0], (0.0, 1.0)))
        lengths["validation_data"] = _length(
            features, get("validation_batch_size") or get("batch_size"),
            get("validation_steps"), part)
    every = runtime.engine().allgather_object(lengths, "tfscale_fit_lengths")
    agreed = {"x": _agreed_data(x, [rank["x"] for rank in every], epochs, "`fit`'s data",
                                "steps_per_epoch", evaluation=False)}
    if "validation_data" in lengths:
        agreed["validation_data"] = _agreed_data(
            validation, [rank["validation_data"] for rank in every], epochs,
            "`fit`'s validation data", "validation_steps", evaluation=True)
    return agreed


def _length(data, batch_size, steps, part=(0.0, 1.0)):
    """The _Length of `data` (fit's `x`, evaluate's, validation data's features) batched as
    Keras batches it; of arrays, the rows of `part` (fractions: fit's `validation_split`)."""
    if isinstance(data, tf.data.Dataset):
        cardinality = int(data.cardinality())
        batches = {tf.data.UNKNOWN_CARDINALITY: None,
                   tf.data.INFINITE_CARDINALITY: math.inf}.get(cardinality, cardinality)
        return _Length("dataset", None, batches, steps)
    leaves = tf.nest.flatten(data)
    if not leaves or not all(hasattr(leaf, "shape") and leaf.shape for leaf in leaves):
        return _Length(type(data).__name__, None, None, steps)
    rows = int(leaves[0].shape[0])
    rows = math.floor(rows * part[1]) - math.floor(rows * part[0])
    if not batch_size:  # Keras's ArrayDataAdapter's
        batch_size = math.ceil(rows / steps) if steps else 32
    return _Length("arrays", rows, math.ceil(rows / max(batch_size, 1)), steps)


def _agreed_data(data, lengths, epochs, what, steps_name, evaluation):
    """`data` as this rank passes it to Keras, from every rank's _Length of it (the one place
    that decides):

    - as it is when every rank reads as many batches in `epochs` epochs, with the same steps;
    - tf.data.Datasets on every rank, with the same steps, whose length some rank does not know
      (training): ended on every rank at the first rank that runs out (agreed_batches);
    - tf.data.Datasets on every rank (evaluation): padded with empty batches to the longest
      rank's (padded_dataset), so that every row is evaluated;
    - else a UserError on every rank, naming each rank's length and what to do."""
    reads = [_batches_read(n, epochs) for n in lengths]
    steps = {n.steps for n in lengths}
    if len(set(reads)) == 1 and None not in reads and len(steps) == 1:
        return data
    if len(steps) == 1 and all(n.kind == "dataset" for n in lengths):
        if evaluation:
            return padded_dataset(data)
        if None in reads:
            return agreed_batches(data)
    ranks = "; ".join(f"rank {rank}: {_described(n, steps_name)}"
                      for rank, n in enumerate(lengths))
    same = "rows" if len(steps) == 1 else f"rows and `{steps_name}`"
    even = ", drop_remainder=False" if evaluation else ""
    raise UserError(f"{what} must run the same number of steps on every rank, or a rank with "
                    f"more would wait forever for the others ({ranks}): give every rank the "
                    f"same number of {same}, or split one data set evenly over the ranks with "
                    f"`tfscale.data.rank_batches(data, global_batch_size{even})`")


def _batches_read(length, epochs):
    """The batches of one pass of `length` (a _Length), or with `steps` given, the fewer of
    them and the `steps * epochs` that `fit` reads at most (Keras goes on across epochs)."""
    if length.batches is None or not length.steps:
        return length.batches
    return min(length.batches, length.steps * epochs)


def _described(length, steps_name):
    """`length` (a _Length) in words, as a refusal names it."""
    if length.kind == "arrays":
        text = f"{length.rows:,} rows, {length.batches:,} batches"
    elif length.kind == "dataset":
        text = ("a tf.data.Dataset of unknown length" if length.batches is None
                else "an endless tf.data.Dataset" if length.batches == math.inf
                else f"a tf.data.Dataset of {length.batches:,} batches")
    else:
        text = f"a {length.kind}, whose length is not known: give arrays or a tf.data.Dataset"
    return text if length.steps is None else f"{text}, {steps_name}={length.steps}"


def _lookups_span_ranks(model):
    """Whether `model`'s forward pass is a collective (TableStrategy.lookups_span_ranks)."""
    return any(table.strategy.lookups_span_ranks for table in model_tables(model))


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


@contextlib.contextmanager
def rank_loss_said():
    """Inside: a collective's failure because a rank was lost is raised as the RankLost that
    names the rank (tfscale.distributed.failures); other errors pass as they are."""
    try:
        yield
    except tf.errors.OpError as error:
        lost = distributed.as_rank_lost(error)
        if lost is None:
            raise
        raise lost from error
