"""Training batches staged on a device ahead of the step (tfscale.data.pipeline.staged_on_device),
checked on the CPU as the device: every batch arrives, in order, unchanged, and `fit` on staged
batches trains as on the batches themselves. (No GPU here: the staging on a GPU is the same
tf.data transformation with the GPU's name.)"""

import keras
import numpy as np
import tensorflow as tf

from tfscale.data.pipeline import accelerator, staged_on_device


def batches():
    """Batches of (features, labels) of uneven sizes, as a source gives them."""
    rng = np.random.default_rng(0)
    rows = 50
    features = {"dense": rng.normal(size=[rows, 3]).astype(np.float32),
                "categorical": rng.integers(0, 100, size=[rows, 4])}
    labels = rng.integers(0, 2, size=[rows, 1]).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices((features, labels)).batch(8)


def test_staged_batches_arrive_in_order_and_unchanged():
    expected = list(batches().as_numpy_iterator())
    staged = list(staged_on_device(batches(), "/cpu:0").as_numpy_iterator())
    assert len(staged) == len(expected) == 7
    for (features, labels), (want_features, want_labels) in zip(staged, expected):
        assert features.keys() == want_features.keys()
        for name in features:
            assert features[name].dtype == want_features[name].dtype
            np.testing.assert_array_equal(features[name], want_features[name])
        np.testing.assert_array_equal(labels, want_labels)


def test_without_a_gpu_the_dataset_is_left_as_it_is():
    assert accelerator() is None  # the machines these tests run on have none
    dataset = batches()
    assert staged_on_device(dataset) is dataset


def _trained_weights(dataset, steps):
    keras.utils.set_random_seed(0)
    inputs = {"dense": keras.Input([3], name="dense"),
              "categorical": keras.Input([4], dtype="int64", name="categorical")}
    embedded = keras.layers.Flatten()(keras.layers.Embedding(100, 2)(inputs["categorical"]))
    output = keras.layers.Dense(1, activation="sigmoid", name="click")(
        keras.layers.Concatenate()([inputs["dense"], embedded]))
    model = keras.Model(inputs, output)
    model.compile(optimizer="adam", loss="binary_crossentropy")
    model.fit(dataset, epochs=1, steps_per_epoch=steps, verbose=0, shuffle=False)
    return model.get_weights()


def test_fit_on_staged_batches_trains_as_on_the_batches():
    staged = staged_on_device(batches(), "/cpu:0")
    assert int(staged.cardinality()) < 0  # why the launcher gives fit its steps_per_epoch
    for got, want in zip(_trained_weights(staged, 7), _trained_weights(batches(), 7)):
        np.testing.assert_allclose(got, want, rtol=1e-6)
