"""Training: the train step (train_step), the run of epochs with evaluation and checkpoints
(run; the checkpoints themselves are tfscale.checkpoints'), online training day by day
(progressive), the epoch loop both run (epochs), their callbacks, exact evaluation and the
precision policy. `train`, `train_progressively` and their configurations are the package's
public entry; `evaluate_exact`, the AUC and log loss of every row over all ranks."""

from tfscale.training.progressive import (ProgressiveConfig, ProgressiveResult, check_days,
                                          train_progressively)
from tfscale.training.evaluation import evaluate_exact
from tfscale.training.run import TrainingConfig, TrainingResult, build_model_and_optimizer, train

__all__ = ["ProgressiveConfig", "ProgressiveResult", "TrainingConfig", "TrainingResult", "check_days",
           "build_model_and_optimizer", "evaluate_exact", "train", "train_progressively"]
