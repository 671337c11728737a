"""Sparse allreduces of (index, value) candidates, the collectives of the top-k embedding
gradient exchanges (docs/gtopk.md):

- `gtopk_allreduce`: the global top-k of the sum (gTopKAllReduce), as a butterfly of log2(P)
  pairwise alltoall rounds of k pairs each: O(k log P) bytes per rank (on TensorFlow's engine,
  whose alltoall takes equal chunks, a round sends k rows to every rank, most of them padding);
- `topk_allgather`: every rank's candidates allgathered and summed (TopKAllReduce, the
  baseline): O(k P) bytes per rank.

Both run inside a tf.function (no XLA) on every rank of the job, with the same `name`, and
return identical indices and sums on every rank. Indices travel as int64 (bit-cast into the
value buffer, never converted to floats), so tables beyond 2^24 rows keep exact ids; one
collective per round carries indices and values together.

Merging two lists (both partners do it identically, the lower rank's list first): values of equal
indices are added, entries are ordered by magnitude (|value| or the row's L2 norm), ties to the
entry listed first (the lower rank's list, then list order), and the first k kept; fewer than k real entries are padded with EMPTY_INDEX, which
never takes part in a sum. A P that is not a power of two is folded: rank P2 + i (P2 the largest
power of two below P) first hands its list to rank i, the P2 ranks run the butterfly, and rank i
hands the result back."""

import collections

import tensorflow as tf

from tfscale.distributed import runtime
from tfscale.distributed.traffic import tensor_bytes

EMPTY_INDEX = -1

SparseSum = collections.namedtuple("SparseSum", "indices values mask bytes_sent bytes_received")
SparseSum.__doc__ = """The result of a sparse allreduce, identical on every rank except `mask` and
the byte counts: `indices` (int64 [n]) and summed `values` ([n] or [n, d]) of the kept entries,
largest first (topk_allgather's: in order of first appearance); `mask` (bool, one per local
candidate) says which of this rank's candidates are part of those sums (what error feedback may
zero); `bytes_sent` / `bytes_received` (float64 scalars) are the payload this rank moved."""


def gtopk_allreduce(indices, values, k, name):
    """The k entries of largest magnitude of the sum over ranks of each rank's sparse candidates
    (gTopKAllReduce in butterfly form).

    Args:
        indices: int64 [n], this rank's candidate indices, distinct and >= 0 (n may differ
            between ranks, and may exceed k: then only this rank's k largest take part).
        values: float [n] (element-wise) or [n, d] (rows, ranked by their L2 norm).
        k: the number of entries to keep, an int or int32 scalar tensor equal on every rank.
        name: a name unique to this exchange, equal on every rank.

    Returns:
        A SparseSum of at most k entries (fewer when fewer distinct indices exist).

    Raises:
        ValueError: `values` is neither [n] nor [n, d].

    Example:
        ```python
        summed = tfscale.distributed.gtopk_allreduce(my_indices, my_values, k=100,
                                                     name="table_0")
        summed.indices, summed.values  # the same on every rank
        ```
    """
    engine = runtime.engine()
    num_ranks = 1 if engine is None else engine.size
    rank = 0 if engine is None else engine.rank
    indices, rows, flat = _as_rows(indices, values)
    k = tf.cast(k, tf.int32)
    own = tf.ones_like(indices, tf.int32)
    entries = _top_k(indices, rows, tf.stack([own, tf.zeros_like(own)], axis=1), k)
    sent = tf.constant(0.0, tf.float64)
    received = tf.constant(0.0, tf.float64)
    if num_ranks > 1:
        power = 1 << (num_ranks.bit_length() - 1)  # the largest power of two <= P
        extra = num_ranks - power
        # Fold (when P is no power of two): rank power + i sends its list to rank i, whose
        # merge tracks it as the guest.
        partner = rank - power if rank >= power else (rank + power if rank < extra else None)
        sending = rank >= power
        receiving = partner is not None and not sending
        if extra:
            incoming, sent_now, received_now = _swap(
                engine, entries, partner if sending else None, partner if receiving else None,
                f"{name}_fold")
            sent, received = sent + sent_now, received + received_now
        if receiving:
            entries = _merge(entries, _as_guest(incoming), k)
        for round_index in range(power.bit_length() - 1):
            butterfly_partner = rank ^ (1 << round_index) if rank < power else None
            incoming, sent_now, received_now = _swap(
                engine, entries, butterfly_partner, butterfly_partner, f"{name}_round{round_index}")
            sent, received = sent + sent_now, received + received_now
            if butterfly_partner is not None:
                theirs = _without_flags(incoming)
                entries = _merge(entries, theirs, k) if rank < butterfly_partner \
                    else _merge(theirs, entries, k)
        if extra:
            # Unfold: rank i returns the result, with which of the guest's entries survived.
            incoming, sent_now, received_now = _swap(
                engine, _with_guest_as_own(entries) if receiving else entries,
                partner if receiving else None, partner if sending else None, f"{name}_unfold",
                carry_flag=True)
            sent, received = sent + sent_now, received + received_now
        if sending:
            entries = incoming
    final_indices, final_rows, flags = entries
    real = tf.not_equal(final_indices, EMPTY_INDEX)
    survivors = tf.boolean_mask(final_indices, tf.logical_and(real, flags[:, 0] > 0))
    mask = _is_in(indices, survivors)
    final_rows = tf.boolean_mask(final_rows, real)
    return SparseSum(tf.boolean_mask(final_indices, real),
                     final_rows[:, 0] if flat else final_rows, mask, sent, received)


