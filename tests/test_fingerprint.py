"""tfscale.data.fingerprint hashes as TensorFlow's string hashing does (FarmHash's
Fingerprint64, read through `to_hash_bucket_fast` with 2**63 - 1 buckets), bit for bit: every
length from 0 to 300 bytes (each of FarmHash's branches and the loop's chunk counts), values at
every alignment in their buffer, sliced arrays, nulls, string, large and chunk-sized arrays; the
C kernels refuse offsets and indices outside their buffers."""

import numpy as np
import pyarrow as pa
import pytest
import tensorflow as tf

import tfscale.data._kernels as _kernels
from tfscale.data.fingerprint import fingerprints

BUCKETS = (1 << 63) - 1


def tensorflow_hashes(values):
    """uint64 [n]: TensorFlow's Fingerprint64 of `values` (bytes), modulo 2**63 - 1."""
    strings = tf.constant(np.array(values, object), tf.string)
    return tf.strings.to_hash_bucket_fast(strings, BUCKETS).numpy().astype(np.uint64)


def ours(array):
    hashes, present = fingerprints(array)
    np.testing.assert_array_equal(present, [bool(value) for value in array.to_pylist()])
    return hashes % np.uint64(BUCKETS)


def random_values(rng, lengths):
    return [bytes(rng.integers(0, 256, n, dtype=np.uint8)) for n in lengths]


def test_every_length_and_alignment_matches_tensorflow():
    rng = np.random.default_rng(0)
    values = random_values(rng, [n for n in range(301) for _ in range(7)])
    rng.shuffle(values)  # values of every length start at every offset modulo 8
    np.testing.assert_array_equal(ours(pa.array(values, pa.binary())), tensorflow_hashes(values))


def test_values_all_of_one_length_match_tensorflow():
    rng = np.random.default_rng(2)
    for length in range(131):
        values = random_values(rng, [length] * 9)
        np.testing.assert_array_equal(ours(pa.array(values, pa.binary())),
                                      tensorflow_hashes(values), err_msg=f"length {length}")


def test_text_values_slices_nulls_and_large_arrays():
    rng = np.random.default_rng(1)
    values = [b"%08x" % v for v in rng.integers(0, 1 << 32, 5000)] + [
        "ünïcödé".encode(), b"", b"a", b"ab", b"abc"] + random_values(rng, range(60, 200, 7))
    expected = tensorflow_hashes(values)
    binary = pa.array(values, pa.binary())
    np.testing.assert_array_equal(ours(binary), expected)
    np.testing.assert_array_equal(ours(binary.slice(1234, 2000)), expected[1234:3234])
    np.testing.assert_array_equal(ours(pa.array(values, pa.large_binary())), expected)
    texts = [value.decode("utf-8", "replace") for value in values[:5005]]
    np.testing.assert_array_equal(ours(pa.array(texts, pa.string())),
                                  tensorflow_hashes([t.encode() for t in texts]))
    with_nulls = pa.array([None, b"x" * 70, None, b"abc"], pa.binary())
    np.testing.assert_array_equal(ours(with_nulls), tensorflow_hashes([b"", b"x" * 70, b"",
                                                                       b"abc"]))


def test_nulls_of_a_slice_are_read_from_their_bit():
    values = [None if i % 3 == 0 else b"v%d" % i for i in range(50)]
    array = pa.array(values, pa.binary())
    for start in (0, 1, 5, 13):  # validity bits not starting on a byte
        want = [b"" if value is None else value for value in values[start:start + 30]]
        np.testing.assert_array_equal(ours(array.slice(start, 30)), tensorflow_hashes(want))


def test_kernels_refuse_offsets_and_indices_outside_their_buffers():
    hashes, present = np.empty(2, np.uint64), np.empty(2, np.bool_)
    with pytest.raises(ValueError, match="outside data"):
        _kernels.fingerprints(b"abcd", np.array([0, 2, 9], np.int32), None, 0, hashes, present)
    with pytest.raises(ValueError, match="one item per value"):
        _kernels.fingerprints(b"abcd", np.array([0, 2], np.int32), None, 0, hashes, present)
    with pytest.raises(ValueError, match="outside data"):
        _kernels.bucket_ids(b"abcd", np.array([0, 2, 9], np.int32), None, 0, 10, 1, 0,
                            np.empty(2, np.int64))
    taken = np.empty(3, np.int64)
    with pytest.raises(ValueError, match="outside values"):
        _kernels.take(np.arange(4), np.array([0, 4, 1], np.int32), None, 0, -1, taken)
    validity = np.packbits([1, 0, 1], bitorder="little")  # the index under the null is not read
    _kernels.take(np.arange(4) * 10, np.array([3, 99, 1], np.int8), validity, 0, -1, taken)
    np.testing.assert_array_equal(taken, [30, -1, 10])


def test_refuses_other_types():
    with pytest.raises(TypeError, match="binary or string"):
        fingerprints(pa.array([1, 2]))
