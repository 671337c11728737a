"""Optimizer flags and what they resolve to: the large-batch rule's hyper-parameters for the
batch size (tfscale.optimizers.scaling), each overridable by its own flag, then the optimizer
built from them (tfscale.optimizers.factory)."""

import dataclasses

from absl import flags

from tfscale.optimizers.factory import EMBEDDING_UPDATES, OPTIMIZERS
from tfscale.optimizers.scaling import PRESETS, RULES

FLAGS = flags.FLAGS

flags.DEFINE_enum("optimizer", None, list(OPTIMIZERS),
                  "cowclip: CowClip over Adam (tfscale.optimizers.CowClip); adam: Adam "
                  "(tfscale.optimizers.RowSparseAdam; FusedAdam for the dense weights); came: "
                  "CAME (tfscale.optimizers.CAME for the dense weights, RowSparseCAME for the "
                  "tables, by row); adagrad, sgd: Keras's, tables by row; rowwise_adagrad: "
                  "row-wise Adagrad for the tables (tfscale.optimizers.RowWiseAdagrad, one "
                  "accumulator a row), Adam for the dense weights. Default: the one "
                  "--scaling_rule goes with (cowclip for cowclip, else adam).")
flags.DEFINE_enum("scaling_rule", None, list(RULES),
                  "Large-batch rule giving the hyper-parameters for --batch_size (see "
                  "tfscale.optimizers.scaling): cowclip (CowClip's, with --optimizer=cowclip "
                  "only) or none/sqrt/linear (both learning rates x 1, sqrt(s) or s, s = "
                  "batch/1024). Default: with --optimizer unset, the preset's (the rule that "
                  "kept AUC best on its data: cowclip for criteo and avazu, sqrt for synthetic); "
                  "with --optimizer=cowclip, cowclip; with another optimizer, no rule, only the "
                  "flags below.")
flags.DEFINE_enum("scaling_preset", None, list(PRESETS),
                  "Base of the rule (tuned at batch 1024) (default: the one named as --data: criteo and "
                  "avazu are CowClip's published bases for the real data sets, synthetic the "
                  "base tuned on the built-in data, and --data=drifting's too).")
flags.DEFINE_integer("base_batch_size", None,
                     "The batch your own base was tuned at: the rule scales --base_learning_rate, "
                     "--base_embedding_learning_rate and --base_l2 from it to --batch_size (each "
                     "unset one: the preset's value, tuned at 1024). Default: 1024.",
                     lower_bound=1)
flags.DEFINE_float("base_learning_rate", None,
                   "Your own base's dense learning rate at --base_batch_size, scaled by the rule "
                   "(--learning_rate instead sets the rate at --batch_size, unscaled).")
flags.DEFINE_float("base_embedding_learning_rate", None,
                   "Your own base's embedding learning rate at --base_batch_size, scaled by the "
                   "rule.")
flags.DEFINE_float("base_l2", None, "Your own base's L2 strength at --base_batch_size, scaled by "
                   "the rule (CowClip's: linearly).", lower_bound=0.0)
flags.DEFINE_enum("embedding_update", "row", list(EMBEDDING_UPDATES),
                  "row: each step updates only the batch's rows of every table and of its "
                  "optimizer state, with --l2 on those rows (RowSparseAdam, RowSparseAdagrad, "
                  "RowSparseCAME, RowSparseSGD; CowClip's scalable mode): a step's cost follows "
                  "the batch. dense: every row every step, --l2 as a regularizer on whole tables "
                  "(the papers' update; CowClip's faithful mode, the official code's; CAME's "
                  "statistics over every row): a step's cost follows the table (CAME on DeepFM "
                  "at batch 8,192: 2.09x and 2.64x the row update's step in two runs, "
                  "docs/results/came.md).")
flags.DEFINE_float("learning_rate", None, "Dense learning rate (default: the rule's, else 1e-3; "
                   "for came, the best of a sweep at batch 8,192, docs/results/came.md).")
flags.DEFINE_float("embedding_learning_rate", None,
                   "Embedding learning rate (default: the rule's, else --learning_rate).")
flags.DEFINE_float("l2", None, "L2 strength on the embedding tables, wide tables and the dense "
                   "features' linear kernel (default: the rule's, else 0).", lower_bound=0.0)
flags.DEFINE_float("zeta", None, "CowClip's lower bound on the row weight norm, in units of "
                   "r*sqrt(d) (default: the preset's).", lower_bound=0.0)
flags.DEFINE_float("clip_r", None, "CowClip's clip ratio r (default 1; at least twice --l2).")
flags.DEFINE_float("warmup_epochs", None, "Linear warm-up of the dense learning rate, in epochs "
                   "(default: the rule's 1, else 0).", lower_bound=0.0)
flags.DEFINE_integer("warmup_steps", None, "The same in steps (overrides --warmup_epochs; a "
                     "file's epoch length is counted in one pass over it before training).",
                     lower_bound=0)
flags.DEFINE_float("embedding_init_stddev", None, "Stddev of the normal embedding initialiser "
                   "(default: the preset's).", lower_bound=0.0)

for _name in ("learning_rate", "embedding_learning_rate", "clip_r", "base_learning_rate",
              "base_embedding_learning_rate"):
    flags.register_validator(_name, lambda value: value is None or value > 0,
                             message=f"--{_name} must be above 0")

# Without a rule: the optimizer's plain defaults.
_NO_RULE = dict(rule="flags", embedding_learning_rate=None, warmup_epochs=0.0, l2=0.0,
                embedding_init_stddev=1e-2, clip=False, r=1.0, zeta=1e-5)
