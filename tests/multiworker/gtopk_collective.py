"""Run under horovodrun or tfscale.run (any number of ranks): tfscale.distributed.gtopk_allreduce and
topk_allgather on random candidates (ties, overlapping and disjoint index sets, fewer than k
entries, empty ranks, indices beyond 2^32, element-wise and row values) against the NumPy
statement in tests/gtopk_reference.py; exits non-zero on the first mismatch. As in a train step,
each collective is traced once per value width for any number of candidates, and then called
for every case."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tests import gtopk_reference  # noqa: E402
from tfscale import distributed  # noqa: E402

CASES = ("ties", "overlap", "disjoint", "fewer_than_k", "empty_rank", "large_ids")


def candidates(case, seed, num_ranks, width):
    """Every rank's (indices, integer values) for one case, the same on every rank."""
    rng = np.random.default_rng(seed)
    result = []
    for rank in range(num_ranks):
        if case == "ties":
            count, pool = 12, np.arange(40)
        elif case == "overlap":
            count, pool = 10, np.arange(16)
        elif case == "disjoint":
            count, pool = 10, np.arange(rank * 100, rank * 100 + 30)
        elif case == "fewer_than_k":
            count, pool = 2, np.arange(50)
        elif case == "empty_rank":
            count, pool = (0 if rank == num_ranks - 1 else 6), np.arange(20)
        else:
            count, pool = 8, (1 << 40) + np.arange(0, 1 << 20, 4097)
        indices = rng.choice(pool, size=count, replace=False).astype(np.int64)
        span = 2 if case == "ties" else 50
        shape = (count,) if width is None else (count, width)
        values = rng.integers(-span, span + 1, size=shape).astype(np.float32)
        values[values == 0] = 1.0  # zero candidates are the caller's to leave out
        result.append((indices, values))
    return result


def collectives(width, k):
    """(gtopk_allreduce keeping k, topk_allgather) as tf.functions of candidates of `width`
    (None: element-wise values), their number unknown when traced."""
    signature = [tf.TensorSpec([None], tf.int64),
                 tf.TensorSpec([None] if width is None else [None, width], tf.float32)]
    gtopk = tf.function(lambda i, v: distributed.gtopk_allreduce(i, v, k, name=f"g_{width}"),
                        input_signature=signature)
    allgather = tf.function(lambda i, v: distributed.topk_allgather(i, v, name=f"a_{width}"),
                            input_signature=signature)
    return gtopk, allgather


def check(case, seed, width, k, rank, num_ranks, gtopk, allgather):
    everyone = candidates(case, seed, num_ranks, width)
    indices, values = everyone[rank]
    got = gtopk(tf.constant(indices), tf.constant(values))
    want_indices, want_values, want_masks = gtopk_reference.gtopk(everyone, k)
    label = f"rank {rank}, case {case}, seed {seed}, width {width}, k {k}"
    np.testing.assert_array_equal(got.indices.numpy(), want_indices, err_msg=label)
    np.testing.assert_array_equal(got.values.numpy().reshape(want_values.shape), want_values,
                                  err_msg=label)
    np.testing.assert_array_equal(got.mask.numpy(), want_masks[rank], err_msg=label)
    if num_ranks & (num_ranks - 1) == 0:  # a power of two: log2(P) rounds of k padded entries
        entry_bytes = 4 * (2 + (width or 1))
        assert got.bytes_sent.numpy() == (num_ranks.bit_length() - 1) * k * entry_bytes, label

    gathered = allgather(tf.constant(indices), tf.constant(values))
    sums = {}
    for rank_indices, rank_values in everyone:
        for i, v in zip(rank_indices, rank_values):
            sums[int(i)] = sums.get(int(i), 0) + v.astype(np.float64)
    got_sums = dict(zip(gathered.indices.numpy().tolist(), gathered.values.numpy()))
    assert sorted(got_sums) == sorted(sums), label
    for i, v in sums.items():
        np.testing.assert_array_equal(got_sums[i], v, err_msg=label)
    assert gathered.mask.numpy().all(), label


def main():
    distributed.init()
    rank, num_ranks = distributed.rank(), distributed.size()
    checked = 0
    for width in (None, 3):
        gtopk, allgather = collectives(width, k=6)
        for case in CASES:
            for seed in range(3):
                check(case, seed, width, 6, rank, num_ranks, gtopk, allgather)
                checked += 1
    print(f"rank {rank} of {num_ranks}: {checked} cases match the NumPy butterfly", flush=True)


if __name__ == "__main__":
    main()
