"""Serving a trained model: every line of a file scored in order (prediction), the SavedModel
that scores raw lines with TensorFlow alone (export), and a user's own model as a SavedModel
from a multi-rank run's checkpoint (model_export)."""

from tfscale.serving.model_export import export_model

__all__ = ["export_model"]
