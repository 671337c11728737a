"""The tf.data options of every pipeline tfscale iterates (training and test batches, scoring,
vocabulary counting): autotuning off.

Why: TF 2.21's autotuning thread is not woken when its iterator is deleted, so each deletion
(Keras deletes the epoch's iterator at the end of `fit`, evaluation after each pass) waits for
the thread's next tick: up to 60 s once a pipeline has run a minute, whole seconds idle at the end
of every epoch (`python -m benchmarks.iterator_teardown`). Without it, `AUTOTUNE` map parallelism
is the number of cores and prefetch buffers still size themselves."""

import tensorflow as tf


def without_autotuning(dataset):
    """`dataset` with tf.data's autotuning (and so its model thread) turned off."""
    options = tf.data.Options()
    options.autotune.enabled = False
    return dataset.with_options(options)
