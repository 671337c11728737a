"""What each rank holds of a model's embedding tables: the optimizer's state of each table
(`table_state`, from the optimizers' declarations), the variables that differ between ranks
(`local_variables`, never broadcast), the one-line description the launcher prints, and how a
checkpoint's per-row arrays are read (`stored_rows`), and a dynamic table's bytes per row
(`dynamic_row_bytes`) with the warning when its tables once full would not fit in the machine's
memory (`warn_when_beyond_memory`)."""

import logging
import os

import keras
import numpy as np
import tensorflow as tf

from tfscale import distributed
from tfscale.embedding import stored_arrays
from tfscale.embedding.strategies import tables_of
from tfscale.embedding.table import row_indexes_of
from tfscale.errors import UserError
from tfscale.optimizers.capabilities import DeclaresTableState, TableState, wrapped_optimizers
from tfscale.optimizers.row_sparse_adam import two_slot_names

LOG = logging.getLogger("tfscale")


def describe(model):
    """How `model`'s embedding tables are held (their strategies' descriptions), with their rows
    and bytes (tables and their optimizer state, which this builds) on this rank."""
    model.optimizer.build(model.trainable_variables)
    described = tables_of(model.trainable_variables)
    tables = [t.variable for t in described]
    held = tables + optimizer_state(model.optimizer, tables)
    megabytes = sum(int(np.prod(v.shape)) * tf.as_dtype(v.dtype).size for v in held) / 1e6
    rows = sum(int(v.shape[0]) for v in tables)
    how = ", ".join(dict.fromkeys(t.strategy.description for t in described)) or "replicated"
    shards = [t.shard for t in described if t.partitioned]
    if not shards:
        return f"tables {how}: {rows:,} rows, {megabytes:,.0f} MB with optimizer state"
    if any(t.strategy.hands_out_rows for t in described):
        return (f"tables {how} over {shards[0].num_shards} ranks: up to {rows:,} rows, "
                f"{megabytes:,.0f} MB with optimizer state per rank once full (memory follows "
                "the rows in use)")
    return (f"tables {how} over {shards[0].num_shards} ranks: {rows:,} rows, "
            f"{megabytes:,.0f} MB with optimizer state per rank")


def dynamic_row_bytes(model):
    """(row index, bytes per row) of each row index of `model`'s dynamic tables (its optimizer
    built): the bytes of a row of its tables, of their per-row optimizer state and of the
    index's per-row state (the id map's hash table comes on top)."""
    by_index = {}
    for table in tables_of(model.variables):
        if table.strategy.hands_out_rows:
            by_index.setdefault(id(table.row_index), (table.row_index, []))[1].extend(
                [table.variable, *per_row_state(model.optimizer, table.variable)])
    return [(index, sum(int(np.prod(v.shape[1:])) * tf.as_dtype(v.dtype).size
                        for v in per_row + index.state if len(v.shape)))
            for index, per_row in by_index.values()]


def warn_when_beyond_memory(model):
    """Logs a warning (once per row index, on the first rank of each machine) when `model`'s
    dynamic tables, once every row is handed out, would take more than this machine's memory:
    the ranks on it x rows per rank x bytes per row (`dynamic_row_bytes`). `model.optimizer`
    is built."""
    local_ranks, local_rank = distributed.local_size(), distributed.local_rank()
    machine = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for index, row_bytes in dynamic_row_bytes(model):
        if index.memory_checked:
            continue
        index.memory_checked = True
        full = local_ranks * index.rows * row_bytes
        if full > machine and local_rank == 0:
            LOG.warning(
                "dynamic tables of capacity %s: once full, %d rank(s) on this machine hold %s "
                "rows x %d bytes per row (tables, optimizer state, id map) = %.1f GB, more than "
                "its %.1f GB of memory; give a smaller `capacity` or more machines",
                f"{index.capacity:,}", local_ranks, f"{index.rows:,}", row_bytes, full / 1e9,
                machine / 1e9)


def local_variables(model):
    """`model`'s partitioned tables, their per-row state in its (built) optimizer and their
    strategies' row indexes (Table.row_index): the variables that differ between ranks (and are
    never broadcast). A UserError when the optimizer keeps other state of a shard that it does
    not declare (TableState)."""
    local = []
    for index in row_indexes_of(model.variables):
        local += index.state
    for table in (t for t in tables_of(model.variables) if t.partitioned):
        shard = table.variable
        state = table_state(model.optimizer, shard)
        declared = {id(slot) for slot in state.per_row + state.whole}
        for slot in optimizer_state(model.optimizer, [shard]):
            if len(slot.shape) and id(slot) not in declared:
                raise UserError(
                    f"{type(model.optimizer).__name__} keeps {slot.path} of shape "
                    f"{tuple(slot.shape)} for the {table.strategy.description} table "
                    f"{shard.path}: state that is "
                    "neither per row nor summed over the shards by the optimizer; use an "
                    "optimizer tfscale shards (Adam, RowSparseAdam, CowClip, CAME, RowSparseCAME, "
                    "SGD), or replicated tables")
        local += [shard, *state.per_row]
    return local


