"""How the table checkpoints (tfscale.embedding.by_row_checkpoint, by_id_checkpoint) put arrays
into .npz files and read them back. NumPy's npz format has no bfloat16: an ml_dtypes bfloat16
array would be stored as raw 2-byte voids with its dtype lost, so a bfloat16 array is stored as
its uint16 bits under `<name>@bfloat16` and read back as bfloat16 (float16 and float32 are
NumPy's own). A checkpoint holds each table in the dtype it was stored in."""

import ml_dtypes
import numpy as np

_BFLOAT16 = "@bfloat16"


def for_npz(arrays):
    """`arrays` ({name: array}) as np.savez keyword arguments (module docstring)."""
    stored = {}
    for name, array in arrays.items():
        array = np.asarray(array)
        if array.dtype == ml_dtypes.bfloat16:
            stored[name + _BFLOAT16] = array.view(np.uint16)
        else:
            stored[name] = array
    return stored


def read(arrays, name):
    """The array `name` of an npz file's `arrays` as it was written (bfloat16 ones too), or
    None when it is not there."""
    if name in arrays.files:
        return arrays[name]
    if name + _BFLOAT16 in arrays.files:
        return arrays[name + _BFLOAT16].view(ml_dtypes.bfloat16)
    return None
