"""The names of FieldEmbedding's two tables, as patterns a user selects them by, and how a
variable's rows are read (`gather_rows`):

  deep table: ".../deep_embedding/embeddings"  -> DEEP_TABLE_PATTERN  (clipped by CowClip)
  wide table: ".../wide_embedding/embeddings"  -> WIDE_TABLE_PATTERN  (1 wide, never clipped)

The patterns are for `re.fullmatch` on `variable.path`, as `keras.optimizers.OptimizerMap` and
CowClip's `embedding_tables` take them, for a FieldEmbedding of a strategy whose tables' variable
is named "embeddings" (tfscale's own). Which variables are embedding tables, and so updated by
row, is not read from names: tfscale.embedding.strategies.table_of answers it."""

import re

import keras
import tensorflow as tf

DEEP_TABLE_NAME = "deep_embedding"
WIDE_TABLE_NAME = "wide_embedding"
DEEP_TABLE_PATTERN = rf"(.*/)?{DEEP_TABLE_NAME}/embeddings"
WIDE_TABLE_PATTERN = rf"(.*/)?{WIDE_TABLE_NAME}/embeddings"


def is_deep_table(variable):
    """Whether `variable` is a deep (per-row clipped) table of a FieldEmbedding."""
    return re.fullmatch(DEEP_TABLE_PATTERN, variable.path) is not None


def is_wide_table(variable):
    """Whether `variable` is a 1-wide linear table of a FieldEmbedding."""
    return re.fullmatch(WIDE_TABLE_PATTERN, variable.path) is not None


def gather_rows(variable, rows, in_place):
    """Rows `rows` of `variable` (a Keras or tf.Variable, not autocast): `in_place`, a
    ResourceGather, for a variable updated by row; otherwise a gather from a whole read, for one
    updated whole (why: tfscale.embedding.table)."""
    resource = variable.value if isinstance(variable, keras.Variable) else variable
    if not isinstance(resource, tf.Variable):
        raise TypeError(f"gather_rows needs a variable that is not autocast; {variable.path} "
                        f"read as a {type(resource).__name__} (create it with autocast=False)")
    if in_place:
        return tf.gather(resource, rows)
    return tf.gather(resource.read_value(), rows)
