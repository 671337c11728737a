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
        self._clock_anchor = None

    def record(self, name, value):
        if name not in self._variables:
            with tf.init_scope():
                self._variables[name] = tf.Variable(0.0, dtype=tf.float64, trainable=False)
        self._variables[name].assign(tf.cast(value, tf.float64))

    def record_unique_rate(self, lookups):
        """Unique (table, id) pairs over ids looked up, in this rank's batch (1: no repeats)."""
        if lookups.tables:
            self.record("embedding/unique_id_rate",
                        lookups.unique_ids() / tf.maximum(lookups.ids_looked_up(), 1.0))

    def summary_scalars(self):
        return {name: float(variable.numpy()) for name, variable in self._variables.items()}

    def timed(self, inputs, run):
        """(run(), seconds from when `inputs` (tensors, IndexedSlices or None) are ready until
        run()'s outputs are), in the graph; the time includes whatever runs alongside it."""
        with tf.control_dependencies(_tensors(inputs)):
            start = self._clock()
        with tf.control_dependencies([start]):
            outputs = run()
        with tf.control_dependencies(_tensors(outputs)):
            end = self._clock()
        return outputs, end - start

    def _clock(self):
        """time.perf_counter() read in the graph. Not tf.timestamp: it refuses to run under op
        determinism (the launcher's --deterministic). And a clock op must not delay the train
        step: tf.function runs stateful ops that touch no resource in program order, so a clock
        read after the stale exchange would hold back every later such op (the ids' range
        check at the start of the forward pass) until the exchange is done, undoing the overlap.
        A resource input (an otherwise unused variable's handle) takes the clock out of that
        order."""
        if self._clock_anchor is None:
            with tf.init_scope():
                self._clock_anchor = tf.Variable(0.0, trainable=False)
        return tf.py_function(lambda anchor: time.perf_counter(), [self._clock_anchor.handle],
                              tf.float64)


def _tensors(structure):
    """The tensors of a structure of tensors, IndexedSlices and None."""
    return [t for t in tf.nest.flatten(structure, expand_composites=True) if t is not None]
