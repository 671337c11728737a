"""Embedding tables row-sharded over the workers, each owner applying its rows' gradients one step
late while the next step computes (`embedding_staleness=1`); in one process the same script
holds the whole tables and applies the updates one step late too:

    python examples/sharded_stale.py --workdir=runs/sharded
    python -m tfscale.run -np 2 examples/sharded_stale.py --workdir=runs/sharded
    horovodrun -np 2 -H localhost:2 --gloo python examples/sharded_stale.py --workdir=runs/sharded
    python examples/sharded_stale.py --workdir=runs/sharded --export

Each rank holds the rows id mod P == rank of every table and its optimizer state (1/P of the
memory); lookups and gradients travel to the owners by alltoall. The checkpoints keep the rows by
id, so a run resumes at any number of ranks, and the export (one process) holds every row.
The data are rows of tfscale's synthetic Criteo-like set, held as arrays.
"""

import argparse
import os

import keras

import tfscale
from tfscale.data import SyntheticCTR, rank_batches
from tfscale.optimizers import RowSparseAdam

# First: starts the launcher's engine (Horovod under horovodrun, TensorFlow's under
# tfscale.run), nothing in one process.
tfscale.distributed.init()


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", required=True, help="checkpoints, TensorBoard logs, export")
    parser.add_argument("--rows", type=int, default=60_000)
    parser.add_argument("--batch_size", type=int, default=4096, help="global batch")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--export", action="store_true",
                        help="write the newest checkpoint as a SavedModel (one process)")
    return parser.parse_args(argv)


def synthetic_arrays(rows, test_rows):
    """((features, labels) of the train rows, the same of the test rows) as numpy arrays."""
    data = SyntheticCTR(seed=0, train_rows=rows, test_rows=test_rows, vocabulary_scale=1 / 2000)
    train = next(iter(data.train_batches(rows)))
    test = next(iter(data.test_batches(test_rows)))
    as_numpy = lambda split: keras.tree.map_structure(lambda t: t.numpy(), split)  # noqa: E731
    return data.schema, as_numpy(train), as_numpy(test)


def build_model(schema):
    """An FM-style model of our own over row-sharded tables: the pairwise interactions of the
    fields' vectors, a linear term per id and the dense features."""
    dense = keras.Input((schema.num_dense,), name="dense")
    ids = keras.Input((schema.num_categorical,), dtype="int64", name="categorical")
    vectors, linear = tfscale.FieldEmbedding(schema.vocabulary_sizes, embedding_dim=8,
                                             use_wide=True, sharding="row")(ids)
    summed = keras.ops.sum(vectors, axis=1)
    pairwise = 0.5 * keras.ops.sum(summed * summed - keras.ops.sum(vectors * vectors, axis=1),
                                   axis=1, keepdims=True)
    logit = keras.layers.Add()([pairwise, linear, keras.layers.Dense(1, name="dense_logit")(dense)])
    probability = keras.layers.Activation("sigmoid")(logit)
    return tfscale.FunctionalTrainStepModel({"dense": dense, "categorical": ids}, probability)


def train(args):
    keras.utils.set_random_seed(args.seed)
    schema, train_rows, test_rows = synthetic_arrays(args.rows, args.rows // 10)
    model = build_model(schema)
    model.compile(optimizer=RowSparseAdam(3e-3),  # a sharded table is updated by row
                  loss="binary_crossentropy", metrics=[keras.metrics.AUC(name="auc")],
                  embedding_staleness=1)
    model.fit(rank_batches(train_rows, args.batch_size), epochs=args.epochs, shuffle=False,
              verbose=2,
              callbacks=[tfscale.callbacks.CatchUpRows(),  # rows the batches left behind
                         tfscale.callbacks.Checkpoint(os.path.join(args.workdir, "checkpoints")),
                         keras.callbacks.TensorBoard(os.path.join(args.workdir, "tensorboard"))])
    # Exact AUC over every rank's test rows (a sharded model's evaluation passes as many
    # batches on every rank, since its lookups are collectives).
    test = tfscale.training.evaluate_exact(
        model, rank_batches(test_rows, args.batch_size, drop_remainder=False))
    if tfscale.distributed.is_chief():
        print(f"test AUC {test['auc']:.4f}, log loss {test['logloss']:.4f} on "
              f"{test['examples']:,} rows")
    return model


def export(args):
    schema, _, _ = synthetic_arrays(16, 16)
    path = os.path.join(args.workdir, "served", "1")
    tfscale.serving.export_model(build_model(schema), path,
                                 checkpoint_dir=os.path.join(args.workdir, "checkpoints"))
    print(f"exported to {path}")


if __name__ == "__main__":
    arguments = parse_args()
    export(arguments) if arguments.export else train(arguments)
