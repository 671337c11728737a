"""Which engine this process runs on, starting it, and this process's place in the job: rank,
size, local rank, and the compression of dense gradient allreduces.

`init()` picks the engine from how the process was launched: under `horovodrun` (HOROVOD_RANK
and HOROVOD_SIZE set), Horovod; with TF_CONFIG naming two or more tasks (`python -m
tfscale.run`, Kubernetes' TFJob, Vertex AI, SageMaker), TensorFlow's own collective runtime;
`TFSCALE_ENGINE=horovod|tf` forces one; neither, one process, where nothing is started and
rank/size are 0/1. The started engine is this module's one piece of state (`engine()`), as a
collective runtime is one per process.

tfscale does not start an engine on its own: `require_started` refuses, in a launched job, to
build tables or compile a model before `init()`. Starting a collective runtime from inside a
layer's build would hide it in an unrelated call and fix its options silently; TensorFlow's
runtime must also start before any other op runs."""

import os

from tfscale.distributed import horovod_engine, tf_cluster
from tfscale.errors import UserError

COMPRESSIONS = ("none", "fp16")
ENGINES = ("horovod", "tf")

# How long one collective may wait for its peers before the job fails, on either engine (Gloo's
# receive timeout under Horovod; every collective's `timeout` on TensorFlow's runtime). A process
# that dies closes its sockets and its peers fail at once on both engines; this bounds the wait
# for one that hangs. On TensorFlow's runtime it also bounds a peer's slow stretch between two
# collectives (rank 0 counting a vocabulary, the first trace), hence minutes, not seconds.
# TFSCALE_COLLECTIVE_TIMEOUT_SECONDS overrides it.
COLLECTIVE_TIMEOUT_SECONDS = 300

_started = {"engine": None, "gradient_compression": "none"}


def launched_by_horovodrun():
    """True when `horovodrun` started this process (it sets HOROVOD_RANK and HOROVOD_SIZE).

    Returns:
        Whether HOROVOD_RANK and HOROVOD_SIZE are both set.

    Example:
        ```python
        tfscale.distributed.launched_by_horovodrun()  # False under plain `python`
        ```
    """
    return horovod_engine.launched_by_horovodrun()


def launched_engine():
    """The engine the environment asks for: "horovod", "tf", or None for one process.

    Returns:
        TFSCALE_ENGINE when set; else "horovod" under horovodrun, "tf" when TF_CONFIG is set,
        None otherwise.

    Raises:
        UserError: TFSCALE_ENGINE is set to something else than "horovod" or "tf".

    Example:
        ```python
        tfscale.distributed.launched_engine()  # "tf" under `python -m tfscale.run -np 2`
        ```
    """
    forced = os.environ.get("TFSCALE_ENGINE", "").strip()
    if forced:
        if forced not in ENGINES:
            raise UserError(f"TFSCALE_ENGINE={forced!r}: give one of {', '.join(ENGINES)} (or "
                            "leave it unset to follow the launcher)")
        return forced
    if launched_by_horovodrun():
        return "horovod"
    if tf_cluster.configured():
        return "tf"
    return None


def announced_size():
    """The number of processes the launcher announces (1 in one process), known before `init()`.

    Returns:
        HOROVOD_SIZE under horovodrun, the tasks of TF_CONFIG on TensorFlow's engine, else 1.

    Example:
        ```python
        tfscale.distributed.announced_size()  # 4 under `python -m tfscale.run -np 4`
        ```
    """
    engine_name = launched_engine()
    if engine_name == "horovod":
        return horovod_engine.announced_size()
    if engine_name == "tf":
        return tf_cluster.announced_size()
    return 1


def collective_timeout_seconds():
    """COLLECTIVE_TIMEOUT_SECONDS, or TFSCALE_COLLECTIVE_TIMEOUT_SECONDS when set.

    Returns:
        Seconds, a float.

    Raises:
        UserError: TFSCALE_COLLECTIVE_TIMEOUT_SECONDS is not a positive number.

    Example:
        ```python
        tfscale.distributed.collective_timeout_seconds()  # 300.0
        ```
    """
    text = os.environ.get("TFSCALE_COLLECTIVE_TIMEOUT_SECONDS", "").strip()
    if not text:
        return float(COLLECTIVE_TIMEOUT_SECONDS)
    try:
        seconds = float(text)
    except ValueError:
        seconds = 0.0
    if not seconds > 0:
        raise UserError(f"TFSCALE_COLLECTIVE_TIMEOUT_SECONDS={text!r}: give a positive number "
                        "of seconds")
    return seconds


