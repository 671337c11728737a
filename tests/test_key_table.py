"""tfscale.data.key_table.KeyTable finds every key it holds and no other (crowded groups, probes
wrapping around the table's end), keeps a repeated key's first id, as the vocabulary's binary
search does, and refuses negative keys."""

import numpy as np
import pytest

from tfscale.data.key_table import KeyTable


def test_finds_what_it_holds_and_nothing_else():
    rng = np.random.default_rng(0)
    for size in (0, 1, 7, 1000, 50_000):
        keys = rng.integers(0, 1 << 62, size)
        keys[::3] &= 0xFF  # crowded home slots: long probe runs
        ids = rng.integers(0, 1 << 40, size)
        table = KeyTable(keys, ids)
        first = {}
        for key, key_id in zip(keys.tolist(), ids.tolist()):
            first.setdefault(key, key_id)
        queries = np.concatenate([keys, rng.integers(0, 1 << 62, 1000), np.arange(300)])
        want = np.array([first.get(key, -5) for key in queries.tolist()], np.int64)
        np.testing.assert_array_equal(table.lookup(queries, -5), want)


def test_a_repeated_key_keeps_its_first_id():
    table = KeyTable([5, 21, 5, 37, 21], [1, 2, 3, 4, 5])  # 5, 21, 37 share a home slot
    np.testing.assert_array_equal(table.lookup(np.array([5, 21, 37, 53]), 0), [1, 2, 4, 0])


def test_keys_crowding_the_last_group_wrap_around_to_the_first():
    keys = np.arange(11) * 32 + 28  # all at home in the last group of eight of a 32-slot table
    table = KeyTable(keys, keys + 1)
    assert len(table.slots) == 32
    assert (table.tags[:3] != 0).all()  # the last three wrapped round to the first slots
    np.testing.assert_array_equal(table.lookup(np.concatenate([keys, [0, 29, 380, -3]]), -1),
                                  np.concatenate([keys + 1, [-1, -1, -1, -1]]))


def test_keys_of_one_tag_and_one_home_group_are_told_apart_by_the_key():
    keys = (np.arange(6, dtype=np.int64) << 4) | (5 << 56)  # one tag, one home group
    table = KeyTable(keys, np.arange(6) + 100)
    np.testing.assert_array_equal(table.lookup(np.concatenate([keys, keys + 1]), -1),
                                  np.concatenate([np.arange(6) + 100, np.full(6, -1)]))


def test_refuses_negative_keys():
    with pytest.raises(ValueError, match="non-negative"):
        KeyTable([3, -1], [0, 1])
