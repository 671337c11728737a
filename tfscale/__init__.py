"""tfscale: fast large-batch and multi-worker training for CTR and other large-embedding Keras
models (TensorFlow 2.21, Keras 3).

The public surface:
- `tfscale.optimizers`: CowClip, CAME, FusedAdam, RowSparseAdam, LossScaleOptimizer, the
  large-batch scaling rules;
- `tfscale.TrainStepModel` / `tfscale.FunctionalTrainStepModel`: Keras models whose train step
  exchanges gradients between the ranks (`compile(embedding_exchange=...,
  embedding_staleness=...)`);
- `tfscale.FieldEmbedding`: one concatenated embedding table per kind for many categorical
  fields, in host memory, with de-duplicated lookups; `tfscale.embedding`: how its tables are
  held over the ranks (`Replicated`, `RowSharded`, `DynamicTables`; `sharding=`), and
  `tfscale.initializers.RowSeededNormal`, which starts every kind alike;
- `tfscale.exchanges`: the gradient exchanges and their registry;
- `tfscale.callbacks`: Keras callbacks, among them `CatchUpRows` (RowSparseAdam's rows brought
  up to date at each epoch's end) and `ProfileSteps` (TensorFlow's profile of a few steps);
- `tfscale.distributed`: the engine seam: start-up (`init`: Horovod or TensorFlow's collective
  runtime) and collectives; `python -m tfscale.run`: the one-host launcher for TensorFlow's
  engine;
- `tfscale.data`: CTR data sources (the Criteo and Avazu readers, the built-in `SyntheticCTR`,
  the `CTRSource` interface and `TextFormat` for a format of your own) and `rank_batches` (each
  rank its part of the data);
- `tfscale.training.train`: epochs with evaluation, TensorBoard scalars and atomic checkpoints;
  `tfscale.serving.export_model`: a model as one SavedModel from a multi-rank run's checkpoint
  (docs/own_model.md).
The packages: `embedding` (tables, their strategies, lookups, initializers), `optimizers`,
`exchanges`, `distributed`, `data`, `checkpoints` (a model's and its optimizer's on disk),
`training` (the train step, the run, callbacks, evaluation), `serving` (prediction, export);
docs/architecture.md.
The reference models (`models/`) and the launcher (`launch/`) live in the repository, not in the
installed package."""

import importlib
import typing

if typing.TYPE_CHECKING:  # what the names below are, for readers and the API reference
    from tfscale import data, distributed, embedding, exchanges, optimizers, serving, training
    from tfscale.embedding import initializers
    from tfscale.embedding.field_embedding import FieldEmbedding
    from tfscale.errors import UserError
    from tfscale.training import callbacks
    from tfscale.training.train_step import FunctionalTrainStepModel, TrainStepModel

__version__ = "0.1.0"

__all__ = ["FieldEmbedding", "FunctionalTrainStepModel", "TrainStepModel", "UserError",
           "callbacks", "data", "distributed", "embedding", "exchanges", "initializers",
           "optimizers", "serving", "training"]

# Public name -> (module, attribute or None for the module itself), imported on first use, so
# that `python -m tfscale.run` starts its processes without loading TensorFlow first.
_PUBLIC = {
    "FieldEmbedding": ("tfscale.embedding.field_embedding", "FieldEmbedding"),
    "FunctionalTrainStepModel": ("tfscale.training.train_step", "FunctionalTrainStepModel"),
    "TrainStepModel": ("tfscale.training.train_step", "TrainStepModel"),
    "UserError": ("tfscale.errors", "UserError"),
    "callbacks": ("tfscale.training.callbacks", None),
    "data": ("tfscale.data", None),
    "distributed": ("tfscale.distributed", None),
    "embedding": ("tfscale.embedding", None),
    "exchanges": ("tfscale.exchanges", None),
    "initializers": ("tfscale.embedding.initializers", None),
    "optimizers": ("tfscale.optimizers", None),
    "serving": ("tfscale.serving", None),
    "training": ("tfscale.training", None),
}


def __getattr__(name):
    if name not in _PUBLIC:
        raise AttributeError(f"module 'tfscale' has no attribute {name!r}")
    module_name, attribute = _PUBLIC[name]
    module = importlib.import_module(module_name)
    value = module if attribute is None else getattr(module, attribute)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_PUBLIC))
