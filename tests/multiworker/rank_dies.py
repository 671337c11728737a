"""Run under horovodrun (2 ranks) with "replicated" or "row" (the tables' sharding): both ranks
train a small DeepFM on an endless stream of batches; rank 1 kills itself with SIGKILL at its
DIE_AT_STEP-th step. Rank 0 must not wait for it forever (in an allgather or a row-sharded
lookup's alltoall): the job has to end, with a non-zero status."""

import os
import signal
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import keras  # noqa: E402

from tests.multiworker.data_parallel_steps import (GLOBAL_BATCH, compiled_model,  # noqa: E402
                                                   rank_slice, source)
from tfscale import distributed  # noqa: E402
from tfscale.optimizers import FusedAdam  # noqa: E402

DIE_AT_STEP = 3


class KillRank1(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if distributed.rank() == 1 and batch + 1 == DIE_AT_STEP:
            print(f"rank 1: killing itself at {time.time():.3f}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)


def main(sharding):
    distributed.init()
    data = source()
    model = compiled_model(data.schema, FusedAdam(learning_rate=1e-3),
                           embedding_sharding=sharding)
    batches = rank_slice(data.train_batches(GLOBAL_BATCH), distributed.rank(), distributed.size())
    model.fit(batches.repeat(), steps_per_epoch=10_000, epochs=1, verbose=0,
              callbacks=[KillRank1()])
    print(f"rank {distributed.rank()}: training ended without noticing the dead rank", flush=True)
    sys.exit(3)


if __name__ == "__main__":
    main(sys.argv[1])
