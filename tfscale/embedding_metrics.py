"""What the train step reports about its embedding half, per step, for TensorBoard: the unique-id
rate of the batch's de-duplicated lookups, the staleness of the embedding gradients it applied,
and the wall time of the exchange that carried them."""

import time

import tensorflow as tf


class EmbeddingStepMetrics:
    """Variables the train step assigns and `summary_scalars` reads; a metric appears once the
    step has recorded it."""

    def __init__(self):
        self._variables = {}

    def record(self, name, value):
        if name not in self._variables:
            with tf.init_scope():
                self._variables[name] = tf.Variable(0.0, dtype=tf.float64, trainable=False)
        self._variables[name].assign(tf.cast(value, tf.float64))

    def record_unique_rate(self, lookups):
        """Unique (table, id) pairs over ids looked up, in this rank's batch (1: no repeats)."""
        if lookups.tables:
            self.record("embedding/unique_id_rate",
                        tf.cast(lookups.unique_ids(), tf.float64)
                        / tf.cast(tf.maximum(lookups.ids_looked_up, 1), tf.float64))

    def summary_scalars(self):
        return {name: float(variable.numpy()) for name, variable in self._variables.items()}


def timed(inputs, run):
    """(run(), seconds from when `inputs` (tensors) are ready until run()'s outputs are) in the
    graph; the time includes whatever runs alongside it. The clock is read by a py_function:
    tf.timestamp refuses to run under op determinism (the launcher's --deterministic)."""
    with tf.control_dependencies(inputs):
        start = _clock()
    with tf.control_dependencies([start]):
        outputs = run()
    flat = [t for t in tf.nest.flatten(outputs, expand_composites=True) if t is not None]
    with tf.control_dependencies(flat):
        end = _clock()
    return outputs, end - start


def _clock():
    return tf.py_function(time.perf_counter, [], tf.float64)
