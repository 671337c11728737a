"""Optimizers for large-embedding models, usable in `model.compile(optimizer=...)`."""

from tfscale.optimizers.fused_adam import FusedAdam

__all__ = ["FusedAdam"]
