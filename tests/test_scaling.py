"""The large-batch rules give the official CowClip commands' hyper-parameters and the plain
scaling baselines."""

import pytest

from tfscale.optimizers.scaling import Preset, large_batch_settings


@pytest.mark.parametrize("preset, batch, dense_lr, l2, zeta", [
    # The official README's commands: Criteo 8K and 128K, Avazu 64K.
    ("criteo", 8192, 22.6274e-4, 8e-5, 1e-5),
    ("criteo", 131072, 90.5096e-4, 128e-5, 1e-5),
    ("avazu", 65536, 8e-4, 64e-5, 1e-4),
    ("avazu", 2048, 1.41421e-4, 2e-5, 1e-3),
    ("avazu", 4096, 2e-4, 4e-5, 1e-4),
])
def test_cowclip_rule_matches_the_official_commands(preset, batch, dense_lr, l2, zeta):
    settings = large_batch_settings(batch, "cowclip", preset)
    assert settings.dense_learning_rate == pytest.approx(dense_lr, rel=1e-5)
    assert settings.l2 == pytest.approx(l2)
    assert settings.zeta == zeta
    assert settings.embedding_learning_rate == 1e-4
    assert (settings.embedding_init_stddev, settings.warmup_epochs, settings.r) == (1e-2, 1.0, 1.0)
    assert settings.clip


@pytest.mark.parametrize("rule, factor", [("none", 1), ("sqrt", 4), ("linear", 16)])
def test_baseline_rules_scale_both_learning_rates(rule, factor):
    settings = large_batch_settings(16384, rule, "criteo")
    assert settings.dense_learning_rate == pytest.approx(8e-4 * factor)
    assert settings.embedding_learning_rate == pytest.approx(1e-4 * factor)
    assert settings.l2 == 1e-5 and not settings.clip


def test_a_preset_of_your_own_is_scaled_by_the_same_rules():
    base = Preset(dense_learning_rate=1e-3, embedding_learning_rate=3e-3, l2=1e-6,
                  embedding_init_stddev=1e-3)
    cowclip = large_batch_settings(4096, "cowclip", base)
    assert (cowclip.embedding_learning_rate, cowclip.l2) == (3e-3, pytest.approx(4e-6))
    assert cowclip.dense_learning_rate == pytest.approx(2e-3)
    assert cowclip.embedding_init_stddev == 1e-3
    linear = large_batch_settings(4096, "linear", base)
    assert (linear.embedding_learning_rate, linear.dense_learning_rate, linear.l2) == (
        pytest.approx(12e-3), pytest.approx(4e-3), 1e-6)


def test_a_base_tuned_at_another_batch_is_scaled_from_that_batch():
    base = Preset(dense_learning_rate=1e-3, embedding_learning_rate=2e-3, l2=1e-6, rule="sqrt",
                  batch_size=4096)
    sqrt = large_batch_settings(16384, preset=base)
    assert (sqrt.dense_learning_rate, sqrt.embedding_learning_rate, sqrt.l2) == (
        pytest.approx(2e-3), pytest.approx(4e-3), 1e-6)
    cowclip = large_batch_settings(16384, "cowclip", base)
    assert (cowclip.embedding_learning_rate, cowclip.l2) == (2e-3, pytest.approx(4e-6))
    assert large_batch_settings(4096, "linear", base).dense_learning_rate == 1e-3


def test_bad_arguments():
    with pytest.raises(ValueError, match="rule"):
        large_batch_settings(1024, "cube")
    with pytest.raises(ValueError, match="preset"):
        large_batch_settings(1024, "cowclip", "movielens")
    with pytest.raises(ValueError, match="batch_size"):
        large_batch_settings(0)
    with pytest.raises(ValueError, match="Preset batch_size"):
        Preset(dense_learning_rate=1e-3, batch_size=0)
