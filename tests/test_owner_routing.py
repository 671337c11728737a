"""Which rank holds which row, checked in one process without an engine: the owner of each id
(rank id mod P) on a lookup's way out and on its gradient's way back, for row-sharded tables
(tfscale.embedding.row_sharding) and dynamic ones (tfscale.embedding.dynamic), with P ranks
simulated by threads sharing an in-process Engine (SimulatedRanks); and where a
checkpoint's table rows land when it is resumed at another number of ranks
(tfscale.embedding.by_row_checkpoint)."""

import concurrent.futures
import threading

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfscale.distributed import runtime
from tfscale.distributed.engine import Engine
from tfscale.embedding.dynamic import FIELD_BITS, DynamicTables
from tfscale.embedding.field_embedding import FieldEmbedding
from tfscale.embedding.table import RowShard
from tfscale.row_gradients import densify
from tfscale.embedding import by_row_checkpoint
from tfscale.embedding.by_row_checkpoint import TableVariable


class SimulatedRanks(Engine):
    """An Engine of `size` ranks, each a thread (`run`): eager alltoall and allreduce (sum, max)
    exchange through shared memory, every rank calling them in the same order."""

    name = "simulated"

    def __init__(self, size):
        self.size, self.local_size, self.local_rank = size, size, 0
        self._local = threading.local()
        self._barrier = threading.Barrier(size, timeout=60)
        self._posted = [None] * size
        self.alltoalls = 0  # calls of rank 0

    @property
    def rank(self):
        return self._local.rank

    def run(self, work):
        """[work(rank) for each rank], each on its own thread."""
        def as_rank(rank):
            self._local.rank = rank
            try:
                return work(rank)
            except BaseException:
                self._barrier.abort()  # the other ranks stop waiting for this one
                raise

        with concurrent.futures.ThreadPoolExecutor(self.size) as pool:
            return [f.result() for f in [pool.submit(as_rank, r) for r in range(self.size)]]

    def _everyones(self, value):
        """Every rank's `value`, in rank order."""
        self._posted[self.rank] = value
        self._barrier.wait()
        posted = list(self._posted)
        self._barrier.wait()  # all have read before the next exchange posts
        return posted

    def _exchange(self, tensor, splits):
        values, splits = np.asarray(tensor), np.asarray(splits)
        everyone = self._everyones((values, splits))
        rank = self.rank
        parts, received = [], []
        for sent, sent_splits in everyone:
            start = int(np.sum(sent_splits[:rank]))
            parts.append(sent[start:start + sent_splits[rank]])
            received.append(sent_splits[rank])
        return (tf.constant(np.concatenate(parts), tensor.dtype),
                tf.constant(received, tf.int32))

    def alltoall(self, tensor, splits, name):
        del name
        self.alltoalls += self.rank == 0
        return self._exchange(tf.convert_to_tensor(tensor), splits)

    def allreduce(self, tensor, op, name):
        del name
        tensor = tf.convert_to_tensor(tensor)
        everyone = np.stack(self._everyones(np.asarray(tensor)))
        reduced = everyone.sum(axis=0) if op == "sum" else everyone.max(axis=0)
        return tf.constant(reduced, tensor.dtype)

    def grouped_allreduce(self, tensors, op, name):
        raise NotImplementedError

    def allgather(self, tensor, name):
        raise NotImplementedError

    def broadcast_variables(self, variables, root_rank=0):
        raise NotImplementedError

    def broadcast_object(self, value, name, root_rank=0):
        raise NotImplementedError

    def allgather_object(self, value, name):
        raise NotImplementedError


@pytest.fixture
def simulated(monkeypatch):
    """SimulatedRanks(P) installed as the started engine for the test."""
    def install(size):
        ranks = SimulatedRanks(size)
        monkeypatch.setitem(runtime._started, "engine", ranks)
        return ranks

    return install


VOCABULARY, DIM = 23, 2


def _batches(num_ranks):
    """Each rank's ids (some shared between ranks, some repeated within one) and the weights
    of its outputs in its loss."""
    rng = np.random.default_rng(num_ranks)
    ids = [rng.integers(0, VOCABULARY, 9) for _ in range(num_ranks)]
    weights = [rng.normal(0, 1, (9, DIM)) for _ in range(num_ranks)]
    return ids, weights


def _global_rows():
    """Row g of the whole table: [g, 100 + g] (values that name their id)."""
    ids = np.arange(VOCABULARY)
    return np.stack([ids, 100 + ids], axis=1).astype("float32")


@pytest.mark.parametrize("num_ranks", [2, 3])
def test_a_row_sharded_lookup_reads_each_id_from_its_owner_and_sends_its_gradient_back(
        simulated, num_ranks):
    """Rank r holds global rows r, r + P, ...; every rank reads the whole table's row of each
    of its ids, and each owner's gradient holds, at local row id div P, the sum over the ranks
    of that id's output gradients divided by P."""
    ranks = simulated(num_ranks)
    ids, weights = _batches(num_ranks)
    whole = _global_rows()

    def work(rank):
        layer = FieldEmbedding([VOCABULARY], embedding_dim=DIM, sharding="row",
                               embeddings_initializer="zeros", name=f"fields_{rank}")
        layer.build()
        (table,) = layer.tables
        assert (table.shard.num_shards, table.shard.index) == (num_ranks, rank)
        table.variable.assign(whole[rank::num_ranks])
        table.start_step()
        with tf.GradientTape() as tape:
            outputs = layer(tf.constant(ids[rank][:, None], tf.int64))[:, 0]
            loss = tf.reduce_sum(outputs * tf.constant(weights[rank], tf.float32))
        gradient = tape.gradient(loss, table.variable)
        return outputs.numpy(), densify(gradient).numpy()

    results = ranks.run(work)
    assert ranks.alltoalls == 3  # ids out, rows back, their gradient back
    expected_gradient = np.zeros_like(whole)
    for rank_ids, rank_weights in zip(ids, weights):
        np.add.at(expected_gradient, rank_ids, rank_weights / num_ranks)
    for rank, (outputs, gradient) in enumerate(results):
        np.testing.assert_array_equal(outputs, whole[ids[rank]])
        np.testing.assert_allclose(gradient, expected_gradient[rank::num_ranks], rtol=1e-6,
                                   atol=1e-7)


