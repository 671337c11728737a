"""Child of tests/test_dynamic_memory.py: a dynamic table of CAPACITY ids (RowSparseAdam), a few
training steps of a few hundred ids, a checkpoint written and restored into a second model of the
same capacity, a step there (rows not seen before). Prints one JSON line: the growth of the peak
resident memory (MB) over the whole, the bytes both models' full tables would take, the rows in
use, the rows handed out after the restore and the checkpoint's rows per array."""

import json
import sys

import keras
import numpy as np

from tfscale.embedding.dynamic import DynamicTables
from tfscale.embedding.field_embedding import FieldEmbedding
from tfscale.optimizers import RowSparseAdam
from tfscale.optimizers.table_state import dynamic_row_bytes
from tfscale.checkpoints.store import CheckpointStore
from tfscale.training.train_step import FunctionalTrainStepModel

CAPACITY = 40_000_000


def peak_mb():
    """This process's peak resident memory (VmHWM; rusage's maxrss starts at the parent's)."""
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) / 1024 for line in status if line.startswith("VmHWM"))


def model():
    inputs = keras.Input((2,), dtype="int64")
    layer = FieldEmbedding([10, 10], embedding_dim=8, name="field_embedding",
                           sharding=DynamicTables(capacity=CAPACITY))
    outputs = keras.layers.Dense(1, activation="sigmoid")(keras.layers.Flatten()(layer(inputs)))
    built = FunctionalTrainStepModel(inputs, outputs)
    built.compile(optimizer=RowSparseAdam(learning_rate=0.01, name="adam"),
                  loss="binary_crossentropy")
    built.optimizer.build(built.trainable_variables)
    return built, layer


def main(directory):
    rng = np.random.default_rng(0)
    batches = [(rng.integers(0, 1 << 40, (64, 2)), rng.integers(0, 2, (64, 1)).astype("float32"))
               for _ in range(4)]
    first, _ = model()  # TensorFlow and Keras started, a first model traced: the baseline
    first.train_on_batch(*batches[0])
    before = peak_mb()
    trained, layer = model()
    for batch in batches[:3]:
        trained.train_on_batch(*batch)
    written = CheckpointStore(directory, trained, trained.optimizer,
                              per_rank_variables=trained.per_rank_variables()).save(
        3, {"epoch": 0})
    again, again_layer = model()
    store = CheckpointStore(directory, again, again.optimizer,
                            per_rank_variables=again.per_rank_variables())
    store.restore_latest()
    store.finish_restore()
    restored_next_row = int(again_layer.row_index.next_row.numpy())
    again.train_on_batch(*batches[3])
    (index, row_bytes), = dynamic_row_bytes(again)
    arrays = np.load(f"{written}/dynamic-0-of-1.npz")
    print(json.dumps({
        "growth_mb": peak_mb() - before, "full_mb": 2 * index.rows * row_bytes / 2**20,
        "rows_in_use": int(layer.row_index.in_use()[0].shape[0]),
        "restored_next_row": restored_next_row,
        "checkpoint_rows": {name: len(arrays[name]) for name in arrays.files
                            if arrays[name].ndim and name.split(":")[1] != "sketch"}}))


if __name__ == "__main__":
    main(sys.argv[1])
