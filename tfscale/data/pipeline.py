"""How tfscale's tf.data pipelines are set up (training and test batches, scoring, vocabulary
counting): autotuning off; large tensors a pipeline's functions read (the synthetic data's
per-id tables) held by reference, so that tf.data does not copy them; and training batches
staged on the GPU ahead of the step when there is one.

Why autotuning off: TF 2.21's autotuning thread is not woken when its iterator is deleted, so a
deletion (Keras deletes the epoch's iterator at the end of `fit`, evaluation after each pass) can
wait for the thread's next tick, up to 60 s away once a pipeline has run a minute (18.9 s idle
after a 63 s epoch in `python -m benchmarks.iterator_teardown`). Without it, `AUTOTUNE`
parallelism and buffer sizes take fixed defaults (the Criteo reader measured no slower)."""

import tensorflow as tf


def without_autotuning(dataset):
    """`dataset` with tf.data's autotuning (and so its model thread) turned off."""
    options = tf.data.Options()
    options.autotune.enabled = False
    return dataset.with_options(options)


STAGED_BATCHES = 2  # batches waiting on the GPU while a step runs


def accelerator():
    """The name of the device a step runs on when it is not the CPU (the first GPU this process
    sees: one per process under horovodrun or tfscale.run), else None."""
    gpus = tf.config.list_logical_devices("GPU")
    return gpus[0].name if gpus else None


def staged_on_device(dataset, device=None, buffer_size=STAGED_BATCHES):
    """`dataset` with `buffer_size` of its elements copied to `device` ahead of the step that
    reads them (tf.data's prefetch_to_device: the copy to the GPU overlaps the step before), or
    `dataset` itself when `device` is None and there is no GPU (`accelerator`).

    The staged dataset's length is unknown to tf.data (prefetch_to_device must end a pipeline,
    so no `assert_cardinality` may follow it): give `fit` its `steps_per_epoch`."""
    device = device or accelerator()
    if device is None:
        return dataset
    return dataset.apply(tf.data.experimental.prefetch_to_device(device, buffer_size))


def held_by_reference(tensors):
    """A function that, called inside a tf.data function, gives back `tensors` (a nest of
    tensors and Python values) without tf.data having copied them.

    Why: a tensor a dataset function captures is copied whenever tf.data rewrites the pipeline's
    graph as it makes an iterator (its default static optimizations, and under op determinism
    its make_deterministic rewrite, which no option turns off): at Criteo's cardinalities the
    synthetic teacher's 1.2 GB, at every epoch and evaluation. A tensor list (a variant) holding
    the tensor is captured instead; it shares the tensor's buffer, and reading it back is a
    stateless op, so tf.data keeps the map parallel and the prefetch (a variable, being
    stateful, would make the rewrite turn both off)."""
    flat = tf.nest.flatten(tensors)
    lists = [_one_element_list(value) if isinstance(value, tf.Tensor) else None for value in flat]

    def read():
        values = [value if held is None else _only_element(held, value)
                  for held, value in zip(lists, flat)]
        return tf.nest.pack_sequence_as(tensors, values)

    return read


def _one_element_list(tensor):
    empty = tf.raw_ops.EmptyTensorList(element_shape=tf.constant(-1, tf.int32), max_num_elements=1,
                                       element_dtype=tensor.dtype)
    return tf.raw_ops.TensorListPushBack(input_handle=empty, tensor=tensor)


def _only_element(tensor_list, like):
    """The tensor `tensor_list` holds, with the static shape of `like` (the tensor put in)."""
    tensor = tf.raw_ops.TensorListGetItem(input_handle=tensor_list, index=0,
                                          element_shape=tf.constant(-1, tf.int32),
                                          element_dtype=like.dtype)
    return tf.ensure_shape(tensor, like.shape)