def _held_keys(layer):
    """{key: local row} of the ids a dynamic FieldEmbedding's rank holds."""
    rows, keys = (t.numpy() for t in layer.row_index.in_use())
    return {int(key): int(row) for row, key in zip(rows, keys)}


def _key(field, id_):
    return field << FIELD_BITS | id_


def _key_row(key):
    """The row given to `key` here: [1000 field + id, 100 + id] (values that name it)."""
    field, id_ = key >> FIELD_BITS, key & ((1 << FIELD_BITS) - 1)
    return np.array([1000 * field + id_, 100 + id_], "float32")


@pytest.mark.parametrize("num_ranks", [2, 3])
def test_a_dynamic_lookup_gives_each_id_a_row_on_its_owner_and_sends_its_gradient_back(
        simulated, num_ranks):
    """Two fields, so keys carry their field's bits (2**56 mod 3 is 1: at P = 3 a key's owner
    is not its id's). A new key gets its row on rank key mod P alone; a later lookup reads that
    row from there on every rank, and each owner's gradient holds, at the key's row, the sum
    over the ranks of its output gradients divided by P."""
    ranks = simulated(num_ranks)
    ids, weights = _batches(num_ranks)
    # Field 1 reads the ids in reverse; the weights are shared by both fields' outputs.
    keys = [[(_key(0, a), _key(1, b)) for a, b in zip(rank_ids, rank_ids[::-1])]
            for rank_ids in ids]
    all_keys = {key for rank_keys in keys for pair in rank_keys for key in pair}

    def work(rank):
        layer = FieldEmbedding([VOCABULARY, VOCABULARY], embedding_dim=DIM,
                               sharding=DynamicTables(capacity=8 * VOCABULARY),
                               embeddings_initializer="zeros", name=f"fields_{rank}")
        layer.build()
        (table,) = layer.tables
        inputs = tf.constant(np.stack([ids[rank], ids[rank][::-1]], axis=1), tf.int64)
        table.start_step()
        layer(inputs, training=True)  # admits the keys
        held = _held_keys(layer)
        rows = np.array(table.variable.numpy())
        for key, row in held.items():
            rows[row] = _key_row(key)
        table.variable.assign(rows)
        table.start_step()
        with tf.GradientTape() as tape:
            outputs = layer(inputs, training=True)
            loss = tf.reduce_sum(outputs * tf.constant(weights[rank], tf.float32)[:, None])
        gradient = tape.gradient(loss, table.variable)
        return held, outputs.numpy(), densify(gradient).numpy()

    results = ranks.run(work)
    assert ranks.alltoalls == 5  # ids out, rows back; twice; the gradient back once
    expected_gradient = {key: np.zeros(DIM) for key in all_keys}
    for rank_keys, rank_weights in zip(keys, weights):
        for pair, row_weights in zip(rank_keys, rank_weights):
            for key in pair:
                expected_gradient[key] += row_weights / num_ranks
    for rank, (held, outputs, gradient) in enumerate(results):
        assert set(held) == {key for key in all_keys if key % num_ranks == rank}, rank
        np.testing.assert_array_equal(
            outputs, [[_key_row(key) for key in pair] for pair in keys[rank]])
        for key, row in held.items():
            np.testing.assert_allclose(gradient[row], expected_gradient[key], rtol=1e-6,
                                       atol=1e-7)
        unheld = np.setdiff1d(np.arange(len(gradient)), list(held.values()))
        assert not gradient[unheld].any()


TABLE_ROWS = 11  # not a multiple of 2 or 3: the shards differ in size


def _shard_entries(num_shards, index):
    """TableVariables of rank `index` of `num_shards`: a table [its rows, DIM] and a moments
    slot [its rows, 2, DIM], zeros."""
    shard = RowShard(TABLE_ROWS, num_shards, index)
    return [TableVariable("embeddings", keras.Variable(np.zeros((shard.rows, DIM), "float32")),
                          shard),
            TableVariable("embeddings_moments",
                          keras.Variable(np.zeros((shard.rows, 2, DIM), "float32")), shard)]


@pytest.mark.parametrize("written, resumed", [(2, 3), (3, 2), (1, 3), (2, 1)])
def test_restored_rows_go_to_the_rank_that_holds_them_at_the_new_number_of_ranks(
        tmp_path, written, resumed):
    """Each rank of the first run writes its rows (global ids index, index + P, ...); each rank
    of the resumed run gets, at its local row k, global row index + P' k of every file."""
    whole = np.arange(TABLE_ROWS * DIM, dtype="float32").reshape(TABLE_ROWS, DIM)
    moments = np.stack([whole + 0.25, whole + 0.5], axis=1)
    for index in range(written):
        entries = _shard_entries(written, index)
        entries[0].variable.assign(whole[index::written])
        entries[1].variable.assign(moments[index::written])
        by_row_checkpoint.save(entries, str(tmp_path))
    for index in range(resumed):
        entries = _shard_entries(resumed, index)
        by_row_checkpoint.restore(entries, str(tmp_path))
        np.testing.assert_array_equal(entries[0].variable.numpy(), whole[index::resumed])
        np.testing.assert_array_equal(entries[1].variable.numpy(), moments[index::resumed])
