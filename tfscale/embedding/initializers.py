"""`RowSeededNormal`: an embedding-table initializer whose row i depends only on (seed, i), so a
table built whole and the same table built as row shards over any number of ranks start equal
(docs/sharding.md). Keras's RandomNormal draws the whole [rows, dim] block at once, so its row i
depends on the table's shape; this one reads row i of a [rows, dim] table as values
[i * dim, (i + 1) * dim) of one stateless normal stream of the seed, which TensorFlow's Philox
generator can start at any offset. A whole table is one draw into one buffer (no block copies
for the host allocator to keep pooled: 2.2 GB at 33.8M ids of width 16); a shard draws the
stream in windows of CHUNK_ROWS rows and keeps the rows it owns. `keyed_rows` gives the initial
rows of tables keyed by 64-bit ids instead of rows (tfscale.embedding.dynamic), in the graph."""

import keras
import numpy as np
import tensorflow as tf

from tfscale import distributed

# What `tfscale.initializers` offers (the functions below serve the tables' strategies).
__all__ = ["RowSeededNormal"]

# A shard draws the stream in windows of this many rows (one window's values in memory at a time).
CHUNK_ROWS = 1 << 16
# Normal values TensorFlow's Philox kernels make per counter step (float32: one 4-word output,
# two Box-Muller pairs); value j of a draw comes from counter step j // PHILOX_GROUP.
PHILOX_GROUP = 4
PHILOX = tf.random.Algorithm.PHILOX.value


