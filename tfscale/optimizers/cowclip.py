"""CowClip (Zheng et al., AAAI 2023): adaptive column-wise clipping of embedding gradients, one
threshold per embedding row (per id), and the optimizer that applies it.

For each row of a clipped table (docs/cowclip.md):
    g   = the id's gradient summed over its occurrences in the (global) batch (+ 2*l2*w)
    cnt = the id's occurrences in the batch (1 for rows not in it)
    g  <- g * min(1, r * cnt * max(||w||, r * sqrt(d) * zeta) / ||g||)

`CowClip` is a keras.optimizers.MultiOptimizer: embedding tables go to `embedding_optimizer`
after the clip (and the optimizer-owned whole-table L2), every other variable to
`dense_optimizer`. Width-1 (linear, "wide") tables get the L2 and the embedding optimizer but no
clip, as in the official code. Two modes:
  scalable (the default): only the rows in the batch get L2, clip and update (with
            RowSparseAdam), so a step costs O(batch ids) instead of O(table rows); a row is
            caught up when next in a batch with what the faithful update did to it meanwhile
            (its L2, never clipped, and Adam's moments: RowSparseAdam's catch-up). An
            approximation of the paper's update (docs/cowclip.md);
  faithful: the official code's update: the gradient is dense over every row every step (L2
            moves all rows; rows absent from the batch are never clipped since 2*l2 << r), so
            a step's cost grows with the tables.
"""

import math
import re

import keras
import tensorflow as tf

from tfscale.embedding.strategies import is_table
from tfscale.embedding.table_dtypes import arithmetic_dtype
from tfscale.embedding.table_names import gather_rows
from tfscale.optimizers.averaged import RefusesUnaveragedGradients
from tfscale.optimizers.capabilities import (TakesCountedSlices, TakesRowSlices,
                                             updates_rows_in_place)
from tfscale.optimizers.fused_adam import FusedAdam
from tfscale.optimizers.row_sparse_adam import RowSparseAdam
from tfscale.row_gradients import CountedSlices, densify, sum_duplicate_rows, with_values

MODES = ("faithful", "scalable")


def clip_factors(gradient_rows, weight_rows, counts, r, zeta):
    """Per row min(1, threshold / ||g||) with threshold = r * cnt * max(||w||, r*sqrt(d)*zeta);
    1 for an all-zero gradient row."""
    floor = r * math.sqrt(int(weight_rows.shape[-1])) * zeta
    gradient_norm = tf.norm(gradient_rows, axis=-1)
    threshold = r * counts * tf.maximum(tf.norm(weight_rows, axis=-1), floor)
    safe_norm = tf.where(gradient_norm > 0, gradient_norm, tf.ones_like(gradient_norm))
    return tf.where(gradient_norm > threshold, threshold / safe_norm, tf.ones_like(gradient_norm))


def _check_table_l2(embedding_optimizer, l2, mode):
    """Refuses an embedding optimizer that would add the tables' L2 a second time, or (in the
    scalable mode, where it takes the batch's rows) catch absent rows up with another L2 than
    CowClip's `l2`."""
    if getattr(embedding_optimizer, "table_l2", 0):
        raise ValueError(
            f"`embedding_optimizer` has table_l2={embedding_optimizer.table_l2}, but CowClip adds "
            "the tables' L2 itself (its `l2`, before clipping): give the embedding optimizer no "
            "table_l2")
    if (mode == "scalable" and getattr(embedding_optimizer, "catch_up", False)
            and embedding_optimizer.catch_up_l2 != l2):
        raise ValueError(
            f"`embedding_optimizer` catches absent rows up with catch_up_l2="
            f"{embedding_optimizer.catch_up_l2} but CowClip's `l2={l2}`: give "
            f"RowSparseAdam(catch_up_l2={l2}) (or catch_up=False for lazy Adam)")


