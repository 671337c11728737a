"""State that differs between ranks (the top-k exchanges' error-feedback residuals, the stale
embedding updates' queues): `PerRankState`, the base every such state derives from, and its
movement between the ranks and rank 0, which alone writes and reads checkpoints: gathered into
one array per rank to save, handed back to each rank after a restore. The ranks' arrays may
differ in their first dimension (a queue holds as many rows as its steps' unique ids)."""

import abc

import numpy as np
import tensorflow as tf

from tfscale.distributed import runtime


class PerRankState(abc.ABC):
    """Variables of one rank's own, which checkpoints keep per rank
    (tfscale.checkpoints.store)."""

    @abc.abstractmethod
    def build(self, variables):
        """Creates the state for the model's trainable `variables` (once; later calls do
        nothing)."""

    @abc.abstractmethod
    def per_rank_variables(self):
        """{name: tf.Variable} of the built state; names are unique across a model's states."""


def gather_to_chief(variables):
    """{name: [array of rank 0, ..., array of rank P-1]} of each of `variables` ({name:
    tf.Variable}, at least 1-D) on rank 0, None on the other ranks. Every rank must call it."""
    engine = runtime.engine()
    if engine is None:
        return {name: [variable.numpy()] for name, variable in variables.items()}
    gathered = {}
    for i, (name, variable) in enumerate(sorted(variables.items())):
        value = tf.convert_to_tensor(variable)
        rows = engine.allgather(tf.shape(value, out_type=tf.int64)[:1],
                                f"tfscale_per_rank_rows_{i}")
        gathered[name] = (engine.allgather(value, f"tfscale_per_rank_gather_{i}"), rows)
    if engine.rank != 0:
        return None
    return {name: np.split(value.numpy(), np.cumsum(rows.numpy())[:-1])
            for name, (value, rows) in gathered.items()}


def scatter_from_chief(variables, arrays):
    """Assigns to each of `variables` ({name: tf.Variable}) this rank's array of rank 0's
    `arrays` ({name: [array per rank]}, as `gather_to_chief` made them; ignored on other
    ranks). Every rank must call it."""
    engine = runtime.engine()
    if engine is None:
        for name, variable in variables.items():
            variable.assign(arrays[name][0])
        return
    for i, (name, variable) in enumerate(sorted(variables.items())):
        trailing = variable.shape.as_list()[1:]
        if engine.rank == 0:
            value = tf.constant(np.concatenate(arrays[name]), variable.dtype)
            splits = tf.constant([len(a) for a in arrays[name]], tf.int32)
        else:  # only rank 0 sends
            value = tf.zeros([0] + trailing, variable.dtype)
            splits = tf.zeros([engine.size], tf.int32)
        mine, _ = engine.alltoall(value, splits, f"tfscale_per_rank_scatter_{i}")
        variable.assign(mine)
