"""Optimizers (and the model's matching L2 arguments) built from LargeBatchSettings: one place
that the launcher and the experiments share."""

import keras

from tfscale import tables
from tfscale.optimizers.came import CAME
from tfscale.optimizers.cowclip import CowClip
from tfscale.optimizers.fused_adam import FusedAdam
from tfscale.optimizers.row_sparse_adam import RowSparseAdam

# The optimizers the factory builds, by name ("cowclip": CowClip over Adam).
OPTIMIZERS = {"cowclip": CowClip, "adam": FusedAdam, "came": CAME,
              "adagrad": keras.optimizers.Adagrad, "sgd": keras.optimizers.SGD}


def model_regularization(settings, optimizer_name):
    """The model's L2 arguments: CowClip owns the tables' L2 (their gradients stay row-sparse);
    otherwise the model carries all of it as Keras regularizers."""
    if optimizer_name == "cowclip":
        return {"l2_embedding": 0.0, "l2_wide": 0.0, "l2_linear": settings.l2}
    return {"l2_embedding": settings.l2, "l2_wide": settings.l2, "l2_linear": settings.l2}


def build_optimizer(settings, optimizer_name, warmup_steps, cowclip_mode="faithful"):
    """The optimizer `optimizer_name` with `settings`' learning rates (and CowClip's r, zeta and
    L2); the dense learning rate rises linearly from 1e-8 over `warmup_steps` (keras
    PolynomialDecay, as the official CowClip code), the embedding one is constant."""
    if optimizer_name not in OPTIMIZERS:
        raise ValueError(f"`optimizer_name={optimizer_name!r}`: give one of "
                         f"{', '.join(OPTIMIZERS)}")
    dense_rate = settings.dense_learning_rate
    if warmup_steps:
        dense_rate = keras.optimizers.schedules.PolynomialDecay(
            1e-8, warmup_steps, settings.dense_learning_rate, power=1.0)
    if optimizer_name == "cowclip":
        embedding_class = RowSparseAdam if cowclip_mode == "scalable" else FusedAdam
        return CowClip(embedding_class(settings.embedding_learning_rate, name="embedding"),
                       FusedAdam(dense_rate, name="dense"), r=settings.r, zeta=settings.zeta,
                       l2=settings.l2, mode=cowclip_mode)
    optimizer_class = OPTIMIZERS[optimizer_name]
    dense_optimizer = optimizer_class(learning_rate=dense_rate, name="dense")
    if dense_rate == settings.embedding_learning_rate:  # one rate, no warm-up: one optimizer
        return dense_optimizer
    optimizer_map = keras.optimizers.OptimizerMap(dense_optimizer)
    embedding_optimizer = optimizer_class(learning_rate=settings.embedding_learning_rate,
                                          name="embedding")
    for pattern in (tables.DEEP_TABLE_PATTERN, tables.WIDE_TABLE_PATTERN):
        optimizer_map[pattern] = embedding_optimizer
    return keras.optimizers.MultiOptimizer(optimizer_map)


def warmup_steps_for(settings, steps_per_epoch):
    """`settings.warmup_epochs` in steps (None if the epoch length is unknown and a warm-up is
    asked for)."""
    if not settings.warmup_epochs:
        return 0
    if steps_per_epoch is None:
        return None
    return max(1, round(settings.warmup_epochs * steps_per_epoch))
