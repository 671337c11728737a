"""Owner routing: rows of tables spread over the ranks by key (row-sharded, dynamic), read from
the rank that owns each key (`key mod P`) and, in the backward pass, their gradients taken back
to it. The one place where keys go out to their owners and rows come back; the table kinds
(tfscale.embedding.row_sharding, tfscale.embedding.dynamic) say what an owner answers.

A lookup: this rank's unique keys sorted by owner; one alltoall of (key, count) pairs to the
owners; unique again on the owner, whose count sums are the global batch's; the owner's rows of
its keys; one alltoall of the rows back, in float32 or narrowed to bfloat16 (half the bytes each
way, as TorchRec's quantized communication narrows its embedding alltoalls); the rows put back in
this rank's key order. The backward pass is the mirror: each rank's row gradients, divided by P,
return to the owner by the same alltoall reversed and are summed per key by the owner's gather
gradient. Each rank's loss is the mean over its B/P examples, so a row's gradient is then that
of the global batch's mean loss."""

import dataclasses

import tensorflow as tf

from tfscale.distributed import runtime


@dataclasses.dataclass
class Routed:
    """A routed lookup's result: `rows` [len(keys), width] in the caller's key order, and the
    alltoall's `splits` (keys this rank sent to each owner) and `incoming_splits` (keys each
    rank sent here), for traffic accounting."""

    rows: tf.Tensor
    splits: tf.Tensor
    incoming_splits: tf.Tensor


def rows_from_owners(keys, counts, rows_of_owned, name, pair_dtype=tf.int64,
                     wire_dtype="float32"):
    """The rows of `keys`, each read on its owner (rank `key mod P`).

    Args:
        keys: int64 [n], this rank's unique keys.
        counts: int64 [n], each key's occurrences in this rank's batch.
        rows_of_owned: a function (owned keys int64 [m], unique, all owned here; their counts
            summed over the ranks, int64 [m]) -> float32 [m, width], called on every rank.
        name: names the step's collectives; the same on every rank.
        pair_dtype: the dtype (key, count) pairs travel in (int32 halves the bytes while keys
            fit).
        wire_dtype: "float32" or "bfloat16", the dtype rows and their gradients travel in.

    Returns:
        A Routed.

    Example:
        ```python
        # A table strategy's lookup: rank r holds the rows of ids r, r + P, ...
        routed = tfscale.distributed.rows_from_owners(
            unique_ids, counts, lambda owned, owned_counts: table.read_rows(owned // P),
            name="my_table")
        rows = routed.rows  # [len(unique_ids), width], differentiable
        ```
    """
    engine = runtime.engine()
    num_ranks = engine.size
    owner = tf.cast(keys % num_ranks, tf.int32)
    order = tf.argsort(owner, stable=True)
    splits = tf.math.bincount(owner, minlength=num_ranks, maxlength=num_ranks, dtype=tf.int32)
    outgoing = tf.stack([tf.cast(tf.gather(keys, order), pair_dtype),
                         tf.cast(tf.gather(counts, order), pair_dtype)], axis=1)
    incoming, incoming_splits = engine.alltoall(outgoing, splits, f"{name}_ids")
    incoming = tf.cast(incoming, tf.int64)
    owned, owned_position = tf.unique(incoming[:, 0], out_idx=tf.int64)
    owned_counts = tf.math.unsorted_segment_sum(incoming[:, 1], owned_position, tf.size(owned))
    answers = tf.gather(rows_of_owned(owned, owned_counts), owned_position)
    returned = rows_through_alltoall(answers, incoming_splits, wire_dtype, f"{name}_rows")
    rows = tf.gather(gradient_divided_by(num_ranks)(returned), tf.math.invert_permutation(order))
    return Routed(rows, splits, incoming_splits)


def rows_through_alltoall(rows, splits, wire_dtype, name):
    """Float32 `rows` [n, width] sent by alltoall (`splits`: rows per destination rank), as the
    float32 rows this rank receives; their gradient travels back the same way, in the same
    dtype. `name` must be the same on every rank."""
    engine = runtime.engine()

    @tf.custom_gradient
    def through_the_wire(values):
        received, received_splits = engine.alltoall(_narrowed(values, wire_dtype), splits, name)

        def gradient(upstream):
            returned, _ = engine.alltoall(_narrowed(tf.convert_to_tensor(upstream), wire_dtype),
                                          received_splits, f"{name}_gradient")
            return _widened(returned)

        return _widened(received), gradient

    return through_the_wire(rows)


def gradient_divided_by(num_ranks):
    """The identity, whose gradient is divided by `num_ranks` (a division, as an averaging
    allreduce divides)."""

    @tf.custom_gradient
    def identity(rows):
        return tf.identity(rows), lambda gradient: tf.convert_to_tensor(gradient) / num_ranks

    return identity


def _narrowed(values, wire_dtype):
    return values if wire_dtype == "float32" else tf.cast(values, tf.bfloat16)


def _widened(values):
    return tf.cast(values, tf.float32)
