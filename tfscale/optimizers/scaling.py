"""Large-batch hyper-parameter rules as functions of the batch size: CowClip's rule
(docs/cowclip.md) and the plain no / sqrt / linear learning-rate scaling rules it is compared
against, from a preset's base (tuned at batch 1024 unless it says otherwise): CowClip's published Criteo and Avazu bases (for those
real data sets) or the base tuned on tfscale's built-in synthetic data (benchmarks.cowclip_tuned).
Each preset also names the rule that kept AUC best on its data at large batch, the default.

With s = batch / the base's batch (1024 for the presets), CowClip keeps the embedding learning rate (Criteo: 1e-4), scales L2 linearly
(1e-5 * s), the dense learning rate by sqrt(s) (with a linear warm-up over the first epoch), and
clips per id with r = 1 and the preset's zeta. (The official README's table lists l2 = 1e-4 * s
while its commands use 1e-5 * s; the contract, and this module, use 1e-5 * s.)"""

import dataclasses
import math

BASE_BATCH_SIZE = 1024
RULES = ("cowclip", "none", "sqrt", "linear")


@dataclasses.dataclass(frozen=True)
class Preset:
    """A data set's base (batch 1024) hyper-parameters and the rule to scale them with.

    Args:
        dense_learning_rate: the learning rate of the variables other than embedding tables.
        embedding_learning_rate: the embedding tables' learning rate.
        l2: L2 on the embedding tables.
        embedding_init_stddev: the standard deviation of the tables' initial rows.
        r: CowClip's clip ratio.
        zeta_small_batch: CowClip's zeta below `zeta_switch_batch`.
        zeta_large_batch: CowClip's zeta from `zeta_switch_batch` on.
        zeta_switch_batch: the batch size from which `zeta_large_batch` applies.
        rule: the default rule from this base, one of RULES.
        batch_size: the batch the base was tuned at.

    Raises:
        ValueError: `rule` is not one of RULES, or `batch_size` is below 1.

    Example:
        ```python
        mine = tfscale.optimizers.Preset(dense_learning_rate=2.5e-3, embedding_learning_rate=1e-3,
                                         l2=1e-5, rule="sqrt")  # tuned at batch 1,024 on your data
        tfscale.optimizers.large_batch_settings(65536, preset=mine).dense_learning_rate  # 0.02
        ```
    """

    dense_learning_rate: float
    embedding_learning_rate: float = 1e-4
    l2: float = 1e-5
    embedding_init_stddev: float = 1e-2
    r: float = 1.0
    zeta_small_batch: float = 1e-5  # zeta below `zeta_switch_batch`
    zeta_large_batch: float = 1e-5
    zeta_switch_batch: int = 4096
    rule: str = "cowclip"  # the default rule from this base
    batch_size: int = BASE_BATCH_SIZE  # the batch the base was tuned at (last: keeps positions)

    def __post_init__(self):
        if self.rule not in RULES:
            raise ValueError(f"Preset rule must be one of {RULES}, got {self.rule!r}")
        if self.batch_size < 1:
            raise ValueError(f"Preset batch_size must be positive, got {self.batch_size}")

    def zeta(self, batch_size):
        """CowClip's zeta at `batch_size`.

        Args:
            batch_size: the global batch size.

        Returns:
            `zeta_small_batch` below `zeta_switch_batch`, else `zeta_large_batch`."""
        if batch_size < self.zeta_switch_batch:
            return self.zeta_small_batch
        return self.zeta_large_batch


PRESETS = {
    # CowClip's published bases, tuned on the real data sets, where CowClip's rule kept AUC.
    "criteo": Preset(dense_learning_rate=8e-4),
    "avazu": Preset(dense_learning_rate=1e-4, zeta_small_batch=1e-3, zeta_large_batch=1e-4),
    # The built-in synthetic data (tfscale.data.synthetic): the coordinate search of
    # benchmarks.cowclip_tuned at batch 1024 and its scale stage, where sqrt scaling kept AUC
    # and CowClip's rule did not (docs/results/cowclip_tuned.md); zeta Criteo's.
    "synthetic": Preset(dense_learning_rate=2.5e-3, embedding_learning_rate=1e-3, rule="sqrt"),
}


