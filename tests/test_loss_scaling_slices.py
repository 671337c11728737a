"""LossScaleOptimizer on a step whose only non-finite gradient is an embedding table's row
gradient (the usual float16 overflow of CTR models): `tf.IndexedSlices` from a plain lookup, or
`CountedSlices` from a de-duplicated one as RowSparseAdam and CowClip receive them, beside a
finite dense gradient. The step is skipped: the scale halves, no step is counted, and no variable
or optimizer slot changes."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfscale.optimizers import CowClip, FusedAdam, RowSparseAdam
from tfscale.optimizers.loss_scaling import LossScaleOptimizer
from tfscale.row_gradients import CountedSlices

ROWS, DIM = 20, 4
SCALE = 2.0 ** 10


def _plain_slices(values, ids):
    """One row per occurrence, as a gather's gradient."""
    return tf.IndexedSlices(values, ids, tf.constant([ROWS, DIM], tf.int64))


def _counted_slices(values, ids):
    """One row per unique id with its occurrences (the ids here are unique)."""
    return CountedSlices(values, ids, tf.constant([ROWS, DIM], tf.int64),
                         tf.fill(tf.shape(ids), 2.0), unique_ids=True)


CASES = {
    "adam-indexed_slices": (lambda: FusedAdam(1e-2), _plain_slices),
    "keras_adam-indexed_slices": (lambda: keras.optimizers.Adam(1e-2), _plain_slices),
    "row_sparse_adam-counted_slices": (lambda: RowSparseAdam(1e-2, table_l2=1e-3),
                                       _counted_slices),
    "cowclip-counted_slices": (lambda: CowClip(RowSparseAdam(1e-2, catch_up_l2=1e-4),
                                               FusedAdam(1e-2), l2=1e-4), _counted_slices),
}


def _state(optimizer, variables):
    """Copies of the model's variables and of every variable of the wrapped optimizer(s):
    slots, step counters, CowClip's statistics."""
    return {v.path: np.array(v.numpy())
            for v in list(variables) + list(optimizer.inner_optimizer.variables)}


@pytest.mark.parametrize("case", list(CASES))
def test_inf_only_in_the_embedding_gradient_skips_the_step(case):
    make_optimizer, make_slices = CASES[case]
    rng = np.random.default_rng(0)
    table = keras.Variable(rng.normal(0, 0.05, (ROWS, DIM)).astype("float32"),
                           name="embeddings")
    kernel = keras.Variable(rng.normal(0, 0.5, (DIM, 3)).astype("float32"), name="kernel")
    optimizer = LossScaleOptimizer(make_optimizer(), initial_scale=SCALE,
                                   dynamic_growth_steps=1000)
    ids = tf.constant([3, 7, 11], tf.int64)

    def step(row_values):
        dense = tf.constant(rng.normal(0, 1, (DIM, 3)) * SCALE, tf.float32)
        optimizer.apply([make_slices(tf.constant(row_values * SCALE, tf.float32), ids), dense],
                        [table, kernel])

    step(rng.normal(0, 1, (3, DIM)))  # a finite step first, so that the slots hold values
    assert int(optimizer.iterations.numpy()) == 1
    before = _state(optimizer, [table, kernel])
    assert any(np.any(value != 0) for path, value in before.items()
               if path not in (table.path, kernel.path) and value.dtype.kind == "f"
               and value.ndim > 0)

    poisoned = rng.normal(0, 1, (3, DIM))
    poisoned[1, 2] = np.inf
    step(poisoned)

    assert float(optimizer.dynamic_scale.numpy()) == SCALE / 2
    assert int(optimizer.skipped_steps.numpy()) == 1
    assert int(optimizer.iterations.numpy()) == 1  # a skipped step is no optimizer step
    assert int(optimizer.step_counter.numpy()) == 0
    after = _state(optimizer, [table, kernel])
    assert [path for path in before if not np.array_equal(before[path], after[path])] == []

    step(rng.normal(0, 1, (3, DIM)))  # and the next finite step is applied
    assert int(optimizer.iterations.numpy()) == 2
    assert int(optimizer.skipped_in_a_row.numpy()) == 0
    assert not np.array_equal(table.numpy(), before[table.path])
