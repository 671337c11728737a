"""Exact evaluation of a model over a whole (test) split: every prediction is kept, so AUC and
log loss are exact rather than bucketed."""

import weakref

import numpy as np
import tensorflow as tf

from tfscale import metrics

_PREDICT_STEPS = weakref.WeakKeyDictionary()  # model -> its compiled prediction step


def predict_with_labels(model, dataset):
    """Runs `model` over a dataset of (features, labels) and returns (labels, predictions) as
    flat float64 numpy arrays, in dataset order."""

    if model not in _PREDICT_STEPS:
        _PREDICT_STEPS[model] = tf.function(lambda features: model(features, training=False),
                                            reduce_retracing=True)
    predict_step = _PREDICT_STEPS[model]
    labels, predictions = [], []
    for features, batch_labels in dataset:
        predictions.append(tf.cast(predict_step(features), tf.float64).numpy().reshape(-1))
        labels.append(batch_labels.numpy().astype(np.float64).reshape(-1))
    if not labels:
        raise ValueError("the evaluation split is empty")
    return np.concatenate(labels), np.concatenate(predictions)


def evaluate_exact(model, dataset):
    """{"auc", "logloss", "examples"} of `model` on every example of `dataset`."""
    labels, predictions = predict_with_labels(model, dataset)
    return {
        "auc": metrics.exact_auc(labels, predictions),
        "logloss": metrics.log_loss(labels, predictions),
        "examples": int(labels.size),
    }