@dataclasses.dataclass(frozen=True)
class LargeBatchSettings:
    """Every hyper-parameter a run at `batch_size` needs under one rule.

    Args:
        rule: the rule, one of RULES.
        batch_size: the global batch size.
        embedding_learning_rate: the embedding tables' learning rate.
        dense_learning_rate: the other variables' learning rate, after the warm-up.
        warmup_epochs: the dense learning rate rises linearly from ~0 over these epochs.
        l2: L2 on the embedding tables.
        embedding_init_stddev: the standard deviation of the tables' initial rows.
        clip: whether CowClip clips (the "cowclip" rule).
        r: CowClip's clip ratio.
        zeta: CowClip's zeta at `batch_size`.

    Example:
        ```python
        settings = tfscale.optimizers.large_batch_settings(65536, rule="sqrt", preset="synthetic")
        settings.dense_learning_rate, settings.embedding_learning_rate, settings.warmup_epochs
        ```
    """

    rule: str
    batch_size: int
    embedding_learning_rate: float
    dense_learning_rate: float
    warmup_epochs: float  # the dense learning rate rises linearly from ~0 over these epochs
    l2: float
    embedding_init_stddev: float
    clip: bool
    r: float
    zeta: float


def large_batch_settings(batch_size, rule=None, preset="criteo"):
    """The hyper-parameters of `rule` at `batch_size` from a preset's base.

    "cowclip" is CowClip's rule (module docstring). "none", "sqrt" and "linear" are the
    baselines: no clipping, the base L2, and both learning rates multiplied by 1, sqrt(s) or s
    (s = `batch_size` / the base's batch).

    Args:
        batch_size: the global batch size.
        rule: one of RULES; None: the preset's rule (cowclip for criteo and avazu, sqrt for
            synthetic).
        preset: "criteo", "avazu" (CowClip's published bases for those data sets),
            "synthetic" (tfscale's built-in data) or a `Preset` of your own (one tuned on your
            data, at its `batch_size`).

    Returns:
        A LargeBatchSettings.

    Raises:
        ValueError: `batch_size` is below 1, `preset` is neither a name in PRESETS nor a
            Preset, or `rule` is not one of RULES.

    Example:
        ```python
        settings = tfscale.optimizers.large_batch_settings(65536)  # CowClip's rule, Criteo's base
        settings.dense_learning_rate  # 8e-4 * sqrt(64) = 0.0064
        ```
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    base = preset if isinstance(preset, Preset) else PRESETS.get(preset)
    if base is None:
        raise ValueError(f"preset must be one of {sorted(PRESETS)} or a Preset, got {preset!r}")
    rule = base.rule if rule is None else rule
    if rule not in RULES:
        raise ValueError(f"rule must be one of {RULES} or None, got {rule!r}")
    s = batch_size / base.batch_size
    common = dict(rule=rule, batch_size=batch_size, warmup_epochs=1.0,
                  embedding_init_stddev=base.embedding_init_stddev, r=base.r,
                  zeta=base.zeta(batch_size))
    if rule == "cowclip":
        return LargeBatchSettings(
            embedding_learning_rate=base.embedding_learning_rate,
            dense_learning_rate=base.dense_learning_rate * math.sqrt(s),
            l2=base.l2 * s, clip=True, **common)
    factor = {"none": 1.0, "sqrt": math.sqrt(s), "linear": s}[rule]
    return LargeBatchSettings(
        embedding_learning_rate=base.embedding_learning_rate * factor,
        dense_learning_rate=base.dense_learning_rate * factor,
        l2=base.l2, clip=False, **common)
