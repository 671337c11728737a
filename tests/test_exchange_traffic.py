"""The allgather and dense exchanges' modelled bytes (tfscale.distributed.traffic's ring model)
on hand-computed gradients."""

import pytest
import tensorflow as tf

from tfscale.exchanges import AllgatherExchange, DenseExchange

# A 100x10 float32 dense gradient (4,000 bytes) and an embedding gradient of 6 occurrences of a
# 1,000x10 float32 table: values 6x10x4 = 240 bytes, int64 indices 6x8 = 48 bytes, 40,000 bytes
# dense.
DENSE = tf.zeros([100, 10])
SLICES = tf.IndexedSlices(tf.zeros([6, 10]), tf.zeros([6], tf.int64), tf.constant([1000, 10]))


@pytest.mark.parametrize("exchange, expected", [
    # Ring allreduce: 2(P-1)/P * 4,000 = 6,000 bytes each way; allgather: (P-1) * 288 = 864.
    (AllgatherExchange(), 2 * (6_000 + 864)),
    # The table densified: 2(P-1)/P * 40,000 = 60,000 each way.
    (DenseExchange(), 2 * (6_000 + 60_000)),
])
def test_bytes_sent_and_received_per_rank_at_four_ranks(exchange, expected):
    assert float(exchange.modelled_bytes([DENSE, None, SLICES], 4)) == expected


def test_two_ranks():
    # Allreduce: 2 * 1/2 * 4,000 = 4,000 each way; allgather: 1 * 288.
    assert float(AllgatherExchange().modelled_bytes([DENSE, SLICES], 2)) == 2 * (4_000 + 288)


def test_one_rank_exchanges_nothing():
    assert float(DenseExchange().modelled_bytes([DENSE, SLICES], 1)) == 0


def test_fp16_compression_halves_the_allreduced_bytes_only():
    # Allreduce at 2 bytes a value: 2,000 each way; Horovod does not compress the allgather.
    assert float(AllgatherExchange().modelled_bytes([DENSE, SLICES], 2, "fp16")) == \
        2 * (2_000 + 288)
