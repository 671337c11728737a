"""Optimizers (and the model's matching L2 arguments) built from LargeBatchSettings: one place
that the launcher and the experiments share.

Embedding tables are updated by row by default (`embedding_update="row"`): the batch's rows of
each table and of its optimizer state, with the tables' L2 applied by the optimizer to those
rows, so a step's cost follows the batch, not the table (tfscale.optimizers.row_updates).
`embedding_update="dense"` is the papers' update of every row every step, with the L2 as a Keras
regularizer on whole tables (CowClip's faithful mode, the official code's). Where the tables
and the dense weights take optimizers of their own, a MultiOptimizer over `TablesApart` sends
each embedding table (tfscale.embedding.strategies.table_of, whatever its variable's name) to
the tables' one."""

import keras

from tfscale.embedding.strategies import is_table
from tfscale.optimizers.came import CAME
from tfscale.optimizers.cowclip import CowClip
from tfscale.optimizers.fused_adam import FusedAdam
from tfscale.optimizers.row_sparse_adagrad import RowSparseAdagrad
from tfscale.optimizers.row_sparse_adam import RowSparseAdam
from tfscale.optimizers.row_sparse_came import RowSparseCAME
from tfscale.optimizers.row_sparse_sgd import RowSparseSGD
from tfscale.optimizers.rowwise_adagrad import RowWiseAdagrad

# The optimizers the factory builds, by name ("cowclip": CowClip over Adam): the dense weights'
# optimizer, and the tables' when they are updated by row ("rowwise_adagrad": row-wise Adagrad
# for the tables, updated by row or whole, and Adam for the dense weights).
OPTIMIZERS = {"cowclip": CowClip, "adam": FusedAdam, "came": CAME,
              "adagrad": keras.optimizers.Adagrad, "sgd": keras.optimizers.SGD,
              "rowwise_adagrad": FusedAdam}
ROW_OPTIMIZERS = {"adam": RowSparseAdam, "came": RowSparseCAME, "adagrad": RowSparseAdagrad,
                  "sgd": RowSparseSGD, "rowwise_adagrad": RowWiseAdagrad}
# The tables' optimizer when they are updated whole, where it is not the dense weights'.
WHOLE_TABLE_OPTIMIZERS = {"rowwise_adagrad": RowWiseAdagrad}
EMBEDDING_UPDATES = ("row", "dense")


def model_regularization(settings, optimizer_name, embedding_update="row"):
    """The model's L2 arguments: with row updates (and with CowClip, which owns its tables' L2)
    the optimizer applies the tables' L2 and the model carries only the dense features' linear
    one; with dense updates the model carries all of it as Keras regularizers."""
    _check_embedding_update(embedding_update)
    if optimizer_name == "cowclip" or embedding_update == "row":
        return {"l2_embedding": 0.0, "l2_wide": 0.0, "l2_linear": settings.l2}
    return {"l2_embedding": settings.l2, "l2_wide": settings.l2, "l2_linear": settings.l2}


def build_optimizer(settings, optimizer_name, warmup_steps, embedding_update="row",
                    rounding_seed=0):
    """The optimizer `optimizer_name` with `settings`' learning rates (and CowClip's r, zeta and
    L2), updating the tables as `embedding_update` says (module docstring); the dense learning
    rate rises linearly from 1e-8 over `warmup_steps` (keras PolynomialDecay, as the official
    CowClip code), the embedding one is constant. `rounding_seed`: the row-sparse optimizer's
    seed for half-precision tables (tfscale.optimizers.row_updates)."""
    if optimizer_name not in OPTIMIZERS:
        raise ValueError(f"`optimizer_name={optimizer_name!r}`: give one of "
                         f"{', '.join(OPTIMIZERS)}")
    _check_embedding_update(embedding_update)
    dense_rate = settings.dense_learning_rate
    if warmup_steps:
        dense_rate = keras.optimizers.schedules.PolynomialDecay(
            1e-8, warmup_steps, settings.dense_learning_rate, power=1.0)
    if optimizer_name == "cowclip":
        mode = "scalable" if embedding_update == "row" else "faithful"
        embedding = (RowSparseAdam(settings.embedding_learning_rate, catch_up_l2=settings.l2,
                                   rounding_seed=rounding_seed, name="embedding")
                     if mode == "scalable"
                     else FusedAdam(settings.embedding_learning_rate, name="embedding"))
        return CowClip(embedding,
                       FusedAdam(dense_rate, name="dense"), r=settings.r, zeta=settings.zeta,
                       l2=settings.l2, mode=mode)
    if embedding_update == "row":
        table_class = ROW_OPTIMIZERS[optimizer_name]
        one_rate = dense_rate == settings.embedding_learning_rate
        if one_rate and issubclass(table_class, OPTIMIZERS[optimizer_name]):
            return table_class(learning_rate=dense_rate, table_l2=settings.l2,
                               rounding_seed=rounding_seed)
        table_optimizer = table_class(learning_rate=settings.embedding_learning_rate,
                                      table_l2=settings.l2, rounding_seed=rounding_seed,
                                      name="embedding")
        dense_optimizer = OPTIMIZERS[optimizer_name](learning_rate=dense_rate, name="dense")
        return _tables_apart(dense_optimizer, table_optimizer)
    optimizer_class = OPTIMIZERS[optimizer_name]
    table_class = WHOLE_TABLE_OPTIMIZERS.get(optimizer_name, optimizer_class)
    dense_optimizer = optimizer_class(learning_rate=dense_rate, name="dense")
    if dense_rate == settings.embedding_learning_rate and table_class is optimizer_class:
        return dense_optimizer  # one rate, no warm-up: one optimizer
    return _tables_apart(dense_optimizer, table_class(
        learning_rate=settings.embedding_learning_rate, name="embedding"))


@keras.saving.register_keras_serializable(package="tfscale")
class TablesApart(keras.optimizers.OptimizerMap):
    """A keras.optimizers.OptimizerMap holding the tables' optimizer under the key TABLES: every
    embedding table (tfscale.embedding.strategies.table_of) goes to it, every other variable to
    the default optimizer.

    Example:
        ```python
        tables_apart = TablesApart(FusedAdam(1e-3), {TABLES: RowSparseAdam(1e-2)})
        optimizer = keras.optimizers.MultiOptimizer(tables_apart)
        ```
    """

    def __call__(self, variable):
        return self[TABLES] if is_table(variable) else self.default_optimizer


TABLES = "tables"


def _tables_apart(dense_optimizer, table_optimizer):
    """A Keras MultiOptimizer: `table_optimizer` for the embedding tables, `dense_optimizer` for
    every other variable."""
    return keras.optimizers.MultiOptimizer(TablesApart(dense_optimizer, {TABLES: table_optimizer}))


def _check_embedding_update(embedding_update):
    if embedding_update not in EMBEDDING_UPDATES:
        raise ValueError(f"`embedding_update={embedding_update!r}`: give one of "
                         f"{', '.join(EMBEDDING_UPDATES)}")


def warmup_steps_for(settings, steps_per_epoch):
    """`settings.warmup_epochs` in steps (None if the epoch length is unknown and a warm-up is
    asked for)."""
    if not settings.warmup_epochs:
        return 0
    if steps_per_epoch is None:
        return None
    return max(1, round(settings.warmup_epochs * steps_per_epoch))