@keras.saving.register_keras_serializable(package="tfscale")
class CowClip(RefusesUnaveragedGradients, TakesCountedSlices, keras.optimizers.MultiOptimizer):
    """CowClip over an embedding optimizer and a dense optimizer, for `model.compile`.

    Args:
        embedding_optimizer: optimizer of the embedding tables (default: Adam 1e-4,
            RowSparseAdam(catch_up_l2=l2), or FusedAdam when `mode="faithful"`). CowClip adds
            the tables' L2 to the batch's rows itself, before clipping, so a row-sparse
            embedding optimizer takes no `table_l2`, and a catching-up RowSparseAdam pulls the
            rows absent from batches with `catch_up_l2=l2`, as the faithful update does.
        dense_optimizer: optimizer of every other variable (default FusedAdam 1e-3).
        r: clip ratio (1 in the paper).
        zeta: lower bound of the weight norm, in units of r*sqrt(d) (Criteo 1e-5).
        l2: whole-table L2 strength on the embedding tables, owned here so their gradients stay
            row-sparse (give the model no embedding regularizer).
        mode: "faithful" or "scalable" (module docstring); default: scalable when the embedding
            optimizer updates tables by row (a tfscale row-sparse optimizer, as by default),
            faithful otherwise.
        embedding_tables: regexes (re.fullmatch on variable.path) naming the embedding tables,
            e.g. tfscale.embedding.table_names' DEEP_TABLE_PATTERN; default: every embedding
            table (tfscale.embedding.strategies.table_of: FieldEmbedding's, whatever their
            strategy, and keras.layers.Embedding's).
        loss_scale_factor: as `keras.optimizers.Optimizer`'s, given to both optimizers too.
        name: the optimizer's name.

    Raises:
        ValueError: `mode` is not "faithful" or "scalable"; `r` is not above 0, `zeta` or `l2`
            negative, any of them not finite; `2 * l2 > r`; `embedding_optimizer` has a
            `table_l2`, or, in the scalable mode, catches rows up with a `catch_up_l2` other
            than `l2`; at `apply`, an embedding table's gradient is a dense tensor.
        UserError: at `apply`, in a horovodrun job of two or more ranks, for gradients that
            tfscale's train step did not average (a plain keras.Model).

    Its gradients for embedding tables must arrive as IndexedSlices (one row per occurrence,
    as tf.gather's gradient does) or as CountedSlices (one row per unique id with its count, from
    de-duplicated lookups), which is how the per-id counts are known; under Horovod they must be
    the global batch's.

    Example:
        ```python
        settings = tfscale.optimizers.large_batch_settings(65536, rule="cowclip")
        model.compile(optimizer=tfscale.optimizers.CowClip(
                          keras.optimizers.Adam(settings.embedding_learning_rate),
                          keras.optimizers.Adam(settings.dense_learning_rate),
                          r=settings.r, zeta=settings.zeta, l2=settings.l2),
                      loss="binary_crossentropy", embedding_exchange="allgather")
        ```
    """

    def __init__(self, embedding_optimizer=None, dense_optimizer=None, r=1.0, zeta=1e-5, l2=0.0,
                 mode=None, embedding_tables=None, loss_scale_factor=None, name="cowclip"):
        if mode is None:
            mode = ("faithful" if embedding_optimizer is not None
                    and not isinstance(embedding_optimizer, TakesRowSlices) else "scalable")
        if mode not in MODES:
            raise ValueError(f"`mode={mode!r}`: give one of {', '.join(MODES)}")
        for argument, value, allowed in (("r", r, r > 0), ("zeta", zeta, zeta >= 0),
                                         ("l2", l2, l2 >= 0)):
            if not (allowed and math.isfinite(value)):
                raise ValueError(f"`{argument}={value}`: give a finite number "
                                 f"{'above 0' if argument == 'r' else 'of 0 or more'}")
        if 2 * l2 > r:
            raise ValueError(f"`l2={l2}` with `r={r}`: CowClip needs 2*l2 <= r (rows absent "
                             "from a batch are then never clipped, which the faithful update "
                             "relies on); lower `l2` or raise `r`")
        if embedding_optimizer is None:
            embedding_optimizer = (
                FusedAdam(learning_rate=1e-4, name="embedding") if mode == "faithful"
                else RowSparseAdam(learning_rate=1e-4, catch_up_l2=l2, name="embedding"))
        _check_table_l2(embedding_optimizer, l2, mode)
        if dense_optimizer is None:
            dense_optimizer = FusedAdam(learning_rate=1e-3, name="dense")
        super().__init__(self._optimizer_for, loss_scale_factor=loss_scale_factor, name=name)
        self.embedding_optimizer = embedding_optimizer
        self.dense_optimizer = dense_optimizer
        self._inner_optimizers = [embedding_optimizer, dense_optimizer]
        for optimizer in self._inner_optimizers:
            optimizer.loss_scale_factor = loss_scale_factor
        self.r = float(r)
        self.zeta = float(zeta)
        self.l2 = float(l2)
        self.mode = mode
        self.embedding_tables = None if embedding_tables is None else list(embedding_tables)
        self._clip_statistics = {}  # clipped table path -> (fraction clipped, mean factor) variables

    # ----- which variable is what

    def is_embedding_table(self, variable):
        """Whether `variable` goes to the embedding optimizer (after L2 and, wider than 1, the
        clip): the variables whose path `embedding_tables` fully matches when given, else every
        embedding table (tfscale.embedding.strategies.table_of).

        Args:
            variable: one of the model's trainable variables.

        Returns:
            A bool."""
        if self.embedding_tables is not None:
            return any(re.fullmatch(p, variable.path) for p in self.embedding_tables)
        return is_table(variable)

    def is_clipped_table(self, variable):
        """Embedding tables wider than 1 are clipped; 1-wide linear tables are not.

        Args:
            variable: one of the model's trainable variables.

        Returns:
            Whether CowClip clips `variable`'s gradient rows."""
        return self.is_embedding_table(variable) and len(variable.shape) == 2 and variable.shape[-1] > 1

    def updates_rows_in_place(self, variable):
        return (self.mode == "scalable" and self.is_embedding_table(variable)
                and updates_rows_in_place(self.embedding_optimizer, variable))

    @property
    def keeps_half_precision_rows(self):
        """Whether its embedding optimizer keeps half-precision tables' rows (row updates)."""
        return getattr(self.embedding_optimizer, "keeps_half_precision_rows", False)

    def _optimizer_for(self, variable):
        return self.embedding_optimizer if self.is_embedding_table(variable) else self.dense_optimizer

    # ----- building and applying

    def build(self, var_list):
        if self.built:
            return
        for variable in var_list:
            if self.is_clipped_table(variable):
                name = variable.path.replace("/", "_")
                self._clip_statistics[variable.path] = (
                    self.add_variable((), initializer="zeros", name=f"{name}_clipped_fraction"),
                    self.add_variable((), initializer="ones", name=f"{name}_mean_clip_factor"),
                )
        super().build(var_list)

    def apply(self, grads, trainable_variables=None):
        if trainable_variables is None:
            trainable_variables = self._trainable_variables
        if not self.built:
            self.build(trainable_variables)
        grads = [self._table_gradient(g, v) if self.is_embedding_table(v) else densify(g)
                 for g, v in zip(grads, trainable_variables)]
        super().apply(grads, trainable_variables)

    def _table_gradient(self, gradient, table):
        """The L2-added, clipped (for clipped tables) gradient of one embedding table: dense in
        faithful mode, IndexedSlices of its unique batch rows in scalable mode."""
        if not isinstance(gradient, tf.IndexedSlices):
            raise ValueError(
                f"CowClip needs the gradient of embedding table {table.path} as IndexedSlices (row "
                "ids and their counts) but got a dense tensor: give the table no regularizer (pass "
                "l2= to CowClip instead) and look it up with a gather (keras.layers.Embedding)")
        dtype = arithmetic_dtype(table.dtype)
        gradient = with_values(gradient, tf.cast(gradient.values, dtype))
        ids, rows, counts = sum_duplicate_rows(gradient)
        weight_rows = tf.cast(gather_rows(table, ids, in_place=self.updates_rows_in_place(table)),
                              dtype)
        if self.l2:
            rows += 2 * self.l2 * weight_rows
        if self.is_clipped_table(table):
            factors = clip_factors(rows, weight_rows, counts, self.r, self.zeta)
            rows *= factors[:, None]
            self._record_statistics(table, factors)
        shape = tf.constant(list(table.shape), tf.int64)
        if self.mode == "scalable":
            return CountedSlices(rows, ids, shape, counts, unique_ids=True)
        if not self.l2:
            return tf.scatter_nd(ids[:, None], rows, shape)
        # Every other row's gradient is its L2 term alone, 2*l2*w with count 1, which is never
        # clipped since 2*l2 <= r (checked in __init__): ||2*l2*w|| <= r*max(||w||, floor).
        return tf.tensor_scatter_nd_update(2 * self.l2 * tf.convert_to_tensor(table),
                                           ids[:, None], rows)

    def _record_statistics(self, table, batch_row_factors):
        fraction, mean_factor = self._clip_statistics[table.path]
        fraction.assign(tf.reduce_mean(tf.cast(batch_row_factors < 1, tf.float32)))
        mean_factor.assign(tf.reduce_mean(batch_row_factors))

    def summary_scalars(self):
        """{name: value} for TensorBoard: per clipped table, the fraction of its batch rows that
        were clipped and their mean clip factor, at the last step.

        Returns:
            A dict from scalar name to float."""
        scalars = {}
        for path, (fraction, mean_factor) in self._clip_statistics.items():
            scalars[f"cowclip/{path}/clipped_fraction"] = float(fraction.numpy())
            scalars[f"cowclip/{path}/mean_clip_factor"] = float(mean_factor.numpy())
        return scalars

    # ----- serialisation

    def get_config(self):
        return {
            "embedding_optimizer": keras.optimizers.serialize(self.embedding_optimizer),
            "dense_optimizer": keras.optimizers.serialize(self.dense_optimizer),
            "r": self.r, "zeta": self.zeta, "l2": self.l2, "mode": self.mode,
            "embedding_tables": self.embedding_tables,
            "loss_scale_factor": self.loss_scale_factor, "name": self.name,
        }

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        for key in ("embedding_optimizer", "dense_optimizer"):
            config[key] = keras.optimizers.deserialize(config[key], custom_objects=custom_objects)
        return cls(**config)
