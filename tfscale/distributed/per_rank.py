"""State that differs between ranks (the top-k exchanges' error-feedback residuals) moved
between the ranks and rank 0, which alone writes and reads checkpoints: gathered into arrays with
a leading rank axis to save, handed back slice by slice after a restore."""

import tensorflow as tf

from tfscale.distributed import runtime


def gather_to_chief(variables):
    """{name: array [P, ...]} of every rank's value of each of `variables` ({name:
    tf.Variable}) on rank 0, None on the other ranks. Every rank must call it."""
    hvd = runtime.horovod()
    if hvd is None:
        return {name: variable.numpy()[None] for name, variable in variables.items()}
    gathered = {name: hvd.allgather(tf.convert_to_tensor(variable)[None],
                                    name=f"tfscale_per_rank_gather_{i}")
                for i, (name, variable) in enumerate(sorted(variables.items()))}
    if hvd.rank() != 0:
        return None
    return {name: value.numpy() for name, value in gathered.items()}


def scatter_from_chief(variables, arrays):
    """Assigns to each of `variables` ({name: tf.Variable}) this rank's slice of rank 0's
    `arrays` ({name: array [P, ...]}, as `gather_to_chief` made them; ignored on other ranks).
    Every rank must call it."""
    hvd = runtime.horovod()
    if hvd is None:
        for name, variable in variables.items():
            variable.assign(arrays[name][0])
        return
    for i, (name, variable) in enumerate(sorted(variables.items())):
        if hvd.rank() == 0:
            value = tf.constant(arrays[name], variable.dtype)
        else:
            value = tf.zeros([hvd.size()] + variable.shape.as_list(), variable.dtype)
        everyone = hvd.broadcast(value, root_rank=0, name=f"tfscale_per_rank_scatter_{i}")
        variable.assign(everyone[hvd.rank()])

