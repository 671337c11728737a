"""Optimizers for large-embedding models, usable in `model.compile(optimizer=...)`: CowClip and
its large-batch rule (`scaling`), CAME, FusedAdam, the row-sparse optimizers that update only a
batch's rows of each embedding table (RowSparseAdam, RowSparseAdagrad, RowSparseCAME,
RowSparseSGD, and RowWiseAdagrad with one accumulator a row), and the loss scaler for float16
training."""

from tfscale.optimizers.came import CAME
from tfscale.optimizers.capabilities import TakesCountedSlices, TakesRowSlices
from tfscale.optimizers.cowclip import CowClip
from tfscale.optimizers.fused_adam import FusedAdam
from tfscale.optimizers.loss_scaling import LossScaleOptimizer
from tfscale.optimizers.row_sparse_adagrad import RowSparseAdagrad
from tfscale.optimizers.row_sparse_adam import RowSparseAdam
from tfscale.optimizers.row_sparse_came import RowSparseCAME
from tfscale.optimizers.row_sparse_sgd import RowSparseSGD
from tfscale.optimizers.rowwise_adagrad import RowWiseAdagrad
from tfscale.optimizers.scaling import PRESETS, LargeBatchSettings, Preset, large_batch_settings

__all__ = ["CAME", "CowClip", "FusedAdam", "LargeBatchSettings", "LossScaleOptimizer", "PRESETS",
           "Preset", "RowSparseAdagrad", "RowSparseAdam", "RowSparseCAME", "RowSparseSGD",
           "RowWiseAdagrad", "TakesCountedSlices", "TakesRowSlices", "large_batch_settings"]
