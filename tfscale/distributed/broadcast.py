"""Rank 0's state to every rank: the model's and optimizer's variables (once built, and
restored when resuming), so all ranks start from the same weights, and small Python values such
as the position a resumed run starts from; and two small agreements: a barrier, and whether any
rank says yes."""

import tensorflow as tf

from tfscale.distributed import runtime
from tfscale.errors import UserError


def broadcast_model_and_optimizer(model, local=()):
    """Overwrites every variable of `model` and of its (built) optimizer with rank 0's values,
    except those in `local`; does nothing in one process.

    Args:
        model: a built Keras model with a built optimizer.
        local: variables each rank keeps its own of (e.g. row-sharded tables and their
            optimizer state).

    Raises:
        RuntimeError: the ranks hold different lists of variables to broadcast (names, shapes,
            dtypes or order), on every rank.

    Example:
        ```python
        tfscale.distributed.broadcast_model_and_optimizer(model)  # every rank starts as rank 0
        ```
    """
    engine = runtime.engine()
    if engine is None:
        return
    local_ids = {id(v) for v in local}
    variables = [v for v in list(model.variables) + list(model.optimizer.variables)
                 if id(v) not in local_ids]
    _check_same_variables(engine, variables)
    # Keras 3 variables wrap a tf.Variable (`.value`), which is what an engine assigns to.
    engine.broadcast_variables([v.value for v in variables], root_rank=0)


def _check_same_variables(engine, variables):
    """Raises on every rank when the ranks' variable lists differ (names, shapes, order): their
    broadcasts would pair different variables, or wait for one that never comes."""
    listing = [(v.path, tuple(v.shape), str(v.dtype)) for v in variables]
    listings = engine.allgather_object(listing, "tfscale_variable_listing")
    for rank, other in enumerate(listings):
        if other != listing:
            first = next((i for i, (mine, theirs) in enumerate(zip(listing, other))
                          if mine != theirs), min(len(listing), len(other)))
            raise RuntimeError(
                f"rank {engine.rank} holds {len(listing)} model and optimizer variables to "
                f"broadcast, rank {rank} holds {len(other)}; they must be the same on every rank "
                f"(build the model and its optimizer the same way on each); first difference at "
                f"position {first}: {listing[first:first + 1]} here, {other[first:first + 1]} "
                "there")


def broadcast_from_chief(compute, name):
    """`compute()` as rank 0 computes it, on every rank (the other ranks do not call it); a
    UserError it raises is raised on every rank, so all of them stop with the same message.
    Outside Horovod this is just `compute()`.

    Args:
        compute: a function of no arguments returning a picklable value, called on rank 0.
        name: identifies the broadcast; the same on every rank.

    Returns:
        What `compute()` returned on rank 0.

    Raises:
        UserError: `compute()` raised it on rank 0 (raised on every rank).

    Example:
        ```python
        vocabulary = tfscale.distributed.broadcast_from_chief(count_vocabulary, name="vocabulary")
        ```
    """
    engine = runtime.engine()
    if engine is None:
        return compute()
    if engine.rank != 0:
        value, error = engine.broadcast_object(None, name)
        if error is not None:
            raise error
        return value
    try:
        value = compute()
    except UserError as error:
        engine.broadcast_object((None, error), name)
        raise
    engine.broadcast_object((value, None), name)
    return value


def barrier(name):
    """Returns once every rank has called it with `name` (at once in one process).

    Args:
        name: identifies the barrier; the same on every rank.

    Example:
        ```python
        tfscale.distributed.barrier(name="files_written")
        ```
    """
    engine = runtime.engine()
    if engine is not None:
        engine.barrier(name)


def any_rank(flag, name):
    """Whether `flag` is true on at least one rank (`flag` itself in one process).

    Args:
        flag: this rank's value, read as a bool.
        name: identifies the collective; the same on every rank.

    Returns:
        True when `flag` is true on any rank, the same on every rank.

    Example:
        ```python
        if tfscale.distributed.any_rank(not ok, name="check"):
            raise SystemExit("a rank failed its check")
        ```
    """
    engine = runtime.engine()
    if engine is None:
        return bool(flag)
    return float(engine.allreduce(tf.constant(float(flag)), "max", name)) > 0
