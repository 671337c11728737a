"""Numbers a train step reports for TensorBoard, and the protocol of everything that reports them.

`StepScalars` holds one variable per name that the (traced) train step assigns and
`summary_scalars()` reads; `timed` measures the wall time of part of the step in the graph.
`ReportsScalars` is what tfscale.training.callbacks.TrainingMonitor looks for on the model and the
optimizer (the exchange's bytes and time, the unique-id rate, CowClip's clip statistics, the
loss scale)."""

import time
from typing import Protocol, runtime_checkable

import tensorflow as tf


@runtime_checkable
class ReportsScalars(Protocol):
    def summary_scalars(self) -> dict:
        """{name: float} of the last step, for TensorBoard."""


@runtime_checkable
class ReportsProgress(Protocol):
    def progress_text(self) -> str:
        """A few words for the progress line (e.g. the loss scale and the skipped steps)."""


def scalars_of(*objects):
    """The merged `summary_scalars()` of those of `objects` that report scalars."""
    merged = {}
    for item in objects:
        if isinstance(item, ReportsScalars):
            merged.update(item.summary_scalars())
    return merged


class StepScalars:
    """Float64 variables the train step assigns by name; a name appears in `summary_scalars`
    once the step has recorded it."""

    def __init__(self):
        self._variables = {}
        self._clock_anchor = None

    def record(self, name, value):
        if name not in self._variables:
            self._variables[name] = eager_variable(0.0, dtype=tf.float64)
        self._variables[name].assign(tf.cast(value, tf.float64))

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
        """time.perf_counter() read in the graph. Not tf.timestamp, which refuses to run under op
        determinism. The clock must not hold back the rest of the step: tf.function runs stateful
        ops that touch no resource in program order, so it takes an (otherwise unused)
        variable's handle as input, which takes it out of that order."""
        if self._clock_anchor is None:
            self._clock_anchor = eager_variable(0.0)
        return tf.py_function(lambda anchor: time.perf_counter(), [self._clock_anchor.handle],
                              tf.float64)


def eager_variable(initial_value, dtype=None, shape=None):
    """A non-trainable tf.Variable created at once outside any graph being traced, also when
    a tf.function's first trace asks for it. Not lifted into that function as the variables of
    its first call are: a tf.function whose first trace creates any variable traces itself a
    second time (the whole train step, seconds at start-up), which this one does not cause.
    `shape`: as tf.Variable's (a TensorShape with unknown dimensions for a variable whose shape
    changes)."""
    with tf.init_scope():
        return tf.Variable(initial_value, dtype=dtype, shape=shape, trainable=False,
                           experimental_enable_variable_lifting=False)


def _tensors(structure):
    """The tensors of a structure of tensors, IndexedSlices and None."""
    return [t for t in tf.nest.flatten(structure, expand_composites=True) if t is not None]
