"""A user's own Keras model as one TensorFlow SavedModel: `export_model` restores the newest
checkpoint a (possibly multi-rank) run wrote, its tables assembled from every rank's rows, into
the model built in one process, and writes it as Keras's `model.export` does, with its dynamic
tables' rows in use only (tfscale.serving.saved_model). The SavedModel loads with
`tf.saved_model.load` alone, without tfscale or Keras, and serves `serve` (and the
`serving_default` signature) on the model's inputs.

Run it in one process (plain `python`, not under horovodrun): a model built there holds every
row of its tables whatever their sharding, and its forward pass has no collectives to carry
into the graph."""

import os

import keras
# Keras has no public form of these: the class of functional models (which record their inputs)
# and the signature `Model.export` reads from a functional or Sequential model's inputs.

from tfscale import distributed
from tfscale.checkpoints.store import restore_trained_weights
from tfscale.data.rank_batches import zero_batch
from tfscale.errors import UserError
from tfscale.serving.saved_model import write_saved_model

SERVE = "serve"  # the endpoint, as Keras's `model.export` names it


def export_model(model, path, checkpoint_dir=None, input_signature=None):
    """Writes `model` to the new directory `path` as a SavedModel and returns the checkpoint's
    progress dict (None without `checkpoint_dir`).

    Args:
        model: the Keras model, built as training built it (same layers and table sizes; a
            TrainStep model is compiled or not, its optimizer is not exported).
        path: a directory that does not exist yet (TF Serving reads numbered versions:
            served/1, served/2, ...).
        checkpoint_dir: the directory of `tfscale.callbacks.Checkpoint` (or of a launcher
            run's checkpoints) whose newest weights to export; None exports `model` as it is.
        input_signature: a list with one tf.TensorSpec (or a structure of them) per argument
            of the model's call, as `keras.Model.export` takes it; needed for a subclassed model
            (Keras reads a functional or Sequential model's from its inputs).

    Returns:
        The checkpoint's progress dict (global step, epoch, ...), or None without
        `checkpoint_dir`.

    Raises:
        UserError: it runs in a Horovod job of several ranks; `path` exists; the model is not
            built, or is subclassed, and no `input_signature` is given; `checkpoint_dir` holds
            no checkpoint, or one that cannot be read or does not match the model.

    Example:
        ```python
        model = build_my_model()  # in one process, as training built it
        tfscale.serving.export_model(model, "served/1", checkpoint_dir="run/checkpoints")
        ```
    """
    if distributed.is_active():
        raise UserError("export_model runs in one process: after the horovodrun job, build the "
                        "model in a plain `python` run and give it the `checkpoint_dir` the job "
                        "wrote (its tables are assembled from every rank's rows)")
    if os.path.exists(path):
        raise UserError(f"`path={path}` exists already; give a new directory")
    if not model.built:
        if input_signature is None:
            raise UserError("the model is not built: give `input_signature` (its inputs' "
                            "tf.TensorSpecs) or call it once on a batch first")
        model(*zero_batch(list(input_signature), rows=1), training=False)
    if input_signature is None:
        input_signature = recorded_input_signature(model)
        if input_signature is None:
            raise UserError(
                f"{type(model).__name__} is a subclassed model: Keras does not record the "
                "shapes and dtypes of its inputs, which the SavedModel is traced with; give "
                "`input_signature` (its inputs' tf.TensorSpecs)")
    progress = None
    if checkpoint_dir is not None:
        progress = restore_trained_weights(model, checkpoint_dir)
        if progress is None:
            raise UserError(f"`checkpoint_dir={checkpoint_dir}` holds no checkpoint")
    write_saved_model(model, path, [(SERVE, model.__call__, input_signature)])
    return progress


def recorded_input_signature(model):
    """The signature of `model.__call__` Keras records for a Functional or Sequential model (one
    positional argument: the structure of its inputs' specs), or None for a subclassed model,
    whose inputs Keras does not record."""
    inputs = getattr(model, "inputs", None)  # a Functional or Sequential model's only
    if not inputs:
        return None
    structure = inputs[0] if isinstance(model, keras.Sequential) else model.input
    return [keras.tree.map_structure(
        lambda tensor: keras.InputSpec(shape=tensor.shape, dtype=tensor.dtype), structure)]