def init(gradient_compression="none"):
    """Starts the engine the launcher asks for (`launched_engine`), and does nothing in one
    process. Call it first, before building the model or running any TensorFlow op: in a
    launched job tfscale refuses to build tables or compile a model until it has run.

    Each process then sees the GPU of its local rank only (when the host has GPUs).

    Args:
        gradient_compression: "none" or "fp16" (COMPRESSIONS), applied to the dense gradient
            allreduce of every train step.

    Raises:
        ValueError: `gradient_compression` is not one of COMPRESSIONS.
        UserError: TF_CONFIG or TFSCALE_ENGINE is malformed, or `init` ran before on another
            engine.

    Example:
        ```python
        import tfscale
        tfscale.distributed.init()  # first line of the script, before any model is built
        ```
    """
    if gradient_compression not in COMPRESSIONS:
        raise ValueError(f"`gradient_compression={gradient_compression!r}`: give one of "
                         f"{', '.join(COMPRESSIONS)}")
    _started["gradient_compression"] = gradient_compression
    wanted = launched_engine()
    started = _started["engine"]
    if started is not None:
        if started.name != wanted:
            raise UserError(f"`init()` started the {started.name} engine before; this process "
                            f"is now asked for {wanted}")
        return
    if wanted == "horovod":
        engine = horovod_engine.HorovodEngine(collective_timeout_seconds())
        _see_local_gpu_only(engine.local_rank)
    elif wanted == "tf":
        from tfscale.distributed import tf_engine  # imports TensorFlow: after the choice

        cluster = tf_cluster.read_cluster()
        if cluster.size < 2:
            return
        tf_engine.start_runtime(cluster)
        engine = tf_engine.TFEngine(cluster, collective_timeout_seconds())
    else:
        return
    _started["engine"] = engine


def _see_local_gpu_only(local_rank):
    """Hides every GPU but the one of `local_rank` (Horovod's usual pinning)."""
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        tf.config.set_visible_devices(gpus[local_rank % len(gpus)], "GPU")


def require_started(what):
    """Raises a UserError in a launched job (horovodrun, TF_CONFIG) when `init()` has not
    started its engine: `what` would otherwise size itself for one process and the ranks would
    train separate models.

    Args:
        what: what is about to happen, named in the error (e.g. "building FieldEmbedding 'x'").

    Raises:
        UserError: this process was launched as one of several and `init()` has not run.

    Example:
        ```python
        tfscale.distributed.require_started("building my tables")  # a UserError before init()
        ```
    """
    if announced_size() > 1 and _started["engine"] is None:
        raise UserError(
            f"{what} in a job of {announced_size()} processes before its engine started: add "
            "`tfscale.distributed.init()` at the top of the script, before building the model "
            "(in one process it does nothing)")


def engine():
    """The started Engine (tfscale.distributed.engine) of a job of two or more processes, else
    None.

    Returns:
        An Engine, or None in one process (and before `init()`).

    Example:
        ```python
        engine = tfscale.distributed.engine()
        print("one process" if engine is None else f"{engine.name}: {engine.size} ranks")
        ```
    """
    started = _started["engine"]
    return started if started is not None and started.size > 1 else None


def engine_name():
    """"horovod", "tf", or "none" in one process.

    Returns:
        The started engine's name.

    Example:
        ```python
        tfscale.distributed.engine_name()  # "none" under plain `python`
        ```
    """
    started = engine()
    return "none" if started is None else started.name


def is_active():
    """True in a rank of a job of two or more processes whose engine `init()` started.

    Returns:
        Whether an engine runs with more than one rank.

    Example:
        ```python
        if tfscale.distributed.is_active():
            print(f"rank {tfscale.distributed.rank()} of {tfscale.distributed.size()}")
        ```
    """
    return engine() is not None


def rank():
    """This process's rank (0 in one process).

    Returns:
        An int from 0 to `size() - 1`.

    Example:
        ```python
        shard = tfscale.distributed.rank()  # 0 .. size() - 1
        ```
    """
    started = engine()
    return 0 if started is None else started.rank


def size():
    """The number of ranks (1 in one process).

    Returns:
        The number of processes of the job, an int.

    Example:
        ```python
        per_rank = 65536 // tfscale.distributed.size()
        ```
    """
    started = engine()
    return 1 if started is None else started.size


def local_rank():
    """This process's index among the job's processes on its host (0 in one process).

    Returns:
        An int; each process uses the GPU of this index.

    Example:
        ```python
        tfscale.distributed.local_rank()  # 0 .. local_size() - 1
        ```
    """
    started = engine()
    return 0 if started is None else started.local_rank


def local_size():
    """The number of the job's processes on this host (1 in one process).

    Returns:
        An int.

    Example:
        ```python
        tfscale.distributed.local_size()
        ```
    """
    started = engine()
    return 1 if started is None else started.local_size


def is_chief():
    """True on rank 0, the rank that prints, logs and checkpoints (and in one process).

    Returns:
        Whether `rank()` is 0.

    Example:
        ```python
        if tfscale.distributed.is_chief():
            model.save("model.keras")  # once, not once per rank
        ```
    """
    return rank() == 0


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
    return _started["gradient_compression"]
