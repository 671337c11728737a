"""Writing a SavedModel, for both exports (tfscale.serving.export's raw-text model,
tfscale.serving.model_export's user model): Keras's ExportArchive with the exports' endpoints,
the embedding tables in the form their strategies serve (TableStrategy.served: a dynamic table's
rows in use only), and of the model's state only what the endpoints read: the variables (Keras
tracks those) and the TensorFlow resources, such as lookup tables, that they capture (tracking
the whole model would write every variable whole, a dynamic table's rows never handed out
too). The loaded SavedModel's `variables`, `trainable_variables` and `non_trainable_variables`
are those the endpoints read (Keras's `model.export` lists all of the model's)."""

import contextlib

import keras
import tensorflow as tf

from tfscale import distributed
from tfscale.embedding.table import tables_of
from tfscale.errors import UserError


def write_saved_model(model, path, endpoints):
    """Writes the SavedModel of `endpoints`, which call `model`, to `path`.

    Args:
        model: the built Keras model the endpoints call: in one process, or on one rank of a
            Horovod job when its tables are not spread over the ranks (every rank holds the
            same model then; write it from one).
        path: the SavedModel's directory.
        endpoints: a list of (name, function, input signature), as
            keras.export.ExportArchive.add_endpoint takes them; the first is also
            `serving_default` unless one has that name.

    Raises:
        UserError: in a Horovod job of several ranks, `model` has tables spread over the ranks."""
    tables = tables_of(model.variables)
    spread = [t for t in tables if t.partitioned]
    if distributed.is_active() and spread:
        raise UserError(
            f"`model` has {spread[0].strategy.description} tables, spread over the "
            f"{distributed.size()} ranks of this job (each holds its share, read by "
            "collectives): a SavedModel of one rank would hold its share only. Export from one "
            "process after the job's checkpoint: tfscale.serving.export_model(model, path, "
            "checkpoint_dir=...), or the launcher's launch.export")
    with contextlib.ExitStack() as serving:
        resources = _resources(model)
        for strategy, held in _by_strategy(tables):
            resources += serving.enter_context(strategy.served(held))
        archive = keras.export.ExportArchive()
        traced = [archive.add_endpoint(name, function, input_signature=signature)
                  .get_concrete_function() for name, function, signature in endpoints]
        captured = {id(tensor) for function in traced for tensor in function.captured_inputs}
        for resource in resources:
            if id(resource.resource_handle) in captured:
                archive.track(resource)
        read = _in_model_order({id(v): v for function in traced
                                for v in function.variables}.values(), model, tables)
        for name, variables in (("variables", read),
                                ("trainable_variables", [v for v in read if v.trainable]),
                                ("non_trainable_variables", [v for v in read if not v.trainable])):
            archive.add_variable_collection(name, variables)
        archive.write_out(path, verbose=False)


def _in_model_order(variables, model, tables):
    """`variables` (tf.Variables) in the order of `model`'s, then of `tables`' (in their served
    form), then by name: a traced function lists those it read in no fixed order."""
    order = {}
    for variable in [*model.variables, *(t.variable for t in tables)]:
        held = variable.value if isinstance(variable, keras.Variable) else variable
        order.setdefault(id(held), len(order))
    return sorted(variables, key=lambda v: (order.get(id(v), len(order)), v.name))


def _resources(model):
    """The TensorFlow resources (lookup tables, ...) `model` holds."""
    return [node for node in tf.train.TrackableView(model).descendants()
            if isinstance(node, tf.saved_model.experimental.TrackableResource)]


def _by_strategy(tables):
    """[(strategy, its tables)] of `tables`, each strategy once."""
    grouped = {}
    for table in tables:
        grouped.setdefault(id(table.strategy), (table.strategy, []))[1].append(table)
    return list(grouped.values())
