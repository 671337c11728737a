"""Precision flags (tfscale.training.precision): the model's dtype policy and the optimizer's loss
scaling."""

from absl import flags

from tfscale.embedding.table_dtypes import TABLE_DTYPES
from tfscale.training.precision import PRECISIONS

FLAGS = flags.FLAGS

flags.DEFINE_enum("precision", "float32", list(PRECISIONS),
                  "Keras dtype policy of the model: float32 variables and, for mixed_*, float16 or "
                  "bfloat16 compute. Embedding tables (unless --table_dtype), the final sigmoid, "
                  "the loss and all optimizer state stay float32.")
flags.DEFINE_enum("table_dtype", "float32", list(TABLE_DTYPES),
                  "What the embedding tables store their rows in: bfloat16 and float16 take half "
                  "the bytes of float32; rows are read and updated in float32 and written back "
                  "with stochastic rounding (seeded by --seed), by row: with --embedding_update="
                  "row and an optimizer that updates tables by row (every --optimizer does).")
flags.DEFINE_string("loss_scale", None,
                    "'dynamic' (start 2^15, halve and skip on inf/NaN, double after "
                    "--loss_scale_growth_steps finite steps), a fixed number (inf/NaN steps are "
                    "still skipped), or 'none'. Default: dynamic for mixed_float16, else none.")
flags.DEFINE_integer("loss_scale_growth_steps", 2000,
                     "Finite steps in a row after which a dynamic loss scale doubles.",
                     lower_bound=1)


@flags.validator("loss_scale")
def _known_loss_scale(text):
    from tfscale.training.precision import parse_loss_scale

    try:
        parse_loss_scale(text, "float32")
    except ValueError as error:
        raise flags.ValidationError(str(error)) from None
    return True


def dtype_policy():
    """The dtype policy name for the model."""
    from tfscale.training.precision import dtype_policy as policy

    return policy(FLAGS.precision)


def with_loss_scaling(optimizer):
    """`optimizer` wrapped in the loss scaling the flags ask for (or unchanged); the flag's
    value was checked when the flags were parsed."""
    from tfscale.training.precision import parse_loss_scale, with_loss_scaling as wrap

    return wrap(optimizer, parse_loss_scale(FLAGS.loss_scale, FLAGS.precision),
                FLAGS.loss_scale_growth_steps)


def cpu_float16_warning():
    """A warning when --precision=mixed_float16 runs with no GPU, else None: CPUs have no
    float16 arithmetic that TensorFlow uses to speed training up, and on some (Xeons with AMX,
    docs/mixed_precision.md) TF 2.21's float16 Keras layers run 100-500x slower than float32."""
    from tfscale.embedding import placement

    if FLAGS.precision != "mixed_float16" or placement.dense_device() != placement.HOST_DEVICE:
        return None
    return ("warning: --precision=mixed_float16 with no GPU: float16 gives no speed-up on a CPU "
            "and on some CPUs (Xeons with AMX) TensorFlow 2.21's float16 layers run 100-500x "
            "slower than float32; --precision=mixed_bfloat16 is the CPU's mixed precision")


def describe():
    """A few words naming the precision and the loss scaling."""
    from tfscale.training.precision import parse_loss_scale

    scale = parse_loss_scale(FLAGS.loss_scale, FLAGS.precision)  # the one place for the default
    return f"precision {FLAGS.precision}, loss scale {scale or 'none'}"
