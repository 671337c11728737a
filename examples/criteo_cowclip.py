"""Your own functional CTR model on Criteo-format TSV files, trained with CowClip, in one process
or on several workers:

    python examples/criteo_cowclip.py --train=train.txt --test=test.txt --workdir=runs/own
    python -m tfscale.run -np 2 examples/criteo_cowclip.py \
        --train=train.txt --test=test.txt --workdir=runs/own
    horovodrun -np 2 -H localhost:2 --gloo python examples/criteo_cowclip.py \
        --train=train.txt --test=test.txt --workdir=runs/own
    python examples/criteo_cowclip.py --train=train.txt --workdir=runs/own --export

The second and third commands run 2 ranks, on TensorFlow's engine and on Horovod. The last one
(one process) writes the trained model as a SavedModel to runs/own/served/1.
Without --train it trains on a small file of random Criteo-format lines written into --workdir.
The rates, L2 and CowClip's zeta follow CowClip's large-batch rule for the global batch, the
dense rate warming up over the first epoch.
--batch_size is the global batch: each of P ranks reads batch_size / P lines of its part of the
file (lines whose number modulo P is its rank), so a step reads the same lines at any P.
"""

import argparse
import os

import keras
import numpy as np

import tfscale
from tfscale.data import CriteoTSV, rank_batches
from tfscale.optimizers import CowClip, RowSparseAdam, FusedAdam, large_batch_settings

# First: starts the launcher's engine (Horovod under horovodrun, TensorFlow's under
# tfscale.run), nothing in one process.
tfscale.distributed.init()


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--train", help="Criteo-format TSV training file(s), comma-separated")
    parser.add_argument("--test", help="labelled test file(s); default: none, no evaluation")
    parser.add_argument("--workdir", required=True, help="checkpoints, TensorBoard logs, export")
    parser.add_argument("--batch_size", type=int, default=1024, help="global batch")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--hash_buckets", type=int, default=1000, help="rows per field")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--export", action="store_true",
                        help="write the newest checkpoint as a SavedModel (one process)")
    return parser.parse_args(argv)


def build_model(schema):
    """A wide-and-deep style model of our own: a linear term per id, embeddings and dense
    features through an MLP."""
    dense = keras.Input((schema.num_dense,), name="dense")
    ids = keras.Input((schema.num_categorical,), dtype="int64", name="categorical")
    vectors, linear = tfscale.FieldEmbedding(schema.vocabulary_sizes, embedding_dim=8,
                                             use_wide=True)(ids)
    hidden = keras.layers.Concatenate()([keras.layers.Flatten()(vectors), dense])
    for width in (64, 32):
        hidden = keras.layers.Dense(width, activation="relu", name=f"hidden_{width}")(hidden)
    logit = keras.layers.Add()([keras.layers.Dense(1, name="deep_logit")(hidden), linear])
    probability = keras.layers.Activation("sigmoid", dtype="float32")(logit)
    return tfscale.FunctionalTrainStepModel({"dense": dense, "categorical": ids}, probability)


def cowclip_for(batch_size, steps_per_epoch):
    """CowClip with its large-batch rule's rates, L2 and zeta for the global batch; the dense
    rate warms up linearly over the rule's warm-up epochs."""
    settings = large_batch_settings(batch_size, rule="cowclip", preset="criteo")
    warmup_steps = max(1, round(settings.warmup_epochs * steps_per_epoch))
    dense_rate = keras.optimizers.schedules.PolynomialDecay(
        1e-8, warmup_steps, settings.dense_learning_rate, power=1.0)
    return CowClip(RowSparseAdam(settings.embedding_learning_rate, catch_up_l2=settings.l2,
                                 name="embedding"),
                   FusedAdam(dense_rate, name="dense"),
                   r=settings.r, zeta=settings.zeta, l2=settings.l2)


def source(args):
    train = args.train.split(",") if args.train else [write_random_lines(args.workdir)]
    return CriteoTSV(train, args.test.split(",") if args.test else None,
                     test_fraction=None if args.test else 0.0, hash_buckets=args.hash_buckets)


def write_random_lines(workdir, lines=20_000, name="random_train.txt"):
    """A Criteo-format file (label, 13 integers, 26 hex ids) whose labels follow its fields;
    returns its path."""
    path = os.path.join(workdir, name)
    if tfscale.distributed.is_chief() and not os.path.exists(path):
        os.makedirs(workdir, exist_ok=True)
        rng = np.random.default_rng(0)
        ids = rng.integers(0, 50, size=(lines, 26))
        numbers = rng.integers(0, 20, size=(lines, 13))
        labels = (rng.random(lines) < 1 / (1 + np.exp(2 - (ids[:, 0] % 5) + numbers[:, 0] / 10)))
        with open(path + ".tmp", "w") as out:
            for label, row_numbers, row_ids in zip(labels, numbers, ids):
                out.write("\t".join([str(int(label)), *map(str, row_numbers),
                                     *(f"{i:08x}" for i in row_ids)]) + "\n")
        os.replace(path + ".tmp", path)
    tfscale.distributed.barrier("random_lines_written")
    return path


def train(args):
    keras.utils.set_random_seed(args.seed)
    data = source(args)
    batches = rank_batches(data, args.batch_size)
    model = build_model(data.schema)
    model.compile(optimizer=cowclip_for(args.batch_size, int(batches.cardinality())),
                  loss="binary_crossentropy", metrics=[keras.metrics.AUC(name="auc")],
                  embedding_exchange="allgather")  # CowClip needs the ids' global counts
    model.fit(batches, epochs=args.epochs,
              validation_data=rank_batches(data, args.batch_size, split="test")
              if args.test else None,
              callbacks=[tfscale.callbacks.CatchUpRows(),  # rows the batches left behind
                         tfscale.callbacks.Checkpoint(os.path.join(args.workdir, "checkpoints")),
                         keras.callbacks.TensorBoard(os.path.join(args.workdir, "tensorboard"))],
              shuffle=False, verbose=2)
    return model


def export(args):
    data = source(args)
    path = os.path.join(args.workdir, "served", "1")
    tfscale.serving.export_model(build_model(data.schema), path,
                                 checkpoint_dir=os.path.join(args.workdir, "checkpoints"))
    print(f"exported to {path}")


if __name__ == "__main__":
    arguments = parse_args()
    export(arguments) if arguments.export else train(arguments)
