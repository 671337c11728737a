"""tfscale: fast large-batch and multi-worker training for CTR and other large-embedding Keras
models (TensorFlow 2.21, Keras 3).

The public surface:
- `tfscale.optimizers`: CowClip, CAME, FusedAdam, RowSparseAdam, LossScaleOptimizer, the
  large-batch scaling rules;
- `tfscale.TrainStepModel` / `tfscale.FunctionalTrainStepModel`: Keras models whose train step
  exchanges gradients between Horovod ranks (`compile(embedding_exchange=...,
  embedding_staleness=...)`);
- `tfscale.FieldEmbedding`: one concatenated embedding table per kind for many categorical
  fields, in host memory, with de-duplicated lookups, replicated or row-sharded over the ranks
  (`sharding="row"`; `tfscale.initializers.RowSeededNormal` starts both alike);
- `tfscale.exchanges`: the gradient exchanges and their registry;
- `tfscale.callbacks`: Keras callbacks, among them `CatchUpRows` (RowSparseAdam's rows brought
  up to date at each epoch's end);
- `tfscale.distributed`: Horovod start-up (`init`) and collectives; `tfscale.data`: CTR data
  sources and `rank_batches` (each rank its part of the data); `tfscale.serving.export_model`:
  a model as one SavedModel from a multi-rank run's checkpoint (docs/own_model.md);
  `tfscale.training.train`: epochs with evaluation, TensorBoard scalars and atomic checkpoints.
The packages: `embedding` (tables, their strategies, lookups, initializers), `optimizers`,
`exchanges`, `distributed`, `data`, `training` (the train step, the run, callbacks,
checkpoints, evaluation), `serving` (prediction, export); docs/architecture.md.
The reference models (`models/`) and the launcher (`launch/`) live in the repository, not in the
installed package."""

from tfscale import data, distributed, exchanges, optimizers, serving
from tfscale.embedding import initializers
from tfscale.embedding.field_embedding import FieldEmbedding
from tfscale.errors import UserError
from tfscale.training import callbacks
from tfscale.training.train_step import FunctionalTrainStepModel, TrainStepModel

__version__ = "0.1.0"

__all__ = ["FieldEmbedding", "FunctionalTrainStepModel", "TrainStepModel", "UserError",
           "callbacks", "data", "distributed", "exchanges", "initializers", "optimizers",
           "serving"]
