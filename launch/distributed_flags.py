"""Multi-process and gradient-exchange flags (tfscale.distributed): started by `horovodrun -np P
...` or `python -m tfscale.run -np P ...`, the launcher runs as one of P data-parallel ranks
sharing the global --batch_size."""

from absl import flags

from tfscale import exchanges
from tfscale.distributed import COMPRESSIONS

FLAGS = flags.FLAGS

flags.DEFINE_enum("gradient_compression", "none", list(COMPRESSIONS),
                  "With several processes: send dense gradients as float16 in the allreduce (half the "
                  "bytes; values beyond float16's range become inf, which a loss scaler skips "
                  "and plain float32 training stops on). Embedding gradients are not compressed "
                  "unless --embedding_comm=dense.")
flags.DEFINE_enum("embedding_comm", exchanges.DEFAULT, list(exchanges.EXCHANGES),
                  "How embedding gradients travel between ranks. allgather: the rows of the "
                  "batch's ids (values and int64 indices, bytes grow with the batch); dense: "
                  "whole-table tensors in the allreduce (Horovod's sparse_as_dense, bytes grow "
                  "with the vocabulary); topk: each rank's --density top rows (with error "
                  "feedback), allgathered (bytes grow with P); gtopk: the global top rows of the "
                  "sum, in log2(P) pairwise rounds. topk and gtopk also apply in a single "
                  "process (top-k sparsified training). Only allgather can be used with "
                  "--optimizer=cowclip, which needs per-id counts.")
flags.DEFINE_float("density", 0.001, "topk/gtopk: fraction of each embedding table's rows "
                   "exchanged per step.", lower_bound=0.0, upper_bound=1.0)
flags.DEFINE_float("density_warmup", None, "topk/gtopk: the density of the first "
                   "--density_warmup_epochs epochs (the gTop-k reference: 0.004 for one epoch, "
                   "then 0.001); unset: no warm-up.", lower_bound=0.0, upper_bound=1.0)
flags.DEFINE_integer("density_warmup_epochs", 1, "See --density_warmup.", lower_bound=0)
flags.DEFINE_bool("topk_dense_gradients", False, "topk/gtopk: also sparsify the dense "
                  "gradients, element-wise at --density, instead of allreducing them.")


@flags.validator("density", message="--density must be above 0")
def _positive_density(value):
    return value > 0


@flags.validator("density_warmup", message="--density_warmup must be above 0 (or unset)")
def _positive_warmup_density(value):
    return value is None or value > 0


def init_engine():
    """Starts the engine this process was launched for: Horovod under horovodrun, TensorFlow's
    collective runtime under tfscale.run (TF_CONFIG); nothing in one process."""
    from tfscale import distributed

    distributed.init(FLAGS.gradient_compression)


def embedding_exchange(steps_per_epoch):
    """The model's EmbeddingExchange of --embedding_comm; the top-k ones with the density flags
    (`steps_per_epoch` turns the warm-up epochs into optimizer steps)."""
    exchange_class = exchanges.EXCHANGES[FLAGS.embedding_comm]
    if not issubclass(exchange_class, exchanges.TopKExchange):
        return exchange_class()
    return exchange_class(
        density=FLAGS.density, warmup_density=FLAGS.density_warmup,
        warmup_steps=FLAGS.density_warmup_epochs * (steps_per_epoch or 0),
        dense_gradients=FLAGS.topk_dense_gradients)


def describe_residuals(exchange, model):
    """The line on a top-k exchange's error-feedback residuals (their rows and megabytes per
    rank), None for the other exchanges."""
    if not isinstance(exchange, exchanges.TopKExchange):
        return None
    return exchange.describe_residuals(model.trainable_variables)


def describe(exchange):
    """A few words on the process layout and the gradient exchange."""
    from tfscale import distributed

    if not distributed.is_active():
        return "1 process" + (f", embedding exchange {exchange}"
                              if exchange.acts_in_one_process else "")
    return (f"{distributed.size()} ranks ({distributed.engine_name()} engine) at batch "
            f"{distributed.local_batch_size(FLAGS.batch_size)} each, gradient compression "
            f"{FLAGS.gradient_compression}, embedding exchange {exchange}")