def topk_allgather(indices, values, name):
    """Every rank's candidates allgathered and summed per index (TopKAllReduce): all of them
    reach the sum, so `mask` is all true.

    Args:
        indices: int64 [n], this rank's candidate indices (n may differ between ranks).
        values: float [n] (element-wise) or [n, d] (rows).
        name: a name unique to this exchange, equal on every rank.

    Returns:
        A SparseSum of every distinct index of all ranks' candidates.

    Raises:
        ValueError: `values` is neither [n] nor [n, d].

    Example:
        ```python
        summed = tfscale.distributed.topk_allgather(my_indices, my_values, name="table_0")
        summed.indices, summed.values  # the same on every rank
        ```
    """
    engine = runtime.engine()
    indices, rows, flat = _as_rows(indices, values)
    packed = _pack(indices, rows)
    sent = received = tf.constant(0.0, tf.float64)
    if engine is not None:
        everyone = engine.allgather(packed, name)
        own_bytes = tensor_bytes(packed)
        # Ring allgather: each rank forwards P-1 chunks and receives the P-1 others'.
        received = tensor_bytes(everyone) - own_bytes
        sent = own_bytes * (engine.size - 1)
        packed = everyone
    all_indices, all_rows = _unpack(packed, rows.dtype)
    unique, segment = tf.unique(all_indices, out_idx=tf.int32)
    sums = tf.math.unsorted_segment_sum(all_rows, segment, tf.size(unique))
    mask = tf.ones_like(indices, tf.bool)
    return SparseSum(unique, sums[:, 0] if flat else sums, mask, sent, received)


def _as_rows(indices, values):
    """(int64 indices, [n, d] values, whether the values were [n])."""
    indices = tf.cast(tf.convert_to_tensor(indices), tf.int64)
    values = tf.convert_to_tensor(values)
    if values.shape.rank not in (1, 2):
        raise ValueError(f"values must be [n] or [n, d], got shape {values.shape}")
    flat = values.shape.rank == 1
    return indices, values[:, None] if flat else values, flat


def _top_k(indices, rows, flags, k):
    """The k entries of largest row norm (ties: the one listed first), padded to k with
    EMPTY_INDEX entries of zero value and no flags."""
    norms = tf.norm(tf.cast(rows, tf.float64 if rows.dtype == tf.float64 else tf.float32),
                    axis=1)
    norms = tf.where(tf.equal(indices, EMPTY_INDEX), tf.cast(-1.0, norms.dtype), norms)
    # top_k puts the lower position first among equal values.
    order = tf.math.top_k(norms, k=tf.minimum(k, tf.size(norms)), sorted=True).indices
    missing = k - tf.size(order)
    return (tf.pad(tf.gather(indices, order), [[0, missing]], constant_values=EMPTY_INDEX),
            tf.pad(tf.gather(rows, order), [[0, missing], [0, 0]]),
            tf.pad(tf.gather(flags, order), [[0, missing], [0, 0]]))


