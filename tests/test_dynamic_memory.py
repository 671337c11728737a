"""A dynamic table's memory follows the rows in use (docs/dynamic.md, tfscale.embedding.id_rows):
tables, optimizer state and IdRows' per-row state start unwritten; rows are handed out from the
high-water mark, then from the freed rows; a row handed out (after an eviction, after a restore,
in the step that builds the optimizer) starts from its initializer row and fresh optimizer
state; checkpoints hold the rows in use only; a table updated whole has its other rows written
with zeros; a capacity whose full tables pass the machine's memory is warned about."""

import json
import logging
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from tests.test_dynamic_tables import embedding, held, lookup, small_model
from tfscale.embedding.initializers import keyed_rows
from tfscale.optimizers import FusedAdam, RowSparseAdagrad, RowSparseAdam, row_updates, table_state
from tfscale.checkpoints.store import CheckpointStore


def test_a_large_dynamic_table_trained_checkpointed_and_restored_stays_small(tmp_path):
    """Two models of 40M ids (10 GB once full) trained, checkpointed and restored: the peak
    resident memory grows by a small fraction of it, and the checkpoint holds the rows in use."""
    child = subprocess.run([sys.executable, "-m", "tests.dynamic_table_memory", str(tmp_path)],
                           capture_output=True, text=True,
                           env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    assert child.returncode == 0, child.stderr[-3000:]
    measured = json.loads(child.stdout.strip().splitlines()[-1])
    assert measured["full_mb"] > 5000, measured
    assert measured["growth_mb"] < 400, measured
    assert measured["rows_in_use"] == measured["restored_next_row"] == 384, measured
    rows = measured["checkpoint_rows"]
    assert rows.pop("field_embedding/id_rows:free_rows") == 0
    assert set(rows.values()) == {384}, rows


def test_rows_are_handed_out_from_the_high_water_mark_then_from_the_freed_rows():
    layer = embedding(capacity=8, expire_after_steps=2)
    index = layer.row_index
    assert int(index.next_row.numpy()) == 0 and int(index.free_count.numpy()) == 0
    lookup(layer, [1, 2])  # step 1: rows 0, 1
    lookup(layer, [3])  # step 2: row 2; nothing unseen for 2 steps
    lookup(layer, [3])
    assert held(layer) == {1: 0, 2: 1, 3: 2} and int(index.next_row.numpy()) == 3
    lookup(layer, [4])  # step 4: 1 and 2 (last seen at 1) expire; 4 takes the lower freed row
    assert held(layer) == {3: 2, 4: 0}
    assert int(index.next_row.numpy()) == 3 and int(index.free_count.numpy()) == 1
    lookup(layer, [5, 6, 7])  # the last freed row, then rows 3 and 4
    assert held(layer) == {3: 2, 4: 0, 5: 1, 6: 3, 7: 4}
    assert int(index.next_row.numpy()) == 5 and int(index.free_count.numpy()) == 0


def assert_fresh(model, layer, key, step):
    """Table row of `key` (field 0) and its RowSparseAdam state are one step of Adam from its
    initializer row and zero moments, taken at `step` (nothing to catch up)."""
    row = held(layer)[key]
    table = layer.tables[0].variable
    moments, last_step = table_state.table_state(model.optimizer, table).per_row
    m, v = moments.numpy()[row]
    # From zero moments: m = (1 - b1) g and v = (1 - b2) g**2, so v = (1 - b2) / (1 - b1)**2 m**2.
    np.testing.assert_allclose(v, 0.001 / 0.01 * m ** 2, rtol=1e-3, atol=1e-12)
    assert last_step.numpy()[row] == step
    initial = keyed_rows(layer.tables[0].layer.initializer, tf.constant([key], tf.int64),
                         3).numpy()[0]
    assert np.abs(table.numpy()[row] - initial).max() <= 0.01 * 1.001  # one Adam step of lr 0.01


def spoil_state(model, layer):
    """Every row of the dynamic tables and of their optimizer state set to 1000: what a row
    handed out must not keep."""
    for table in layer.tables:
        for variable in [table.variable,
                         *table_state.table_state(model.optimizer, table.variable).per_row]:
            variable.assign(tf.fill(variable.shape, tf.constant(1000, variable.dtype)))


def test_a_row_handed_out_after_an_eviction_starts_from_its_initializer_and_fresh_state():
    model, layer = small_model(capacity=4, evict_fraction=0.25)
    for step, pair in enumerate([[1, 11], [2, 12]], 1):
        model.train_on_batch(np.array([pair]), np.array([[1.0]]))
    spoil_state(model, layer)
    model.train_on_batch(np.array([[3, 13]]), np.array([[1.0]]))  # 1 and 11 go; 3 takes a row
    assert 1 not in held(layer) and held(layer)[3] in (0, 1)
    assert_fresh(model, layer, 3, step=3)


def test_a_row_handed_out_after_a_restore_starts_from_its_initializer_and_fresh_state(tmp_path):
    model, _ = small_model(capacity=8)
    model.train_on_batch(np.array([[1, 11], [2, 12]]), np.array([[1.0], [0.0]]))
    CheckpointStore(str(tmp_path), model, model.optimizer,
                    per_rank_variables=model.per_rank_variables()).save(1, {"epoch": 0})
    again, layer = small_model(capacity=8)
    spoil_state(again, layer)
    store = CheckpointStore(str(tmp_path), again, again.optimizer,
                            per_rank_variables=again.per_rank_variables())
    store.restore_latest()
    store.finish_restore()
    assert int(layer.row_index.next_row.numpy()) == 4
    again.train_on_batch(np.array([[3, 13]]), np.array([[1.0]]))
    assert held(layer)[3] == 4  # above the restored rows
    assert_fresh(again, layer, 3, step=2)


def test_a_capacity_beyond_the_machines_memory_is_warned_about_with_the_numbers(monkeypatch,
                                                                               caplog):
    model, layer = small_model(capacity=1000)
    (index, row_bytes), = table_state.dynamic_row_bytes(model)
    # the table (width 3), its moments and last step, IdRows' 4 int64 per row
    assert row_bytes == 3 * 4 * 3 + 4 + 4 * 8
    monkeypatch.setattr(table_state.os, "sysconf",
                        {"SC_PAGE_SIZE": 4096, "SC_PHYS_PAGES": 10}.__getitem__)
    with caplog.at_level(logging.WARNING, logger="tfscale"):
        table_state.warn_when_beyond_memory(model)
    assert f"1,000 rows x {row_bytes} bytes per row" in caplog.text, caplog.text
    assert "0.0 GB of memory" in caplog.text


def test_a_dynamic_table_updated_whole_has_its_rows_not_handed_out_written_with_zeros():
    """FusedAdam updates a table whole, reading every row: the rows no id was given read zero,
    as an Adam step with a zero gradient keeps them."""
    model, layer = small_model(capacity=12)
    model.compile(optimizer=FusedAdam(learning_rate=0.01), loss="binary_crossentropy")
    with pytest.warns(UserWarning, match="updated whole"):
        model.train_on_batch(np.array([[1, 11], [2, 12]]), np.array([[1.0], [0.0]]))
    table = layer.tables[0].variable.numpy()
    assert int(layer.row_index.next_row.numpy()) == 4
    assert (table[4:] == 0).all() and (table[:4] != 0).all()


def test_a_row_handed_out_starts_from_adagrads_initial_accumulator():
    """RowSparseAdagrad's fresh rows start at `initial_accumulator_value`, as a fixed table's:
    after one step, accumulator = 0.1 + g**2 and the row moved by lr * |g| / sqrt(accumulator)."""
    model, layer = small_model(capacity=8)
    model.compile(optimizer=RowSparseAdagrad(learning_rate=0.5, initial_accumulator_value=0.1),
                  loss="binary_crossentropy")
    model.optimizer.build(model.trainable_variables)
    spoil_state(model, layer)
    model.train_on_batch(np.array([[3, 13]]), np.array([[1.0]]))
    row = held(layer)[3]
    table = layer.tables[0].variable
    (accumulator,) = table_state.table_state(model.optimizer, table).per_row
    accumulated = accumulator.numpy()[row]
    initial = keyed_rows(layer.tables[0].layer.initializer, tf.constant([3], tf.int64),
                         3).numpy()[0]
    assert (accumulated > 0.1).all() and (accumulated < 1).all()
    np.testing.assert_allclose(np.abs(table.numpy()[row] - initial),
                               0.5 * np.sqrt((accumulated - 0.1) / accumulated), rtol=1e-3)


def garbage(shape, dtype=None):
    """What an `unwritten` buffer may hold where its memory was used before: NaN (the largest
    int for integer state)."""
    dtype = tf.as_dtype(dtype or "float32")
    fill = float("nan") if dtype.is_floating else dtype.max
    return tf.fill(shape, tf.constant(fill, dtype))


def test_an_optimizer_built_by_the_first_step_gives_its_new_rows_fresh_state(monkeypatch):
    """train_on_batch with an optimizer not built before it (no `fit`, which builds it first):
    the first step's new rows start from fresh state, not from the unwritten memory of the
    state it creates."""
    monkeypatch.setattr(row_updates, "unwritten", garbage)
    model, layer = small_model(capacity=8)
    model.compile(optimizer=RowSparseAdam(learning_rate=0.01), loss="binary_crossentropy")
    assert not model.optimizer.built
    model.train_on_batch(np.array([[3, 13]]), np.array([[1.0]]))
    assert_fresh(model, layer, 3, step=1)
    assert np.isfinite(model.predict(np.array([[3, 13]]), verbose=0)).all()
