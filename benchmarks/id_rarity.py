"""Test rows split by how rare their ids are in the training rows, for AUC by id frequency."""

import numpy as np


def rare_row_mask(source, first_row, num_rows, train_rows):
    """A boolean mask over rows [first_row, first_row + num_rows) of a SyntheticCTR `source`: the
    rows whose ids are rarer than the median row's, a row's rarity being the mean over its present
    fields of log(expected occurrences of the id in `train_rows` training rows)."""
    categorical, probabilities = _ids_and_probabilities(source, first_row, num_rows)
    expected = probabilities * train_rows
    present = categorical != 0
    log_count = np.where(present, np.log(np.maximum(expected, 1e-12)), 0.0)
    row_score = log_count.sum(axis=1) / np.maximum(present.sum(axis=1), 1)
    return row_score < np.median(row_score)


def share_below(source, first_row, num_rows, probability):
    """The share of the present ids of rows [first_row, first_row + num_rows) of a SyntheticCTR
    `source` whose probability in their field is below `probability`."""
    categorical, probabilities = _ids_and_probabilities(source, first_row, num_rows)
    present = categorical != 0
    return float(np.mean(probabilities[present] < probability))


def _ids_and_probabilities(source, first_row, num_rows):
    """The rows' categorical ids [rows, fields] and each id's probability in its field."""
    categorical = np.concatenate([batch["categorical"].numpy() for batch in source.rows(
        first_row, num_rows, 65536, keys=("categorical",))])
    probabilities = np.stack([source.id_probability(f, categorical[:, f])
                              for f in range(categorical.shape[1])], axis=1)
    return categorical, probabilities
