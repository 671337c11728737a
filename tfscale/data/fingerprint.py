"""FarmHash's Fingerprint64 (farmhashna::Hash64: what TensorFlow's `to_hash_bucket_fast` and the
vocabulary's keys hash with) of every value of an Arrow binary array, in numpy, from Arrow's own
buffers.

Ours because the readers encode categorical values in their reader threads, where Arrow parsed
them: TensorFlow hashes only tf.string tensors, and making those cost more than the hashing
(docs/results/input_path.md). The values are hashed in groups by length, as FarmHash branches on
length, with numpy's wrapping uint64 arithmetic; tests/test_fingerprint.py checks every length
from 0 to 300 bytes against TensorFlow's op, bit for bit.
"""

import numpy as np
import pyarrow as pa

HASH_RANGE = (1 << 63) - 1  # `to_hash_bucket_fast`'s buckets that keep a fingerprint whole

_K0 = np.uint64(0xC3A5C85C97CB3127)
_K1 = np.uint64(0xB492B66FBE98F273)
_K2 = np.uint64(0x9AE16A3B2F90404F)
_SEED = np.uint64(81)
_SEED_Y = np.uint64((81 * 0xB492B66FBE98F273 + 113) % (1 << 64))  # seed * k1 + 113, wrapped
_SLICE = 16384  # values hashed at a time: the temporaries stay small (parquet_columns.ENCODED_ROWS)


def fingerprints(values):
    """(uint64 [n] fingerprints, int64 [n] lengths) of the values of `values`, an Arrow binary or
    string array (large or not); a null is b"" (length 0)."""
    if values.type not in _OFFSET_TYPES:
        raise TypeError(f"fingerprints takes binary or string values, not {values.type}")
    offset_type = _OFFSET_TYPES[values.type]
    buffers = values.buffers()
    offsets = np.frombuffer(buffers[1], offset_type)[values.offset:values.offset + len(values) + 1]
    starts = offsets[:-1].astype(np.int64)
    lengths = (offsets[1:] - offsets[:-1]).astype(np.int64)
    if values.null_count:
        lengths[np.asarray(values.is_null())] = 0
    words = _Bytes(buffers[2])
    hashes = np.empty(len(values), np.uint64)
    for start in range(0, len(values), _SLICE):
        end = start + _SLICE
        hashes[start:end] = words.fingerprints(starts[start:end], lengths[start:end])
    return hashes, lengths


_OFFSET_TYPES = {pa.binary(): np.int32, pa.string(): np.int32, pa.large_binary(): np.int64,
                 pa.large_string(): np.int64}
_BRANCH_OF_LENGTH = np.searchsorted([1, 4, 8, 17, 33, 65], np.arange(66), side="right")