def _merge(first, second, k):
    """`first` and `second` (lists of distinct indices) summed per index, top k kept; each
    survivor's flags are the sum of its contributors' (own, guest) flags."""
    indices = tf.concat([first[0], second[0]], axis=0)
    unique, segment = tf.unique(indices, out_idx=tf.int32)
    count = tf.size(unique)
    rows = tf.math.unsorted_segment_sum(tf.concat([first[1], second[1]], axis=0), segment, count)
    flags = tf.math.unsorted_segment_sum(tf.concat([first[2], second[2]], axis=0), segment,
                                         count)
    # The EMPTY_INDEX segment sums paddings only: zero value, no flags, and ranked last.
    return _top_k(unique, rows, flags, k)


def _is_in(values, members):
    """Per element of `values`, whether it is among `members` (hashing, O(n + k) memory)."""
    unique, segment = tf.unique(tf.concat([members, values], axis=0), out_idx=tf.int32)
    member = tf.concat([tf.ones_like(members, tf.int32), tf.zeros_like(values, tf.int32)], axis=0)
    present = tf.math.unsorted_segment_max(member, segment, tf.size(unique))
    return tf.gather(present, segment[tf.size(members):]) > 0


def _without_flags(entries):
    indices, rows = entries[0], entries[1]
    return indices, rows, tf.zeros([tf.shape(indices)[0], 2], tf.int32)


def _as_guest(entries):
    """A folded-in rank's list: its entries are tracked in the guest flag column."""
    indices, rows = entries[0], entries[1]
    ones = tf.ones_like(indices, tf.int32)
    return indices, rows, tf.stack([tf.zeros_like(ones), ones], axis=1)


def _with_guest_as_own(entries):
    """The final list as the folded-in rank sees it: its own flag is the guest column."""
    indices, rows, flags = entries
    return indices, rows, flags[:, ::-1]


def _swap(engine, entries, send_to, receive_from, name, carry_flag=False):
    """One alltoall every rank calls: this rank sends `entries` to `send_to` (None: nothing) and
    gets the list `receive_from` sends (None: nothing expected). With `carry_flag` the own-flag
    column travels too. Returns (received entries or None, bytes sent, bytes received)."""
    indices, rows, flags = entries
    packed = _pack(indices, rows)
    if carry_flag:
        packed = tf.concat([packed, tf.cast(flags[:, :1], packed.dtype)], axis=1)
    if send_to is None:
        packed = packed[:0]
    count = tf.shape(packed)[0]
    splits = tf.one_hot(send_to if send_to is not None else 0, engine.size, dtype=tf.int32) * count
    output, _ = engine.alltoall(packed, splits, name)
    sent = tensor_bytes(packed)
    received = tensor_bytes(output)
    if receive_from is None:
        return None, sent, received
    incoming_flags = tf.zeros([tf.shape(output)[0], 2], tf.int32)
    if carry_flag:
        own = tf.cast(output[:, -1], tf.int32)
        incoming_flags = tf.stack([own, tf.zeros_like(own)], axis=1)
        output = output[:, :-1]
    incoming_indices, incoming_rows = _unpack(output, rows.dtype)
    return (incoming_indices, incoming_rows, incoming_flags), sent, received


def _index_columns(dtype):
    """How many `dtype` columns hold one bit-cast int64 index."""
    return max(1, 8 // tf.as_dtype(dtype).size)


def _pack(indices, rows):
    """[n, index columns + d] of `rows.dtype`: the indices' int64 bits, then the values."""
    bits = tf.reshape(tf.bitcast(indices, rows.dtype), [-1, _index_columns(rows.dtype)])
    return tf.concat([bits, rows], axis=1)


def _unpack(packed, dtype):
    columns = _index_columns(dtype)
    bits = packed[:, :columns]
    indices = tf.bitcast(bits if columns > 1 else bits[:, 0], tf.int64)
    return indices, packed[:, columns:]
