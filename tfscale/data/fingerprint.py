"""FarmHash's Fingerprint64 (farmhashna::Hash64: what TensorFlow's `to_hash_bucket_fast` and the
vocabulary's keys hash with) of every value of an Arrow binary array, computed from Arrow's own
buffers by the C kernels in tfscale/data/_kernels.c, without holding the GIL, and the ids the
encoders give values from them (`bucket_ids`, `table_ids`), in the same pass.

Ours because the readers encode categorical values in their reader threads, where Arrow parsed
them: TensorFlow hashes only tf.string tensors, and making those cost more than the hashing
(docs/results/input_path.md). tests/test_fingerprint.py checks every length from 0 to 300 bytes
against TensorFlow's op, bit for bit.
"""

import numpy as np
import pyarrow as pa

import tfscale.data._kernels as _kernels

HASH_RANGE = (1 << 63) - 1  # `to_hash_bucket_fast`'s buckets that keep a fingerprint whole

_OFFSET_TYPES = {pa.binary(): np.int32, pa.string(): np.int32, pa.large_binary(): np.int64,
                 pa.large_string(): np.int64}
_NO_BYTES = np.zeros(0, np.uint8)


def fingerprints(values):
    """(uint64 [n] fingerprints, bool [n] present) of the values of `values`, an Arrow binary or
    string array (large or not); a null or empty value is not present, and its fingerprint is
    b""'s."""
    hashes = np.empty(len(values), np.uint64)
    present = np.empty(len(values), np.bool_)
    _kernels.fingerprints(*_buffers(values), hashes, present)
    return hashes, present


def bucket_ids(values, buckets, first_id, missing, out):
    """Writes into `out` (int64 [n], numpy, a strided column too) `first_id` + the bucket of
    each value of `values` (as `fingerprints` takes them) among `buckets`: its fingerprint modulo
    HASH_RANGE (`to_hash_bucket_fast(value, HASH_RANGE)`) modulo `buckets`; `missing` for a
    value not present."""
    _kernels.bucket_ids(*_buffers(values), int(buckets), int(first_id), int(missing), out)


def table_ids(values, salt, table, absent, missing, out):
    """Writes into `out` (int64 [n], numpy, a strided column too) the id key_table.KeyTable
    `table` holds for each value of `values` (as `fingerprints` takes them), keyed by its
    fingerprint modulo HASH_RANGE XOR `salt` (>= 0); `absent` where the table does not hold the
    key, `missing` for a value not present."""
    _kernels.table_ids(*_buffers(values), int(salt), table.slots, table.tags, int(absent),
                       int(missing), out)


def _buffers(values):
    """(bytes, offsets, validity bitmap or None, its first bit) of Arrow binary `values`, as
    the kernels take them."""
    if values.type not in _OFFSET_TYPES:
        raise TypeError(f"fingerprints take binary or string values, not {values.type}")
    validity, offsets, data = values.buffers()
    offsets = np.frombuffer(offsets, _OFFSET_TYPES[values.type])[
        values.offset:values.offset + len(values) + 1]
    return (_NO_BYTES if data is None else data, offsets,
            validity if values.null_count else None, values.offset)
