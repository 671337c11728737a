"""tfscale's train step: the same step as Keras's own, except that embedding gradients are
summed per row before the optimizer sees them.

Keras 3's optimizers apply their element-wise math to IndexedSlices occurrence by occurrence:
Adam squares each occurrence's gradient and adds the squares, so an id seen n times in a batch
gets sum(g_i^2) instead of (sum g_i)^2 in its second moment. Densifying first gives Adam's
actual update, the one it makes for any dense weight."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfscale.row_gradients import densify
from tfscale.training.train_step import FunctionalTrainStepModel, TrainStepModel


def _dense_model(base):
    keras.utils.set_random_seed(4)
    inputs = keras.Input((5,))
    hidden = keras.layers.Dense(8, activation="relu")(inputs)
    model = base(inputs, keras.layers.Dense(1, activation="sigmoid")(hidden))
    model.compile(keras.optimizers.Adam(1e-2), "binary_crossentropy", metrics=["auc"])
    return model


def test_same_weights_and_logs_as_keras_train_step():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((512, 5)).astype("float32")
    y = (rng.random((512, 1)) < 0.3).astype("float32")
    ours, theirs = _dense_model(FunctionalTrainStepModel), _dense_model(keras.Model)
    ours_history = ours.fit(x, y, batch_size=64, epochs=2, shuffle=False, verbose=0).history
    theirs_history = theirs.fit(x, y, batch_size=64, epochs=2, shuffle=False, verbose=0).history
    for a, b in zip(ours.get_weights(), theirs.get_weights()):
        np.testing.assert_array_equal(a, b)
    assert ours_history == theirs_history


def _adam_step(gradient):
    variable = keras.Variable(np.zeros((3, 1), "float32"))
    keras.optimizers.Adam(0.1).apply([gradient], [variable])
    return variable.numpy()


def test_embedding_gradients_get_adams_dense_update():
    # Row 0 occurs twice in the batch (gradients 1 and -4), row 2 once.
    slices = tf.IndexedSlices(tf.constant([[1.0], [2.0], [-4.0]]), tf.constant([0, 2, 0]),
                              dense_shape=tf.constant([3, 1]))
    np.testing.assert_array_equal(densify(slices).numpy(), [[-3.0], [0.0], [2.0]])
    dense_update = _adam_step(tf.constant([[-3.0], [0.0], [2.0]]))
    np.testing.assert_array_equal(_adam_step(densify(slices)), dense_update)
    # What Keras does with the raw slices: row 0's second moment is 1 + 16, not 9.
    assert not np.allclose(_adam_step(slices)[0], dense_update[0])

    dense = tf.ones([2])
    assert densify(dense) is dense



def test_subclass_base_refuses_functional_construction():
    inputs = keras.Input((2,))
    with pytest.raises(TypeError, match="FunctionalTrainStepModel"):
        TrainStepModel(inputs, keras.layers.Dense(1)(inputs))
