"""A job of tests/multiworker/jobs.py under horovodrun, with an output directory: each rank
trains a small DeepFM for STEPS steps on its slice of every global batch, for each of RUNS (Adam
and CowClip with the allgather embedding exchange, synchronous and with embedding updates one
step stale; Adam with the dense and the gTop-k ones), and writes its final model and optimizer
variables (in `model_state` order) to OUT_DIR/<optimizer>-<exchange>-stale<T>-rank<r>.npz, the
initial ones to ...-initial.npz and `evaluations` of the trained model to ...-evaluations.npy.
In one process without Horovod, it trains the one-process reference of each allgather run on
the whole global batches instead and writes OUT_DIR/<optimizer>-allgather-stale<T>-reference*.
Used by tests/test_distributed.py; imported by the other multi-process scripts."""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import models  # noqa: E402
from tfscale import distributed  # noqa: E402
from tfscale import metrics  # noqa: E402
from tfscale.data.synthetic import SyntheticCTR  # noqa: E402
from tfscale.optimizers import CowClip, FusedAdam  # noqa: E402
from tfscale.optimizers.table_state import local_variables  # noqa: E402
from tfscale.training.evaluation import evaluate_exact  # noqa: E402
from tfscale.training.run import build_model_and_optimizer  # noqa: E402

GLOBAL_BATCH = 256
STEPS = 20
OPTIMIZERS = ("adam", "cowclip")
# (optimizer, embedding exchange, embedding staleness)
RUNS = (("adam", "allgather", 0), ("cowclip", "allgather", 0), ("adam", "dense", 0),
        ("adam", "gtopk", 0), ("adam", "allgather", 1), ("cowclip", "allgather", 1))


def source():
    return SyntheticCTR(seed=0, train_rows=GLOBAL_BATCH * STEPS, test_rows=256,
                        vocabulary_scale=0.002)


def make_optimizer(name):
    if name == "adam":
        return FusedAdam(learning_rate=1e-3)
    return CowClip(FusedAdam(learning_rate=1e-3, name="embedding"),
                   FusedAdam(learning_rate=1e-3, name="dense"), l2=1e-4)


def compiled_model(schema, optimizer, embedding_exchange="allgather", embedding_staleness=0,
                   embedding_sharding="replicated"):
    """A small DeepFM, seeded identically on every rank, compiled and built (and, under Horovod,
    set to rank 0's variables but for row-sharded tables and their state)."""
    keras.utils.set_random_seed(0)
    model = models.build_model("deepfm", schema, hidden_units=[32, 32],
                               embedding_sharding=embedding_sharding)
    model.compile(optimizer=optimizer, loss=keras.losses.BinaryCrossentropy(),
                  embedding_exchange=embedding_exchange, embedding_staleness=embedding_staleness)
    build_model_and_optimizer(model, schema)
    distributed.broadcast_model_and_optimizer(model, local=local_variables(model))
    return model


def rank_slice(dataset, rank, num_ranks):
    """Rank `rank`'s contiguous 1/num_ranks of every (features, labels) batch of `dataset`, of
    known length (else Keras counts one optimizer iteration too many)."""
    def take(tensor):
        size = GLOBAL_BATCH // num_ranks
        return tensor[rank * size:(rank + 1) * size]

    sliced = dataset.map(lambda features, labels: ({k: take(v) for k, v in features.items()},
                                                   take(labels)))
    return sliced.apply(tf.data.experimental.assert_cardinality(STEPS))


def model_state(model):
    """The values of every model and optimizer variable, in a fixed order (paths are not
    compared: they depend on how many models the process built before)."""
    return [v.numpy() for v in list(model.variables) + list(model.optimizer.variables)]


def load_state(path):
    """The values a script saved with np.savez(*values) (a model_state), in order."""
    with np.load(path) as saved:
        return [saved[f"arr_{i}"] for i in range(len(saved.files))]


def train(optimizer_name, rank, num_ranks, embedding_exchange="allgather", embedding_staleness=0):
    """(model, its initial state, data) after STEPS steps of rank `rank` of `num_ranks` (1: the
    reference)."""
    data = source()
    model = compiled_model(data.schema, make_optimizer(optimizer_name), embedding_exchange,
                           embedding_staleness)
    initial = model_state(model)
    batches = rank_slice(data.train_batches(GLOBAL_BATCH), rank, num_ranks)
    model.fit(batches, epochs=1, verbose=0, shuffle=False)
    assert int(model.optimizer.iterations) == STEPS
    return model, initial, data


def evaluations(model, data):
    """[AUC, log loss, examples] of tfscale.training.evaluation over this rank's test shard (under
    Horovod: gathered from every rank) and of one pass of this process alone over the whole
    test split, on the same weights."""
    gathered = evaluate_exact(model, data.test_batches(256, **distributed.data_shard()))
    labels, predictions = [], []
    for features, batch_labels in data.test_batches(256):
        predictions.append(model(features, training=False).numpy().reshape(-1))
        labels.append(batch_labels.numpy().reshape(-1))
    labels, predictions = np.concatenate(labels), np.concatenate(predictions)
    alone = [metrics.exact_auc(labels, predictions), metrics.log_loss(labels, predictions),
             labels.size]
    return np.array([[gathered["auc"], gathered["logloss"], gathered["examples"]], alone])


def main(out_dir):
    if distributed.launched_by_horovodrun():
        distributed.init()
        runs, label = RUNS, f"rank{distributed.rank()}"
    else:
        runs, label = [run for run in RUNS if run[1] == "allgather"], "reference"
    for name, exchange, staleness in runs:
        model, initial, data = train(name, distributed.rank(), distributed.size(), exchange,
                                     staleness)
        prefix = os.path.join(out_dir, f"{name}-{exchange}-stale{staleness}-{label}")
        np.savez(f"{prefix}.npz", *model_state(model))
        np.savez(f"{prefix}-initial.npz", *initial)
        np.save(f"{prefix}-evaluations.npy", evaluations(model, data))
    print(f"rank {distributed.rank()} of {distributed.size()} done", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
