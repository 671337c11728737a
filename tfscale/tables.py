"""How tfscale tells embedding tables from the other variables, by name alone (so optimizers,
exchanges and placement agree without importing the layers), and how their rows are read:

  any table:  a variable named "embeddings" (keras.layers.Embedding's table, and both of
              tfscale.embeddings.FieldEmbedding's tables)
  deep table: ".../deep_embedding/embeddings"  -> DEEP_TABLE_PATTERN  (clipped by CowClip)
  wide table: ".../wide_embedding/embeddings"  -> WIDE_TABLE_PATTERN  (1 wide, never clipped)

The patterns are for `re.fullmatch` on `variable.path`, as `keras.optimizers.OptimizerMap` and
CowClip's `embedding_tables` use them.

How rows are read: a variable that the optimizer updates by row (scatters) must be read by row
in place (ResourceGather): once a variable is scattered into, TensorFlow copies the whole buffer
on every whole-variable read (its copy-on-read mode), and a whole read still alive at the
scatter is copied too. A variable updated whole (a fused Adam over every row) must be read
whole: an in-place row read would put it in copy-on-read mode and the whole update would copy
it. Either mismatch costs a copy of the table per step, more than a 1K batch's arithmetic. The
train step marks each table by its optimizer (`mark_row_updates`); lookups read by the mark
(`lookup_rows`)."""

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



def mark_row_updates(variable, by_row):
    """Records whether the optimizer updates `variable` (a Keras variable) row by row."""
    variable._tfscale_updated_by_row = bool(by_row)


def lookup_rows(table, rows):
    """Rows `rows` (int, any shape) of `table` (a Keras variable, not autocast), read as its
    optimizer updates it (`mark_row_updates`; whole when unmarked); their gradient is row slices
    (IndexedSlices)."""
    return gather_rows(table, rows, in_place=getattr(table, "_tfscale_updated_by_row", False))


def gather_rows(variable, rows, in_place):
    """Rows `rows` of `variable` (a Keras or tf.Variable, not autocast): `in_place`, a
    ResourceGather; otherwise a gather from a whole read."""
    resource = variable.value if isinstance(variable, keras.Variable) else variable
    if not isinstance(resource, tf.Variable):
        raise TypeError(f"gather_rows needs a variable that is not autocast; {variable.path} "
                        f"read as a {type(resource).__name__} (create it with autocast=False)")
    if in_place:
        return tf.gather(resource, rows)
    return tf.gather(resource.read_value(), rows)
