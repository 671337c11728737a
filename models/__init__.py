"""Reference CTR models built on tfscale, and the registry the launcher picks them from.

`models` is a top-level package found from the repository root (run from there, or put the root
on PYTHONPATH); it is not installed into site-packages.
"""

from models.base import CTRModel
from models.dcn import DCN
from models.dcn_v2 import DCNv2
from models.deepfm import DeepFM
from models.wide_deep import WideDeep
from tfscale.errors import UserError

MODELS = {
    "deepfm": DeepFM,
    "wide_deep": WideDeep,
    "dcn": DCN,
    "dcn_v2": DCNv2,
}


def build_model(name, schema, **config):
    """The model registered as `name` for `schema`, constructed with `config` and built (its
    variables exist, so optimizers can be set up before the first batch)."""
    if name not in MODELS:
        raise UserError(f"unknown model {name!r}; known models: {', '.join(sorted(MODELS))}")
    model = MODELS[name](schema, **config)
    model.build()
    return model


__all__ = ["CTRModel", "DCN", "DCNv2", "DeepFM", "MODELS", "WideDeep", "build_model"]
