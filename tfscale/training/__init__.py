"""Training: the train step (train_step), the run of epochs with evaluation and checkpoints
(run), its callbacks, checkpoints (checkpoints, table_checkpoints), exact evaluation and the
precision policy. `train` and its configuration are the package's public entry."""

from tfscale.training.run import TrainingConfig, TrainingResult, build_model_and_optimizer, train

__all__ = ["TrainingConfig", "TrainingResult", "build_model_and_optimizer", "train"]