def reset_rows(optimizer, table, rows):
    """Sets rows `rows` (int64) of `optimizer`'s per-row state of `table` to where a new row
    starts (TableState.fresh, else zeros), in the graph."""
    for inner in wrapped_optimizers(optimizer):
        if not any(v is table for v in getattr(inner, "_trainable_variables", [])):
            continue
        if isinstance(inner, DeclaresTableState):
            state = inner.table_state(table)
            per_row, fresh = state.per_row, state.fresh or (0,) * len(state.per_row)
        else:
            per_row = table_state(inner, table).per_row
            fresh = (0,) * len(per_row)
        for slot, value in zip(per_row, fresh):
            shape = tf.concat([tf.shape(rows), tf.constant(list(slot.shape[1:]), tf.int32)], axis=0)
            values = tf.fill(shape, tf.cast(value, slot.dtype))
            slot.value.scatter_update(tf.IndexedSlices(values, rows))


def stored_rows(arrays, name):
    """The array `name` of a checkpoint's `arrays` (an npz file's, tfscale.embedding.stored_arrays),
    or None when it is not there. A RowSparseAdam moments slot is also read from its two slots of
    before (row_sparse_adam.two_slot_names), so checkpoints written with two slots resume."""
    array = stored_arrays.read(arrays, name)
    if array is not None:
        return array
    two_slots = two_slot_names(name)
    if two_slots and all(slot in arrays.files for slot in two_slots):
        return np.stack([arrays[slot] for slot in two_slots], axis=1)
    return None


class OptimizerTableState:
    """The TableStateSource the checkpoint formats read an optimizer's table state through
    (tfscale.embedding.strategy): `optimizer`'s per-row variables of a table (none without an
    optimizer) and how a stored one is read."""

    def __init__(self, optimizer):
        self._optimizer = optimizer

    def per_row(self, table):
        return [] if self._optimizer is None else per_row_state(self._optimizer, table)

    @staticmethod
    def stored_rows(arrays, name):
        return stored_rows(arrays, name)


def per_row_state(optimizer, table):
    """The variables of `optimizer` with one entry per row of `table` (TableState.per_row)."""
    return list(table_state(optimizer, table).per_row)


def table_state(optimizer, table):
    """The TableState of `table` (a Keras variable) in `optimizer` (built; through loss scalers
    and MultiOptimizers): each inner optimizer's declaration (DeclaresTableState), and for the
    others (Keras's own) the slots of the table's shape, per row (Adam's moments, SGD's
    velocity)."""
    per_row, whole = [], []
    for inner in wrapped_optimizers(optimizer):
        if isinstance(inner, DeclaresTableState):
            if any(v is table for v in getattr(inner, "_trainable_variables", [])):
                state = inner.table_state(table)
                per_row += state.per_row
                whole += state.whole
        else:
            per_row += [slot for slot in optimizer_state(inner, [table], wrapped=False)
                        if tuple(slot.shape) == tuple(table.shape)]
    return TableState(tuple(per_row), tuple(whole))


def optimizer_state(optimizer, variables, wrapped=True):
    """The variables of `optimizer` (built; with `wrapped`, a loss scaler's or a
    MultiOptimizer's inner ones too) holding state of `variables`. A Keras optimizer keeps each
    kind of state in a list aligned with the variables it was built on (Adam's `_momentums`,
    Adafactor's `_r`, CAME's `_rows`, ...): this reads those lists, not the slots' names, which
    Keras does not make unique (Adafactor names its factors after the variable alone)."""
    wanted = {id(v) for v in variables}
    state = []
    for inner in wrapped_optimizers(optimizer) if wrapped else [optimizer]:
        built_on = list(getattr(inner, "_trainable_variables", []))
        for value in vars(inner).values():
            if not (isinstance(value, list) and value and len(value) == len(built_on)
                    and all(s is None or isinstance(s, keras.Variable) for s in value)):
                continue
            state += [slot for variable, slot in zip(built_on, value)
                      if slot is not None and slot is not variable and id(variable) in wanted]
    return state
