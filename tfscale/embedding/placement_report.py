"""The placement line: where a built model's embedding tables (tfscale.embedding.strategies
says which variables they are) and its other variables actually are, against what
tfscale.embedding.placement decides."""

from tfscale.embedding import placement, strategies


def describe(model):
    """One line naming the devices that hold `model`'s (built) embedding tables and its other
    variables.

    Args:
        model: a built Keras model.

    Returns:
        A str, e.g. "placement: embedding tables on CPU:0, dense model on GPU:0"."""
    table_devices, dense_devices = set(), set()
    for variable in model.variables:
        device = _short_device(variable.value.device)
        (table_devices if strategies.is_table(variable) else dense_devices).add(device)
    accelerator = ("" if placement.dense_device() != placement.HOST_DEVICE
                   else " (no accelerator found)")
    return (f"placement: embedding tables on {', '.join(sorted(table_devices)) or 'none'}, dense "
            f"model on {', '.join(sorted(dense_devices)) or 'none'}{accelerator}")


def _short_device(device):
    """"/job:localhost/replica:0/task:0/device:CPU:0" -> "CPU:0"."""
    return device.rsplit("device:", 1)[-1] if device else "unplaced"
