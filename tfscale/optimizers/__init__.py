"""Optimizers for large-embedding models, usable in `model.compile(optimizer=...)`."""

from tfscale.optimizers.came import CAME
from tfscale.optimizers.cowclip import CowClip
from tfscale.optimizers.fused_adam import FusedAdam
from tfscale.optimizers.row_sparse_adam import RowSparseAdam

__all__ = ["CAME", "CowClip", "FusedAdam", "RowSparseAdam"]