@keras.saving.register_keras_serializable(package="tfscale")
class RowSeededNormal(keras.initializers.Initializer):
    """Normal(mean, stddev) values, row i of the table a function of (seed, i) alone.

    Args:
        mean: the normal distribution's mean.
        stddev: the normal distribution's standard deviation.
        seed: int; None draws one from NumPy's global generator (seeded by
            `keras.utils.set_random_seed`). Row-sharded and dynamic tables built in a Horovod
            job use rank 0's seed (`with_rank_0_seed`), whatever each rank drew.
    """

    def __init__(self, mean=0.0, stddev=0.01, seed=None):
        self.mean = float(mean)
        self.stddev = float(stddev)
        self.seed = int(np.random.randint(2**31 - 1)) if seed is None else int(seed)

    def __call__(self, shape, dtype=None):
        """The whole table: the stream's first rows * dim values."""
        rows, dim = shape
        return self._stream_rows(0, rows, dim, dtype)

    def rows(self, global_ids, dim, dtype=None):
        """The initial values [len(global_ids), dim] of rows `global_ids` (ascending ints).

        Args:
            global_ids: the rows' indices in the whole table, ascending.
            dim: the table's width.
            dtype: the values' dtype (float32 by default).

        Returns:
            A [len(global_ids), dim] tensor, what the whole table holds in those rows."""
        ids = np.asarray(global_ids, np.int64)
        if ids.size and ids[-1] - ids[0] + 1 == ids.size:  # a range (one shard): one draw
            return self._stream_rows(int(ids[0]), int(ids.size), dim, dtype)
        windows, starts = np.unique(ids // CHUNK_ROWS, return_index=True)
        ends = np.append(starts[1:], len(ids))
        parts = [tf.zeros([0, dim], dtype or "float32")]
        for window, start, end in zip(windows, starts, ends):
            first = int(window) * CHUNK_ROWS
            count = int(ids[end - 1]) + 1 - first
            parts.append(tf.gather(self._stream_rows(first, count, dim, dtype), ids[start:end] - first))
        return tf.concat(parts, axis=0)

    def keyed_rows(self, keys, dim):
        """float32 [len(keys), dim]: Normal(mean, stddev) values, row k a function of (seed,
        keys[k]) alone (int64 keys >= 0; graph-compatible): splitmix64 of (seed, key, column)
        gives the uniforms of a Box-Muller pair per two columns. Not the values `rows` gives
        a row index (those are read from the seed's stream).

        Args:
            keys: int64 keys >= 0, any shape (flattened).
            dim: the table's width.

        Returns:
            A float32 [len(keys), dim] tensor."""
        keys = tf.cast(tf.reshape(keys, [-1, 1]), tf.int64)
        pairs = (dim + 1) // 2
        counters = tf.range(2 * pairs, dtype=tf.int64)[None, :]
        bits = splitmix64(splitmix64(keys ^ tf.constant(self.seed, tf.int64)) + counters)
        # The top 53 bits as a uniform in (0, 1).
        uniform = (tf.cast(_logical_right_shift(bits, 11), tf.float64) + 0.5) / 2.0**53
        radius = tf.sqrt(-2.0 * tf.math.log(uniform[:, :pairs]))
        angle = 2.0 * np.pi * uniform[:, pairs:]
        normal = tf.concat([radius * tf.cos(angle), radius * tf.sin(angle)], axis=1)[:, :dim]
        return tf.cast(self.mean + self.stddev * normal, tf.float32)

    def _stream_rows(self, first_row, rows, dim, dtype):
        """Rows [first_row, first_row + rows) of a table of width `dim`: stream values
        [first_row * dim, (first_row + rows) * dim), times stddev plus mean, as `dtype`."""
        first = first_row * dim
        # Philox makes PHILOX_GROUP values per counter step: start at the step holding `first`.
        step, skip = divmod(first, PHILOX_GROUP)
        key, counter = tf.raw_ops.StatelessRandomGetKeyCounter(
            seed=tf.constant([self.seed, 0], tf.int64))
        values = _scaled_normals(tf.constant(skip + rows * dim, tf.int64), key,
                                 _advanced(counter, step), tf.constant(self.stddev),
                                 tf.constant(self.mean))
        values = tf.reshape(values[skip:] if skip else values, [rows, dim])
        return values if dtype in (None, "float32", tf.float32) else tf.cast(values, dtype)

    def get_config(self):
        return {"mean": self.mean, "stddev": self.stddev, "seed": self.seed}


@tf.function(autograph=False)
def _scaled_normals(size, key, counter, stddev, mean):
    """`size` float32 N(mean, stddev^2) values of the Philox stream (key, counter). In one graph
    the scaling reuses the draw's buffer (eagerly each op would allocate a table-sized copy)."""
    normals = tf.raw_ops.StatelessRandomNormalV2(shape=tf.reshape(size, [1]), key=key,
                                                 counter=counter, alg=PHILOX, dtype=tf.float32)
    return normals * stddev + mean


def _advanced(counter, steps):
    """A Philox counter (uint64 [low, high] words) advanced by `steps` (a Python int below
    2**64), carrying into the high word (in the graph too: Keras may build a table in a call)."""
    counter = tf.convert_to_tensor(counter, tf.uint64)
    low = counter[0] + tf.constant(steps, tf.uint64)
    carry = tf.cast(low < counter[0], tf.uint64)
    return tf.stack([low, counter[1] + carry])


def with_rank_0_seed(initializer):
    """`initializer` as rank 0 holds it: a RowSeededNormal with rank 0's seed in a Horovod job
    (call on every rank, as a table is built), anything else unchanged. A rank's rows of a
    row-sharded or dynamic table then start as the same rows of a one-process run with rank
    0's seed, whatever seed each rank drew (its rows are never broadcast)."""
    if not isinstance(initializer, RowSeededNormal) or not distributed.is_active():
        return initializer
    seed = distributed.broadcast_from_chief(lambda: initializer.seed,
                                            name="tfscale_initializer_seed")
    return RowSeededNormal(initializer.mean, initializer.stddev, seed)


def keyed_rows(initializer, keys, dim):
    """The initial rows [len(keys), dim] (float32) of ids `keys` in a table keyed by id:
    RowSeededNormal's `keyed_rows`, or a constant initializer's value (in the graph; any
    initializer `is_row_independent` accepts)."""
    if isinstance(initializer, RowSeededNormal):
        return initializer.keyed_rows(keys, dim)
    return tf.fill(tf.stack([tf.size(keys), dim]), _constant_value(initializer))


def _constant_value(initializer):
    """The value every entry of a zeros, ones or constant initializer's output takes."""
    if isinstance(initializer, keras.initializers.Zeros):
        return 0.0
    if isinstance(initializer, keras.initializers.Ones):
        return 1.0
    return float(initializer.get_config()["value"])


_GOLDEN = -7046029254386353131  # 0x9E3779B97F4A7C15 as int64
_MIX_1 = -4658895280553007687  # 0xBF58476D1CE4E5B9
_MIX_2 = -7723592293110705685  # 0x94D049BB133111EB


def splitmix64(x):
    """splitmix64's output function of int64 `x` (as uint64 bits, wrapping arithmetic), for
    random values keyed by id in the graph (TensorFlow's stateless random ops take one seed
    per call)."""
    z = x + _GOLDEN
    z = (z ^ _logical_right_shift(z, 30)) * _MIX_1
    z = (z ^ _logical_right_shift(z, 27)) * _MIX_2
    return z ^ _logical_right_shift(z, 31)


def _logical_right_shift(x, bits):
    """`x` (int64) shifted right by `bits`, zeros in (as a uint64 would be)."""
    return tf.bitwise.bitwise_and(tf.bitwise.right_shift(x, bits),
                                  tf.constant((1 << (64 - bits)) - 1, tf.int64))


def is_row_independent(initializer):
    """Whether every row `initializer` makes is the same whatever the table's shape: zeros,
    ones, constants and RowSeededNormal (what row-sharded tables need)."""
    return isinstance(initializer, (RowSeededNormal, keras.initializers.Zeros,
                                    keras.initializers.Ones, keras.initializers.Constant))
