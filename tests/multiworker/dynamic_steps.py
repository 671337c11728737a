"""Dynamic tables under horovodrun (any number of ranks), or as the one-process reference without it.

For each run of RUNS, every rank trains a small model (a dynamic FieldEmbedding with a wide
table, a sigmoid unit; RowSparseAdam) for STEPS steps on its B/P slice of the same global batches,
whose ids keep arriving (a Zipf-like law over ids that grow with the step), and writes
OUT_DIR/<run>-P<P>-rank<r>.npz: after each step the ids it holds (`held_<step>`), and at the end
per held id its deep and wide rows, both Adam moments of each, its last-seen step and count, and
the dense weights. "roomy": capacity for every id, min_count 1 (nothing is evicted); "evicting":
a small capacity, min_count 2 and expiry (ids admitted late, evicted often), which also writes a
checkpoint after SAVED_STEPS steps to OUT_DIR/checkpoint-P<P>.

Then it restores the "evicting" run from its own checkpoint and trains the remaining steps,
writing OUT_DIR/evicting-resumed-checkpoint-P<P>-P<P>-rank<r>.npz. With `--resume_from=DIR,...`
(checkpoints written at any number of ranks) it does only that, from each DIR. A job of
tests/multiworker/jobs.py (`main(OUT_DIR, [--resume_from=DIR,...])`), used by
tests/test_dynamic_tables.py."""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tfscale import distributed  # noqa: E402
from tfscale.embedding.dynamic import DynamicTables  # noqa: E402
from tfscale.embedding.field_embedding import FieldEmbedding  # noqa: E402
from tfscale.optimizers import RowSparseAdam  # noqa: E402
from tfscale.optimizers.table_state import local_variables, table_state  # noqa: E402
from tfscale.checkpoints.store import CheckpointStore  # noqa: E402
from tfscale.training.train_step import FunctionalTrainStepModel  # noqa: E402

GLOBAL_BATCH = 48  # divides over 2, 3 and 4 ranks
FIELDS = 3
STEPS = 12
SAVED_STEPS = 6
RUNS = {
    "roomy": DynamicTables(capacity=4096),
    "evicting": DynamicTables(capacity=160, min_count=2, evict_fraction=0.25,
                              expire_after_steps=5),
}


def global_batches():
    """STEPS (ids [GLOBAL_BATCH, FIELDS], labels) with new ids arriving every step."""
    rng = np.random.default_rng(7)
    for step in range(STEPS):
        newest = 20 + 15 * step
        ids = np.minimum(rng.zipf(1.3, size=(GLOBAL_BATCH, FIELDS)) - 1 + rng.integers(
            0, step + 1, size=(GLOBAL_BATCH, 1)) * 10, newest).astype(np.int64)
        labels = (rng.random((GLOBAL_BATCH, 1)) < 0.3).astype(np.float32)
        yield ids, labels


def build(strategy):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((FIELDS,), dtype="int64")
    embedding = FieldEmbedding([100] * FIELDS, embedding_dim=4, use_wide=True, sharding=strategy,
                               name="field_embedding")
    deep, linear = embedding(inputs)
    logit = keras.layers.Dense(1)(keras.layers.Flatten()(deep))
    outputs = keras.layers.Activation("sigmoid")(logit + linear)
    model = FunctionalTrainStepModel(inputs, outputs)
    model.compile(optimizer=RowSparseAdam(learning_rate=0.05, table_l2=1e-3, name="adam"),
                  loss="binary_crossentropy")
    model.optimizer.build(model.trainable_variables)
    distributed.broadcast_model_and_optimizer(model, local=local_variables(model))
    return model, embedding


def run(name, out_dir, resume_from=None):
    model, embedding = build(RUNS[name])
    rank, size = distributed.rank(), distributed.size()
    local = GLOBAL_BATCH // size
    first_step = 0
    if resume_from:
        store = CheckpointStore(resume_from, model, model.optimizer)
        if distributed.is_chief():
            store.restore_latest()
        distributed.broadcast_model_and_optimizer(model, local=local_variables(model))
        store.finish_restore()
        first_step = SAVED_STEPS
    arrays = {}
    for step, (ids, labels) in enumerate(global_batches()):
        if step < first_step:
            continue
        mine = slice(rank * local, (rank + 1) * local)
        model.train_on_batch(ids[mine], labels[mine])
        arrays[f"held_{step}"] = np.sort(embedding.row_index.in_use()[1].numpy())
        if name == "evicting" and not resume_from and step + 1 == SAVED_STEPS:
            CheckpointStore(os.path.join(out_dir, f"checkpoint-P{size}"), model,
                            model.optimizer).save(SAVED_STEPS, {"epoch": 0})
    index = embedding.row_index
    held, arrays["ids"] = (t.numpy() for t in index.in_use())  # never-used rows are unwritten
    arrays["last_seen"] = tf.gather(index.last_seen.value, held).numpy()
    arrays["seen_count"] = tf.gather(index.seen_count.value, held).numpy()
    for table in embedding.tables:
        arrays[table.name] = tf.gather(table.variable.value, held).numpy()
        state = table_state(model.optimizer, table.variable).per_row
        for i in range(2):  # both moments, in one slot
            arrays[f"{table.name}_moment{i}"] = tf.gather(state[0].value, held).numpy()[:, i]
        arrays[f"{table.name}_unknown"] = table.layer.unknown.numpy()
    arrays["dense"] = np.concatenate([v.numpy().ravel() for v in model.trainable_variables
                                      if "dense" in v.path])
    if resume_from:
        name = f"{name}-resumed-{os.path.basename(resume_from)}"
    np.savez(os.path.join(out_dir, f"{name}-P{size}-rank{rank}.npz"), **arrays)


def main(out_dir, *flags):
    resume_from = [directory for flag in flags if flag.startswith("--resume_from=")
                   for directory in flag.split("=", 1)[1].split(",")]
    distributed.init()
    if not resume_from:
        for name in RUNS:
            run(name, out_dir)
        resume_from = [os.path.join(out_dir, f"checkpoint-P{distributed.size()}")]
    for checkpoint_dir in resume_from:
        run("evicting", out_dir, checkpoint_dir)
    print("dynamic steps done", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
