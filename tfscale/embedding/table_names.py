"""How tfscale tells embedding tables from the other variables, by name alone (so optimizers,
exchanges and placement agree without importing the layers), and how a variable's rows are read
(`gather_rows`):

  any table:  a variable named "embeddings" (keras.layers.Embedding's table, and both of
              tfscale.embedding.field_embedding.FieldEmbedding's tables)
  deep table: ".../deep_embedding/embeddings"  -> DEEP_TABLE_PATTERN  (clipped by CowClip)
  wide table: ".../wide_embedding/embeddings"  -> WIDE_TABLE_PATTERN  (1 wide, never clipped)

The patterns are for `re.fullmatch` on `variable.path`, as `keras.optimizers.OptimizerMap` and
CowClip's `embedding_tables` use them.

Tables of a FieldEmbedding are also Tables (tfscale.embedding.table), which say how they are
held and updated."""

import re

import keras
import tensorflow as tf

DEEP_TABLE_NAME = "deep_embedding"
WIDE_TABLE_NAME = "wide_embedding"
DEEP_TABLE_PATTERN = rf"(.*/)?{DEEP_TABLE_NAME}/embeddings"
WIDE_TABLE_PATTERN = rf"(.*/)?{WIDE_TABLE_NAME}/embeddings"


def is_embedding_table(variable):
    """Whether `variable` is named like an embedding table."""
    return variable.path.split("/")[-1] == "embeddings"


def is_row_table(variable):
    """Whether `variable` is a 2-D embedding table, whose gradient comes in rows."""
    return is_embedding_table(variable) and len(variable.shape) == 2


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
