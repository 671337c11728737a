"""Horovod set-up: whether this process is one rank of a multi-process Horovod job, starting
Horovod when `horovodrun` launched the process, this rank's index, the job's size and the
compression of dense gradient allreduces.

Horovod is imported by `init` only, and only under `horovodrun`: a script that calls `init()`
runs unchanged as one process. Until Horovod is initialised with more than one rank (and in
every single-process run) `is_active()` is False and rank/size are 0/1, so single-process code
paths never import or call Horovod.

tfscale does not start Horovod on its own: `require_started` refuses, under horovodrun, to build
tables or compile a model before `init()`. Starting a collective runtime from inside a layer's
build would hide it in an unrelated call and fix its options (gradient compression) silently;
one explicit line, named by the error when it is missing, is what Horovod users write anyway."""

import os
import sys

from tfscale.errors import UserError

COMPRESSIONS = ("none", "fp16")

# How a dead rank ends the job (measured with horovodrun --gloo, 2 ranks): a rank that exits
# (SIGKILL, os._exit, even with status 0) closes its sockets, the others' next collective fails at
# once ("Horovod has been shut down"), and horovodrun terminates the job with a non-zero status. A
# rank that is frozen (SIGSTOP, a hung host) is only noticed when a peer's Gloo receive times out
# after HOROVOD_GLOO_TIMEOUT_SECONDS: Gloo's default of 30 s, pinned here because the "a dead
# rank ends the job within a minute" guarantee relies on it (horovodrun --gloo-timeout-seconds or
# the variable itself override it). A slow but live rank (e.g. rank 0 writing a checkpoint) is not
# a timeout: its Horovod background thread keeps answering.
GLOO_TIMEOUT_SECONDS = "30"

_settings = {"gradient_compression": "none"}


def launched_by_horovodrun():
    """True when `horovodrun` started this process (it sets HOROVOD_RANK and HOROVOD_SIZE).

    Returns:
        Whether HOROVOD_RANK and HOROVOD_SIZE are both set.

    Example:
        ```python
        tfscale.distributed.launched_by_horovodrun()  # False under plain `python`
        ```
    """
    return "HOROVOD_RANK" in os.environ and "HOROVOD_SIZE" in os.environ


def init(gradient_compression="none"):
    """Starts Horovod (`hvd.init()`) when `horovodrun` launched this process, and does nothing
    otherwise. Call it first, before building the model: under horovodrun tfscale refuses to
    build tables or compile a model until it has run.

    Args:
        gradient_compression: "none" or "fp16" (COMPRESSIONS), applied to the dense gradient
            allreduce of every train step.

    Raises:
        ValueError: `gradient_compression` is not one of COMPRESSIONS.

    Example:
        ```python
        import tfscale
        tfscale.distributed.init()  # first line of the script, before any model is built
        ```
    """
    if gradient_compression not in COMPRESSIONS:
        raise ValueError(f"`gradient_compression={gradient_compression!r}`: give one of "
                         f"{', '.join(COMPRESSIONS)}")
    if not launched_by_horovodrun():
        _settings["gradient_compression"] = gradient_compression
        return
    os.environ.setdefault("HOROVOD_GLOO_TIMEOUT_SECONDS", GLOO_TIMEOUT_SECONDS)
    import horovod.tensorflow as hvd

    hvd.init()
    _settings["gradient_compression"] = gradient_compression


def require_started(what):
    """Raises a UserError under `horovodrun` when Horovod has not been started by `init()`:
    `what` would otherwise size itself for one process and the ranks would train separate models.

    Args:
        what: what is about to happen, named in the error (e.g. "building FieldEmbedding 'x'").

    Raises:
        UserError: this process runs under horovodrun and `init()` has not started Horovod.

    Example:
        ```python
        tfscale.distributed.require_started("building my tables")  # a UserError before init()
        ```
    """
    if launched_by_horovodrun() and not _initialized():
        raise UserError(
            f"{what} under horovodrun before Horovod started: add `tfscale.distributed.init()` "
            "at the top of the script, before building the model (in one process it does "
            "nothing)")


def _initialized():
    hvd = sys.modules.get("horovod.tensorflow")
    return hvd is not None and hvd.is_initialized()


def horovod():
    """The `horovod.tensorflow` module when Horovod runs with more than one rank, else None."""
    hvd = sys.modules.get("horovod.tensorflow")
    if hvd is None or not hvd.is_initialized() or hvd.size() < 2:
        return None
    return hvd


def is_active():
    """True in a rank of a Horovod job of two or more processes.

    Returns:
        Whether Horovod runs, started by `init()`, with more than one rank.

    Example:
        ```python
        if tfscale.distributed.is_active():
            print(f"rank {tfscale.distributed.rank()} of {tfscale.distributed.size()}")
        ```
    """
    return horovod() is not None


def rank():
    """This process's rank (0 outside Horovod).

    Returns:
        An int from 0 to `size() - 1`.

    Example:
        ```python
        shard = tfscale.distributed.rank()  # 0 .. size() - 1
        ```
    """
    hvd = horovod()
    return 0 if hvd is None else hvd.rank()


def size():
    """The number of ranks (1 outside Horovod).

    Returns:
        The number of processes of the Horovod job, an int.

    Example:
        ```python
        per_rank = 65536 // tfscale.distributed.size()
        ```
    """
    hvd = horovod()
    return 1 if hvd is None else hvd.size()


def is_chief():
    """True on rank 0, the rank that prints, logs and checkpoints (and outside Horovod).

    Returns:
        Whether `rank()` is 0.

    Example:
        ```python
        if tfscale.distributed.is_chief():
            model.save("model.keras")  # once, not once per rank
        ```
    """
    return rank() == 0


def gradient_compression():
    """The Horovod compressor for dense gradient allreduces chosen at `init`."""
    hvd = horovod()
    return hvd.Compression.fp16 if _settings["gradient_compression"] == "fp16" \
        else hvd.Compression.none


def gradient_compression_name():
    """"none" or "fp16", as chosen at `init`.

    Returns:
        The `gradient_compression` given to `init` ("none" before it runs).

    Example:
        ```python
        tfscale.distributed.init(gradient_compression="fp16")
        tfscale.distributed.gradient_compression_name()  # "fp16"
        ```
    """
    return _settings["gradient_compression"]

