"""`main(CHECKPOINT_DIR, OUT_DIR)`, a job of tests/multiworker/jobs.py for
tests/test_table_strategies.py: the launcher run's model (its run record) restored from its newest
checkpoint in one process and exported by `tfscale.serving.export_model` to OUT_DIR/served, which
is loaded back; both score the first test rows of the run's synthetic data, written to
OUT_DIR/scores.npz ("model", "served", and "global_step")."""

import os

import numpy as np
import tensorflow as tf

from launch import run_record
from tfscale.data.synthetic import SyntheticCTR
from tfscale.serving import export_model


def main(checkpoint_dir, out_dir, train_rows, test_rows, vocabulary_scale):
    """The model of `checkpoint_dir`'s run on the synthetic data of these settings (seed 0)."""
    model, progress = run_record.read(checkpoint_dir).restored_model()
    source = SyntheticCTR(seed=0, train_rows=int(train_rows), test_rows=int(test_rows),
                          vocabulary_scale=float(vocabulary_scale))
    features, _ = next(iter(source.test_batches(64)))
    signature = [{name: tf.TensorSpec([None, *value.shape[1:]], value.dtype)
                  for name, value in features.items()}]
    served_dir = os.path.join(out_dir, "served")
    export_model(model, served_dir, input_signature=signature)
    loaded = tf.saved_model.load(served_dir)  # held: its functions read its variables
    served = loaded.serve(features)
    np.savez(os.path.join(out_dir, "scores.npz"), model=model.predict_on_batch(features),
             served=np.asarray(served), global_step=progress["global_step"])
    return 0
