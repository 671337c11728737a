"""The feature schema shared by every data source and every model: which dense and categorical
fields a batch holds and how many embedding rows each categorical field needs."""

import dataclasses

# Row 0 of every categorical field is reserved for a missing (empty) value.
MISSING_ID = 0


@dataclasses.dataclass(frozen=True)
class FeatureSchema:
    """Names of the dense and categorical fields, and rows per categorical field.

    A batch from any source is `(features, labels)` with
      features["dense"]:        float32 [batch, len(dense_names)] (already transformed),
      features["categorical"]:  int64   [batch, len(categorical_names)], column f in
                                [0, vocabulary_sizes[f]) (row 0 = missing),
      labels:                   float32 [batch, 1] in {0, 1}.
    """

    dense_names: tuple
    categorical_names: tuple
    vocabulary_sizes: tuple

    def __post_init__(self):
        if len(self.categorical_names) != len(self.vocabulary_sizes):
            raise ValueError(
                f"{len(self.categorical_names)} categorical fields but "
                f"{len(self.vocabulary_sizes)} vocabulary sizes"
            )
        for name, size in zip(self.categorical_names, self.vocabulary_sizes):
            if int(size) < 1:
                raise ValueError(f"categorical field {name!r} has {size} rows; needs at least 1")

    @property
    def num_dense(self):
        return len(self.dense_names)

    @property
    def num_categorical(self):
        return len(self.categorical_names)

    @property
    def total_vocabulary(self):
        return sum(int(s) for s in self.vocabulary_sizes)
