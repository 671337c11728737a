"""`RowSeededNormal`: an embedding-table initializer whose row i depends only on (seed, i), so a
table built whole and the same table built as row shards over any number of ranks start equal
(docs/sharding.md). Keras's RandomNormal draws the whole [rows, dim] block at once, so its row i
depends on the table's shape; this one draws fixed blocks of CHUNK_ROWS rows, block b from the
stateless seed (seed, b), and a shard keeps the rows it owns of each block (one block in memory
at a time)."""

import keras
import numpy as np
import tensorflow as tf

CHUNK_ROWS = 1 << 16


@keras.saving.register_keras_serializable(package="tfscale")
class RowSeededNormal(keras.initializers.Initializer):
    """Normal(mean, stddev) values, row i of the table a function of (seed, i) alone.

    Args:
        stddev, mean: of the normal distribution.
        seed: int; None draws one from NumPy's global generator (seeded by
            `keras.utils.set_random_seed`), so every rank of a job building the same model draws
            the same seed.
    """

    def __init__(self, mean=0.0, stddev=0.01, seed=None):
        self.mean = float(mean)
        self.stddev = float(stddev)
        self.seed = int(np.random.randint(2**31 - 1)) if seed is None else int(seed)

    def __call__(self, shape, dtype=None):
        """The whole table, block after block as drawn (the rows `rows` would gather)."""
        rows, dim = shape
        dtype = dtype or "float32"
        full_blocks, rest = divmod(rows, CHUNK_ROWS)
        parts = [tf.zeros([0, dim], dtype)]
        parts += [self._block(block, dim, dtype) for block in range(full_blocks)]
        if rest:
            parts.append(self._block(full_blocks, dim, dtype)[:rest])
        return tf.concat(parts, axis=0)

    def rows(self, global_ids, dim, dtype=None):
        """The initial values [len(global_ids), dim] of rows `global_ids` (ascending ints)."""
        ids = np.asarray(global_ids, np.int64)
        dtype = dtype or "float32"
        blocks, starts = np.unique(ids // CHUNK_ROWS, return_index=True)
        ends = np.append(starts[1:], len(ids))
        parts = [tf.zeros([0, dim], dtype)]
        for block, start, end in zip(blocks, starts, ends):
            parts.append(tf.gather(self._block(block, dim, dtype), ids[start:end] - block * CHUNK_ROWS))
        return tf.concat(parts, axis=0)

    def _block(self, block, dim, dtype):
        """Rows [block * CHUNK_ROWS, (block + 1) * CHUNK_ROWS), drawn from (seed, block)."""
        return tf.random.stateless_normal([CHUNK_ROWS, dim], seed=[self.seed, int(block)],
                                          mean=self.mean, stddev=self.stddev, dtype=dtype)

    def get_config(self):
        return {"mean": self.mean, "stddev": self.stddev, "seed": self.seed}


def is_row_independent(initializer):
    """Whether every row `initializer` makes is the same whatever the table's shape: zeros,
    ones, constants and RowSeededNormal (what row-sharded tables need)."""
    return isinstance(initializer, (RowSeededNormal, keras.initializers.Zeros,
                                    keras.initializers.Ones, keras.initializers.Constant))
