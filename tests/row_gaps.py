"""A 4-row table trained with rows absent from batches for stretches: what the catch-up tests of
RowSparseAdam and of CowClip's scalable mode compare against the dense update."""

import keras
import numpy as np
import tensorflow as tf

ROWS = 4


def train_with_gaps(optimizer, dim, densify=False, l2=0.0, steps=281):
    """Rows 0-2 in every batch for 100 steps (past the bias corrections' fast change, which the
    catch-up takes as constant); then row 0 in every batch, row 1 in one of 40, row 2 from
    step 200 on; row 3 never. With 281 steps it ends with rows 1 and 2 in the batch (a row is
    caught up when next seen). Small data gradients, so the L2 and the moments' tails matter.
    `densify`: hand the optimizer the dense gradient with the L2's (2 * l2 * w) added, instead
    of the batch's rows. Returns the table."""
    table = keras.Variable(np.random.default_rng(0).normal(0, 0.05, (ROWS, dim)).astype("float32"),
                           name="embeddings")
    rng = np.random.default_rng(1)
    for step in range(steps):
        ids = [0] + ([1] if step < 100 or step % 40 == 0 else []) + (
            [2] if step < 100 or step >= 200 else [])
        values = rng.normal(0, 1e-3, (len(ids), dim)).astype("float32")
        if densify:
            dense = np.zeros((ROWS, dim), "float32")
            dense[ids] = values
            gradient = tf.constant(dense + 2 * l2 * table.numpy())
        else:
            gradient = tf.IndexedSlices(tf.constant(values), tf.constant(ids, tf.int64),
                                        tf.constant([ROWS, dim], tf.int64))
        optimizer.apply([gradient], [table])
    return table
