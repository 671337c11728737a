"""Exact evaluation metrics over a whole split: AUC (ties counted as half, as scikit-learn does)
and log loss. Keras's streaming `AUC` metric buckets predictions into thresholds, which is close
but not exact; final numbers come from here."""

import numpy as np

_LOGLOSS_EPSILON = 1e-7  # predictions are clipped to [eps, 1-eps], as keras's binary crossentropy


def exact_auc(labels, predictions):
    """Area under the ROC curve from the Mann-Whitney rank statistic, with tied predictions
    given their average rank. Raises ValueError if only one class is present."""
    labels = np.asarray(labels, dtype=np.float64).reshape(-1)
    predictions = np.asarray(predictions, dtype=np.float64).reshape(-1)
    if labels.shape != predictions.shape:
        raise ValueError(f"{labels.size} labels but {predictions.size} predictions")
    positives = labels > 0.5
    num_positive = int(positives.sum())
    num_negative = labels.size - num_positive
    if num_positive == 0 or num_negative == 0:
        raise ValueError("AUC needs both positive and negative labels")
    ranks = _average_ranks(predictions)
    rank_sum = ranks[positives].sum()
    return float((rank_sum - num_positive * (num_positive + 1) / 2.0) / (num_positive * num_negative))


def _average_ranks(values):
    """1-based ranks of `values`, ties sharing the average of the ranks they span."""
    order = np.argsort(values, kind="mergesort")
    sorted_values = values[order]
    # Start index of each run of equal values, and the run each sorted position belongs to.
    run_starts = np.flatnonzero(np.r_[True, sorted_values[1:] != sorted_values[:-1]])
    run_ends = np.r_[run_starts[1:], values.size]
    run_of_position = np.repeat(np.arange(run_starts.size), run_ends - run_starts)
    average_rank_of_run = (run_starts + run_ends + 1) / 2.0
    ranks = np.empty(values.size, dtype=np.float64)
    ranks[order] = average_rank_of_run[run_of_position]
    return ranks


def log_loss(labels, predictions):
    """Mean binary cross-entropy of probabilities `predictions` against 0/1 `labels`."""
    labels = np.asarray(labels, dtype=np.float64).reshape(-1)
    p = np.clip(np.asarray(predictions, dtype=np.float64).reshape(-1), _LOGLOSS_EPSILON, 1 - _LOGLOSS_EPSILON)
    return float(-np.mean(labels * np.log(p) + (1 - labels) * np.log1p(-p)))
