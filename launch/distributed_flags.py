"""Horovod flags and start-up (tfscale.distributed): started by `horovodrun -np P ...`, the
launcher runs as one of P data-parallel ranks sharing the global --batch_size."""

from absl import flags

FLAGS = flags.FLAGS

flags.DEFINE_enum("gradient_compression", "none", ["none", "fp16"],
                  "Under horovodrun: send dense gradients as float16 in the allreduce (half the "
                  "bytes; values beyond float16's range become inf, which a loss scaler skips "
                  "and plain float32 training stops on). Embedding gradients are not compressed "
                  "unless --embedding_exchange=dense.")
flags.DEFINE_enum("embedding_exchange", "allgather", ["allgather", "dense"],
                  "Under horovodrun: how embedding gradients travel between ranks. allgather: "
                  "the rows of the batch's ids (values and int64 indices, bytes grow with the "
                  "batch); dense: whole-table tensors in the allreduce (Horovod's "
                  "sparse_as_dense, bytes grow with the vocabulary). Same averaged gradient; "
                  "dense cannot be used with --optimizer=cowclip, which needs per-id counts.")


def init_horovod():
    """Starts Horovod when horovodrun launched this process (nothing otherwise)."""
    from tfscale import distributed

    if distributed.launched_by_horovodrun():
        distributed.init(FLAGS.gradient_compression, FLAGS.embedding_exchange)


def describe():
    """A few words on the process layout."""
    from tfscale import distributed

    if not distributed.is_active():
        return "1 process"
    return (f"{distributed.size()} Horovod ranks at batch "
            f"{distributed.local_batch_size(FLAGS.batch_size)} each, gradient compression "
            f"{FLAGS.gradient_compression}, embedding exchange {FLAGS.embedding_exchange}")
