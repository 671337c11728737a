"""What a launcher run wrote, read back for the tests: the values of its newest checkpoint and
its TensorBoard scalars."""

import glob
import os

import numpy as np
import tensorflow as tf

from tfscale.embedding import stored_arrays


def checkpoint_values(checkpoint_dir):
    """{name: array} of every value in the newest checkpoint of a CheckpointStore directory:
    the tables' files' under "<file>/<variable path>" (bfloat16 tables as float32), the per-rank
    state (per_rank.npz) under "per_rank/<name>"."""
    with open(os.path.join(checkpoint_dir, "latest")) as f:
        step_dir = os.path.join(checkpoint_dir, f.read().strip())
    reader = tf.train.load_checkpoint(os.path.join(step_dir, "state"))
    values = {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()
              if not name.startswith("_CHECKPOINTABLE_OBJECT_GRAPH")}
    for path in glob.glob(os.path.join(step_dir, "*.npz")):
        prefix = os.path.basename(path).removesuffix(".npz")
        with np.load(path) as stored:
            for name in stored.files:
                plain = name.removesuffix("@bfloat16")
                values[f"{prefix}/{plain}"] = stored_arrays.read(stored, plain).astype(
                    np.float32) if plain != name else stored[name]
    return values


def train_scalars(logdir):
    """{tag: last value} of the TensorBoard scalars in `logdir`/train (one event file)."""
    events, = glob.glob(f"{logdir}/train/events.out.tfevents.*")
    return {value.tag: float(tf.make_ndarray(value.tensor))
            for event in tf.compat.v1.train.summary_iterator(events)
            for value in event.summary.value}
