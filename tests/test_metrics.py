"""Exact AUC and log loss agree with scikit-learn on the same predictions."""

import numpy as np
import pytest
from sklearn.metrics import log_loss as sklearn_log_loss
from sklearn.metrics import roc_auc_score

from tfscale import metrics


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_auc_matches_sklearn_with_ties_and_narrow_ranges(seed):
    rng = np.random.default_rng(seed)
    labels = (rng.random(200_000) < 0.25).astype(np.float32)
    # Narrowly spread, float32-rounded predictions: many exact ties, as a real model produces.
    predictions = (0.25 + 0.01 * rng.standard_normal(labels.size) + 0.002 * labels).astype(np.float32)
    predictions[:5000] = 0.25  # a large block of ties
    assert abs(metrics.exact_auc(labels, predictions) - roc_auc_score(labels, predictions)) < 1e-9


def test_auc_known_values():
    assert metrics.exact_auc([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8]) == pytest.approx(0.75)
    assert metrics.exact_auc([0, 1], [0.5, 0.5]) == pytest.approx(0.5)
    assert metrics.exact_auc([1, 0], [0.9, 0.1]) == 1.0


def test_auc_needs_both_classes():
    with pytest.raises(ValueError, match="both"):
        metrics.exact_auc([1, 1], [0.2, 0.3])


def test_log_loss_matches_sklearn():
    rng = np.random.default_rng(3)
    labels = (rng.random(10_000) < 0.3).astype(np.float32)
    predictions = rng.random(labels.size)
    assert metrics.log_loss(labels, predictions) == pytest.approx(
        sklearn_log_loss(labels, predictions), rel=1e-9)
