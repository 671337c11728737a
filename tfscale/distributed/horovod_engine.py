"""The Horovod engine: tfscale's collectives on `horovod.tensorflow` (Gloo on CPU, NCCL on GPU
when Horovod was built with it), for jobs started by `horovodrun`. The only module that
imports Horovod; its Keras wrappers are not used (they are written for Keras 2)."""

import os
import re

import tensorflow as tf

from tfscale.distributed.engine import Engine

# How a dead rank ends the job (measured with horovodrun --gloo, 2 ranks): a rank that exits
# (SIGKILL, os._exit, even with status 0) closes its sockets, the others' next collective fails at
# once ("Horovod has been shut down"), and horovodrun terminates the job with a non-zero status. A
# rank that is frozen (SIGSTOP, a hung host) is only noticed when a peer's Gloo receive times out
# after HOROVOD_GLOO_TIMEOUT_SECONDS: pinned to the engines' one collective timeout
# (runtime.COLLECTIVE_TIMEOUT_SECONDS; horovodrun --gloo-timeout-seconds or the variable itself
# override it). A slow but live rank (e.g. rank 0 writing a checkpoint) is not a timeout: its
# Horovod background thread keeps answering.


def launched_by_horovodrun():
    """True when `horovodrun` started this process (it sets HOROVOD_RANK and HOROVOD_SIZE)."""
    return "HOROVOD_RANK" in os.environ and "HOROVOD_SIZE" in os.environ


def announced_size():
    """The job's size as horovodrun announces it (HOROVOD_SIZE), before Horovod starts."""
    return int(os.environ.get("HOROVOD_SIZE", "1"))


class HorovodEngine(Engine):
    """Horovod started in this process (`hvd.init()`), with the GPU of its local rank visible
    when the host has GPUs."""

    name = "horovod"

    def __init__(self, timeout_seconds):
        os.environ.setdefault("HOROVOD_GLOO_TIMEOUT_SECONDS", str(int(timeout_seconds)))
        try:
            import horovod.tensorflow as hvd
        except ImportError as error:
            raise ImportError(
                "this process runs under horovodrun (or TFSCALE_ENGINE=horovod) but Horovod "
                f"does not import ({error}): build it with scripts/install_horovod.sh, or launch "
                "with `python -m tfscale.run -np N`, TensorFlow's own engine, which needs no "
                "build") from None
        hvd.init()
        self._hvd = hvd
        self.rank, self.size = hvd.rank(), hvd.size()
        self.local_rank, self.local_size = hvd.local_rank(), hvd.local_size()
        self._ops = {"sum": hvd.Sum, "average": hvd.Average, "min": hvd.Min, "max": hvd.Max}

    def allreduce(self, tensor, op, name):
        return self._hvd.allreduce(tensor, op=self._ops[op], name=name)

    def grouped_allreduce(self, tensors, op, name):
        return self._hvd.grouped_allreduce(list(tensors), op=self._ops[op], name=name)

    def allgather(self, tensor, name):
        return self._hvd.allgather(tensor, name=name)

    def alltoall(self, tensor, splits, name):
        if tensor.dtype != tf.bfloat16:
            return self._hvd.alltoall(tensor, splits=splits, name=name)
        # Horovod's alltoall takes no bfloat16: the bits travel as int16.
        received, received_splits = self._hvd.alltoall(tf.bitcast(tensor, tf.int16),
                                                       splits=splits, name=name)
        return tf.bitcast(received, tf.bfloat16), received_splits

    def broadcast_variables(self, variables, root_rank=0):
        variables = list(variables)
        self._hvd.broadcast_variables([v for v in variables if v.dtype != tf.bfloat16],
                                      root_rank=root_rank)
        # Horovod's broadcast takes no bfloat16 (a half-precision table): the bits as int16.
        for variable in (v for v in variables if v.dtype == tf.bfloat16):
            bits = self._hvd.broadcast(tf.bitcast(variable, tf.int16), root_rank=root_rank,
                                       name=re.sub(r"\W", "_", f"bfloat16_{variable.name}"))
            variable.assign(tf.bitcast(bits, tf.bfloat16))

    def broadcast_object(self, value, name, root_rank=0):
        return self._hvd.broadcast_object(value, root_rank=root_rank, name=name)

    def allgather_object(self, value, name):
        return self._hvd.allgather_object(value, name=name)