_DEFAULT_LEARNING_RATE = 1e-3  # every optimizer's (CAME's too: docs/results/came.md)
_BASE = {"base_batch_size": "batch_size", "base_learning_rate": "dense_learning_rate",
         "base_embedding_learning_rate": "embedding_learning_rate", "base_l2": "l2"}
_OVERRIDES = {"learning_rate": "dense_learning_rate",
              "embedding_learning_rate": "embedding_learning_rate", "l2": "l2", "zeta": "zeta",
              "clip_r": "r", "warmup_epochs": "warmup_epochs",
              "embedding_init_stddev": "embedding_init_stddev"}


# --data whose default preset is another data set's: the drifting stream is the built-in data's
# generator with ids that are born and fade.
_PRESET_OF_DATA = {"drifting": "synthetic"}


def _preset():
    return FLAGS.scaling_preset or _PRESET_OF_DATA.get(FLAGS.data, FLAGS.data)


def _base():
    """The Preset the rule scales from: --scaling_preset's, with the --base_* flags given."""
    given = {field: getattr(FLAGS, flag) for flag, field in _BASE.items()
             if getattr(FLAGS, flag) is not None}
    return dataclasses.replace(PRESETS[_preset()], **given)


def _rule():
    """--scaling_rule, or its default (the flag's help)."""
    if FLAGS.scaling_rule is not None:
        return FLAGS.scaling_rule
    if FLAGS.optimizer is None:
        return PRESETS[_preset()].rule
    return "cowclip" if FLAGS.optimizer == "cowclip" else None


def optimizer_name():
    """--optimizer, or the one the rule goes with."""
    if FLAGS.optimizer is not None:
        return FLAGS.optimizer
    return "cowclip" if _rule() == "cowclip" else "adam"


def resolve_settings():
    """The LargeBatchSettings of this run: the rule's for --batch_size, with every flag given
    replacing its value."""
    from tfscale.errors import UserError
    from tfscale.optimizers.scaling import LargeBatchSettings, large_batch_settings

    rule, optimizer = _rule(), optimizer_name()
    if (rule == "cowclip") != (optimizer == "cowclip"):
        raise UserError("--optimizer=cowclip and --scaling_rule=cowclip go together (got "
                        f"--optimizer={optimizer}, --scaling_rule={rule})")
    if rule is None:
        given = [f"--{flag}" for flag in _BASE if getattr(FLAGS, flag) is not None]
        if given:
            verb = "gives" if len(given) == 1 else "give"
            raise UserError(f"{', '.join(given)} {verb} a base for a rule to scale, and "
                            f"--optimizer={optimizer} runs without one: add --scaling_rule "
                            "(sqrt, linear, none; cowclip with --optimizer=cowclip)")
        settings = LargeBatchSettings(
            batch_size=FLAGS.batch_size,
            dense_learning_rate=_DEFAULT_LEARNING_RATE, **_NO_RULE)
    else:
        settings = large_batch_settings(FLAGS.batch_size, rule, _base())
    overrides = {field: getattr(FLAGS, flag) for flag, field in _OVERRIDES.items()
                 if getattr(FLAGS, flag) is not None}
    settings = dataclasses.replace(settings, **overrides)
    if settings.embedding_learning_rate is None:
        settings = dataclasses.replace(settings, embedding_learning_rate=settings.dense_learning_rate)
    return settings


def check_table_l2(settings, row_gradient_flags):
    """Refuses L2 on the tables as a Keras regularizer (--embedding_update=dense but with
    CowClip, which applies it to the batch's rows), whose dense gradient `row_gradient_flags`
    cannot take."""
    from tfscale.errors import UserError
    from tfscale.optimizers.factory import model_regularization

    optimizer = optimizer_name()
    if row_gradient_flags and model_regularization(
            settings, optimizer, FLAGS.embedding_update)["l2_embedding"] > 0:
        source = "" if FLAGS.l2 is not None else f" (the {settings.rule} rule's)"
        verb = "needs" if len(row_gradient_flags) == 1 else "need"
        raise UserError(
            f"{' and '.join(row_gradient_flags)} {verb} the tables' gradients as rows, and "
            f"--l2={settings.l2:g}{source} with --optimizer={optimizer} is a regularizer on "
            "whole tables: give --embedding_update=row (which applies --l2 to the batch's "
            "rows) or --l2=0")


def describe(settings):
    """One line naming every resolved hyper-parameter."""
    text = (f"rule {settings.rule}: embedding lr {settings.embedding_learning_rate:g}, dense lr "
            f"{settings.dense_learning_rate:g} (warm-up {settings.warmup_epochs:g} epochs), "
            f"l2 {settings.l2:g}, init stddev {settings.embedding_init_stddev:g}")
    if settings.clip:
        text += f", CowClip r {settings.r:g} zeta {settings.zeta:g}"
    return text + f", embedding update {FLAGS.embedding_update}"


def build_optimizer(settings, steps_per_epoch):
    """The optimizer of --optimizer with `settings` and the warm-up of the flags."""
    from tfscale.errors import UserError
    from tfscale.optimizers import factory

    warmup_steps = FLAGS.warmup_steps
    if warmup_steps is None:
        warmup_steps = factory.warmup_steps_for(settings, steps_per_epoch)
    if warmup_steps is None:
        raise UserError(f"a warm-up of {settings.warmup_epochs:g} epochs needs the epoch length, "
                        "which this data source does not know: give --warmup_steps")
    try:
        return factory.build_optimizer(settings, optimizer_name(), warmup_steps,
                                       FLAGS.embedding_update, rounding_seed=FLAGS.seed)
    except ValueError as error:  # an optimizer's own argument check, told in flags
        raise UserError(str(error)) from None