class _Bytes:
    """The bytes the values lie in (an Arrow buffer), read as little-endian words at any byte
    offset; FarmHash reads only within a value, so the buffer is used as it is."""

    def __init__(self, buffer):
        data = np.zeros(0, np.uint8) if buffer is None else np.frombuffer(buffer, np.uint8)
        if len(data) < 8:
            data = np.concatenate([data, np.zeros(8 - len(data), np.uint8)])
        self._bytes = data
        self._words64 = np.ndarray((len(data) - 7,), "<u8", data, strides=(1,))
        self._words32 = np.ndarray((len(data) - 3,), "<u4", data, strides=(1,))

    def fetch64(self, at):
        """The uint64 words at byte offsets `at` (int64 [n], or a _Run: a view, not a copy)."""
        if isinstance(at, _Run):
            return np.ndarray((at.count,), "<u8", self._bytes, at.first, (at.step,))
        return self._words64[at]

    def fetch32(self, at):
        if isinstance(at, _Run):
            return np.ndarray((at.count,), "<u4", self._bytes, at.first,
                              (at.step,)).astype(np.uint64)
        return self._words32[at].astype(np.uint64)

    def byte(self, at):
        return self._bytes[at].astype(np.uint64)

    def fingerprints(self, starts, lengths):
        """uint64 [n] of the values at `starts` of `lengths` bytes (int64 [n] each)."""
        hashers = (None, self._len1to3, self._len4to7, self._len8to16, self._len17to32,
                   self._len33to64, self._long)
        if not len(starts):
            return np.zeros(0, np.uint64)
        first, last = (_BRANCH_OF_LENGTH[min(int(length), 65)]
                       for length in (lengths.min(), lengths.max()))
        if first == last:  # one branch for every value
            return self._hashed(hashers[first], starts, lengths)
        branches = _BRANCH_OF_LENGTH[np.minimum(lengths, 65)]
        hashes = np.empty(len(starts), np.uint64)
        for branch in range(first, last + 1):
            index = np.flatnonzero(branches == branch)
            if len(index):
                hashes[index] = self._hashed(hashers[branch], starts[index], lengths[index])
        return hashes

    @staticmethod
    def _hashed(hasher, starts, lengths):
        """`hasher`'s fingerprints of values of one branch; values of one length (the usual
        case) have it as a scalar, which saves a pass over their lengths in every step."""
        if hasher is None:  # the empty value
            return np.full(len(starts), _K2)
        shortest = lengths.min()
        if shortest != lengths.max():
            return hasher(starts, lengths.astype(np.uint64))
        if shortest >= 4 and shortest <= 64 and starts[-1] - starts[0] == shortest * (
                len(starts) - 1):  # one after another: read in place
            starts = _Run(int(starts[0]), int(shortest), len(starts))
        return hasher(starts, np.uint64(shortest))

    def _len1to3(self, s, n):
        a = self.byte(s)
        b = self.byte(s + (n >> np.uint64(1)).astype(np.int64))
        c = self.byte(s + n.astype(np.int64) - 1)
        y = (a + (b << np.uint64(8))) & np.uint64(0xFFFFFFFF)
        z = (n + (c << np.uint64(2))) & np.uint64(0xFFFFFFFF)
        return _shift_mix(y * _K2 ^ z * _K0) * _K2

    def _len4to7(self, s, n):
        mul = _K2 + n * np.uint64(2)
        a = self.fetch32(s)
        return _hash_len16(n + (a << np.uint64(3)), self.fetch32(s + n.astype(np.int64) - 4),
                           mul)

    def _len8to16(self, s, n):
        mul = _K2 + n * np.uint64(2)
        a = self.fetch64(s) + _K2
        b = self.fetch64(s + n.astype(np.int64) - 8)
        c = _rotate(b, 37) * mul + a
        d = (_rotate(a, 25) + b) * mul
        return _hash_len16(c, d, mul)

    def _len17to32(self, s, n):
        end = s + n.astype(np.int64)
        mul = _K2 + n * np.uint64(2)
        a = self.fetch64(s) * _K1
        b = self.fetch64(s + 8)
        c = self.fetch64(end - 8) * mul
        d = self.fetch64(end - 16) * _K2
        return _hash_len16(_rotate(a + b, 43) + _rotate(c, 30) + d,
                           a + _rotate(b + _K2, 18) + c, mul)

    def _len33to64(self, s, n):
        end = s + n.astype(np.int64)
        mul = _K2 + n * np.uint64(2)
        a = self.fetch64(s) * _K2
        b = self.fetch64(s + 8)
        c = self.fetch64(end - 8) * mul
        d = self.fetch64(end - 16) * _K2
        y = _rotate(a + b, 43) + _rotate(c, 30) + d
        z = _hash_len16(y, a + _rotate(b + _K2, 18) + c, mul)
        e = self.fetch64(s + 16) * mul
        f = self.fetch64(s + 24)
        g = (y + self.fetch64(end - 32)) * mul
        h = (z + self.fetch64(end - 24)) * mul
        return _hash_len16(_rotate(e + f, 43) + _rotate(g, 30) + h,
                           e + _rotate(f + a, 18) + g, mul)

    def _weak_hash_len32(self, at, a, b):
        """farmhashna's WeakHashLen32WithSeeds of the 32 bytes at `at`, seeds `a`, `b`."""
        w, x, y, z = (self.fetch64(at + k) for k in (0, 8, 16, 24))
        a = a + w
        b = _rotate(b + a + z, 21)
        c = a
        a = a + x + y
        b = b + _rotate(a, 44)
        return a + z, b + c

    def _long(self, s, n):
        """Over 64 bytes: 64-byte chunks in a loop, then the last 64 bytes."""
        x = np.full(len(s), _SEED)
        y = np.full(len(s), _SEED_Y)
        z = _shift_mix(y * _K2 + np.uint64(113)) * _K2
        v0 = v1 = w0 = w1 = np.zeros(len(s), np.uint64)
        x = x * _K2 + self.fetch64(s)
        chunks = ((n - np.uint64(1)) // np.uint64(64)).astype(np.int64)
        at = s.copy()
        for chunk in range(int(chunks.max())):
            live = chunks > chunk
            nx = _rotate(x + y + v0 + self.fetch64(at + 8), 37) * _K1
            ny = _rotate(y + v1 + self.fetch64(at + 48), 42) * _K1
            nx = nx ^ w1
            ny = ny + v0 + self.fetch64(at + 40)
            nz = _rotate(z + w0, 33) * _K1
            nv0, nv1 = self._weak_hash_len32(at, v1 * _K1, nx + w0)
            nw0, nw1 = self._weak_hash_len32(at + 32, nz + w1, ny + self.fetch64(at + 16))
            nx, nz = nz, nx
            x, y, z = (np.where(live, new, old) for new, old in ((nx, x), (ny, y), (nz, z)))
            v0, v1, w0, w1 = (np.where(live, new, old) for new, old in
                              ((nv0, v0), (nv1, v1), (nw0, w0), (nw1, w1)))
            at = np.where(live, at + 64, at)
        mul = _K1 + ((z & np.uint64(0xFF)) << np.uint64(1))
        at = s + n.astype(np.int64) - 64
        w0 = w0 + ((n - np.uint64(1)) & np.uint64(63))
        v0 = v0 + w0
        w0 = w0 + v0
        x = _rotate(x + y + v0 + self.fetch64(at + 8), 37) * mul
        y = _rotate(y + v1 + self.fetch64(at + 48), 42) * mul
        x = x ^ (w1 * np.uint64(9))
        y = y + v0 * np.uint64(9) + self.fetch64(at + 40)
        z = _rotate(z + w0, 33) * mul
        v0, v1 = self._weak_hash_len32(at, v1 * mul, x + w0)
        w0, w1 = self._weak_hash_len32(at + 32, z + w1, y + self.fetch64(at + 16))
        x, z = z, x
        return _hash_len16(_hash_len16(v0, w0, mul) + _shift_mix(y) * _K0 + z,
                           _hash_len16(v1, w1, mul) + x, mul)


class _Run:
    """The byte offsets first, first + step, ... (count of them): values of one length lying one
    after another, whose words fetch64 and fetch32 read as strided views."""

    def __init__(self, first, step, count):
        self.first, self.step, self.count = first, step, count

    def __add__(self, shift):
        return _Run(self.first + int(shift), self.step, self.count)

    def __sub__(self, shift):
        return _Run(self.first - int(shift), self.step, self.count)


def _rotate(value, shift):
    return (value >> np.uint64(shift)) | (value << np.uint64(64 - shift))


def _shift_mix(value):
    return value ^ (value >> np.uint64(47))


def _hash_len16(u, v, mul):
    a = (u ^ v) * mul
    a ^= a >> np.uint64(47)
    b = (v ^ a) * mul
    b ^= b >> np.uint64(47)
    return b * mul
