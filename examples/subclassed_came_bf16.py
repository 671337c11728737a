"""A subclassed Keras model of your own, trained with CAME in mixed bfloat16 on numpy arrays, in
one process or on several workers:

    python examples/subclassed_came_bf16.py --workdir=runs/came
    python -m tfscale.run -np 2 examples/subclassed_came_bf16.py --workdir=runs/came
    horovodrun -np 2 -H localhost:2 --gloo python examples/subclassed_came_bf16.py \
        --workdir=runs/came
    python examples/subclassed_came_bf16.py --workdir=runs/came --export

The arrays here are random ids whose labels follow a hidden logistic model; put your own in
`load_arrays`. Every rank loads the same arrays and `rank_batches` gives it its rows (row i to
rank i mod P), --batch_size / P a step, so each step covers the same rows at any P.
"""

import argparse
import os

import keras
import numpy as np
import tensorflow as tf

import tfscale
from tfscale.data import rank_batches
from tfscale.optimizers import CAME, RowSparseAdam

# First: starts the launcher's engine (Horovod under horovodrun, TensorFlow's under
# tfscale.run), nothing in one process.
tfscale.distributed.init()

FIELDS, ROWS_PER_FIELD = 8, 200


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", required=True, help="checkpoints, TensorBoard logs, export")
    parser.add_argument("--rows", type=int, default=40_000)
    parser.add_argument("--batch_size", type=int, default=2048, help="global batch")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--export", action="store_true",
                        help="write the newest checkpoint as a SavedModel (one process)")
    return parser.parse_args(argv)


@keras.saving.register_keras_serializable(package="examples")
class FieldAttention(tfscale.TrainStepModel):
    """Embeddings of every field, mixed by one self-attention layer, then an MLP."""

    def __init__(self, fields=FIELDS, rows_per_field=ROWS_PER_FIELD, dim=16, **kwargs):
        super().__init__(**kwargs)
        self.fields, self.rows_per_field, self.dim = fields, rows_per_field, dim
        self.embedding = tfscale.FieldEmbedding([rows_per_field] * fields, embedding_dim=dim)
        self.attention = keras.layers.MultiHeadAttention(num_heads=2, key_dim=dim // 2)
        self.flatten = keras.layers.Flatten()
        self.hidden = keras.layers.Dense(32, activation="relu")
        self.out = keras.layers.Dense(1, activation="sigmoid", dtype="float32")

    def call(self, ids, training=None):
        vectors = self.embedding(ids)
        mixed = vectors + self.attention(vectors, vectors, training=training)
        return self.out(self.hidden(self.flatten(mixed)))

    def get_config(self):
        return {**super().get_config(), "fields": self.fields,
                "rows_per_field": self.rows_per_field, "dim": self.dim}


def load_arrays(rows, seed=123):
    """(ids int64 [rows, FIELDS], labels float32 [rows, 1]): the same on every rank."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, ROWS_PER_FIELD, size=(rows, FIELDS))
    weights = rng.normal(size=(FIELDS, ROWS_PER_FIELD))
    logits = weights[np.arange(FIELDS), ids].sum(axis=1) / np.sqrt(FIELDS)
    labels = rng.random(rows) < 1 / (1 + np.exp(-logits))
    return ids.astype(np.int64), labels.astype(np.float32)[:, None]


def optimizer():
    """CAME (factored second moment) for the dense weights; the tables by row-sparse Adam, so a
    step touches only the batch's rows (CAME's factored statistics span every row). CAME's rate
    is the one docs/came.md gives for few steps, 3e-4 (its default, 1e-3, was best over
    thousands of steps)."""
    return keras.optimizers.MultiOptimizer(keras.optimizers.OptimizerMap(
        CAME(learning_rate=3e-4, name="came"),
        {r".*/deep_embedding/embeddings": RowSparseAdam(1e-3, name="tables")}))


def train(args):
    keras.mixed_precision.set_dtype_policy("mixed_bfloat16")
    keras.utils.set_random_seed(args.seed)
    ids, labels = load_arrays(args.rows)
    held_out = args.rows // 10
    model = FieldAttention()
    model.compile(optimizer=optimizer(), loss="binary_crossentropy",
                  metrics=[keras.metrics.AUC(name="auc")])
    model.fit(rank_batches((ids[held_out:], labels[held_out:]), args.batch_size),
              validation_data=rank_batches((ids[:held_out], labels[:held_out]),
                                           args.batch_size, drop_remainder=False),
              epochs=args.epochs, shuffle=False, verbose=2,
              callbacks=[tfscale.callbacks.CatchUpRows(),  # rows the batches left behind
                         tfscale.callbacks.Checkpoint(os.path.join(args.workdir, "checkpoints")),
                         keras.callbacks.TensorBoard(os.path.join(args.workdir, "tensorboard"))])
    return model


def export(args):
    keras.mixed_precision.set_dtype_policy("mixed_bfloat16")
    path = os.path.join(args.workdir, "served", "1")
    tfscale.serving.export_model(
        FieldAttention(), path, checkpoint_dir=os.path.join(args.workdir, "checkpoints"),
        input_signature=[tf.TensorSpec([None, FIELDS], tf.int64, name="ids")])
    print(f"exported to {path}")


if __name__ == "__main__":
    arguments = parse_args()
    export(arguments) if arguments.export else train(arguments)
