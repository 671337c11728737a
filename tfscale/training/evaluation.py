"""Exact evaluation of a model over a whole (test) split: every prediction is kept, so AUC and
log loss are exact rather than bucketed. Under Horovod each rank predicts its own shard of the
split and the predictions and labels of all ranks are gathered, so the AUC is the union's (not a
mean of per-rank AUCs). A model whose tables are spread over the ranks looks rows up from the
other ranks in its forward pass, so there every rank runs as many passes: one whose shard has ended passes
empty batches until every rank's has."""

import weakref

import numpy as np
import tensorflow as tf

from tfscale import distributed, metrics
from tfscale.data.rank_batches import padded_to_longest
from tfscale.embedding.table import model_tables

_PREDICT_STEPS = weakref.WeakKeyDictionary()  # model -> its compiled prediction step


def predict_with_labels(model, dataset):
    """Runs `model` over a dataset of (features, labels) and returns (labels, predictions) as
    flat float64 numpy arrays, in dataset order (under Horovod: every rank's, in rank order)."""

    if model not in _PREDICT_STEPS:
        # No AutoGraph: nothing to convert, and it cannot parse a lambda's source (a warning).
        _PREDICT_STEPS[model] = tf.function(lambda features: model(features, training=False),
                                            reduce_retracing=True, autograph=False)
    predict_step = _PREDICT_STEPS[model]
    labels, predictions = [np.zeros([0])], [np.zeros([0])]
    for features, batch_labels in _in_step_with_other_ranks(model, dataset):
        predictions.append(tf.cast(predict_step(features), tf.float64).numpy().reshape(-1))
        labels.append(batch_labels.numpy().astype(np.float64).reshape(-1))
    # Gathered before the emptiness check: a rank with an empty shard must still take part.
    labels = distributed.allgather_array(np.concatenate(labels), name="tfscale_eval_labels")
    predictions = distributed.allgather_array(np.concatenate(predictions),
                                              name="tfscale_eval_predictions")
    if not labels.size:
        raise ValueError("the evaluation split is empty")
    return labels, predictions


def _in_step_with_other_ranks(model, dataset):
    """`dataset`'s batches; for a model whose lookups are collectives
    (TableStrategy.lookups_span_ranks), followed by empty batches until no rank has any left."""
    if not any(table.strategy.lookups_span_ranks for table in model_tables(model)):
        return dataset
    return padded_to_longest(dataset)


def evaluate_exact(model, dataset):
    """{"auc", "logloss", "examples"} of `model` on every example of `dataset`.

    Args:
        model: a Keras model predicting a click probability per example.
        dataset: a tf.data.Dataset of (features, labels) batches; under Horovod, this rank's
            part (every rank calls it).

    Returns:
        A dict: "auc" and "logloss" over every rank's examples, "examples" their number.

    Raises:
        ValueError: `dataset` is empty on every rank, or its labels are all of one class.

    Example:
        ```python
        test = tfscale.data.rank_batches(source, 65536, split="test", drop_remainder=False)
        # {"auc": ..., "logloss": ..., "examples": ...}:
        tfscale.training.evaluate_exact(model, test)
        ```
    """
    labels, predictions = predict_with_labels(model, dataset)
    return {
        "auc": metrics.exact_auc(labels, predictions),
        "logloss": metrics.log_loss(labels, predictions),
        "examples": int(labels.size),
    }
