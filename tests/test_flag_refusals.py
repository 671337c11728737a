"""Every out-of-range value of `launch.train`'s numeric flags (and of --loss_scale) is refused when
the flags are parsed, with the flag named and what it allows; the table of bad values must list
every numeric flag the launcher defines, so a new flag needs its row. (Parsed in this process:
absl's bounds and validators are what `python -m launch.train` runs before anything else;
tests/test_launcher.py checks the same path end to end for a few values.)"""

import pytest
from absl import flags

from launch import train  # noqa: F401  (defines the launcher's flags)
from launch.user_errors import refuse_non_finite_floats

FLAGS = flags.FLAGS

BAD_VALUES = {
    "train_rows": ["0"],
    "test_rows": ["0"],
    "synthetic_vocabulary_scale": ["0", "1.5", "nan"],
    "test_fraction": ["-0.1", "0.95", "nan"],
    "hash_buckets": ["0"],
    "vocabulary_min_count": ["0"],
    "shuffle_buffer": ["-1"],
    "embedding_dim": ["0"],
    "cross_layers": ["0"],
    "cross_experts": ["0"],
    "batch_size": ["0", "-5", "1e3"],
    "base_batch_size": ["0"],
    "base_learning_rate": ["0", "nan"],
    "base_embedding_learning_rate": ["-1"],
    "base_l2": ["-1"],
    "seed": ["-1", str(2**32)],
    "density": ["0", "1.5", "nan"],
    "density_warmup": ["0", "2", "inf"],
    "density_warmup_epochs": ["-1"],
    "embedding_staleness": ["-1"],
    "dynamic_capacity": ["0"],
    "dynamic_min_count": ["0"],
    "dynamic_expire_after_steps": ["0"],
    "learning_rate": ["0", "-1e-3", "nan", "inf"],
    "embedding_learning_rate": ["0", "nan"],
    "l2": ["-1e-5", "nan", "inf"],
    "zeta": ["-1", "inf"],
    "clip_r": ["0", "-1", "nan"],
    "warmup_epochs": ["-1", "nan"],
    "warmup_steps": ["-1"],
    "embedding_init_stddev": ["-0.01", "inf"],
    "loss_scale": ["0", "-3", "nan", "inf", "big"],
    "loss_scale_growth_steps": ["0"],
    "epochs": ["0"],
    "checkpoint_every_steps": ["-1"],
    "log_every_steps": ["0"],
    "stop_after_steps": ["0"],
    "retain_freed_memory_mib": ["-1", "2048"],
    "days": ["0"],
    "rows_per_day": ["0"],
    "drift_half_life_days": ["0", "nan", "inf"],
}


@pytest.fixture(scope="module", autouse=True)
def finite_floats():
    refuse_non_finite_floats()  # what launch.user_errors.absl_main registers at start-up


def _launcher_numeric_flags():
    return {flag.name for module, defined in FLAGS.flags_by_module_dict().items()
            if module.startswith("launch.") for flag in defined
            if flag.flag_type() in ("int", "float")}


def test_every_numeric_flag_has_bad_values_listed():
    assert _launcher_numeric_flags() - set(BAD_VALUES) == set()


@pytest.mark.parametrize("flag, value", [(flag, value) for flag, values in BAD_VALUES.items()
                                         for value in values])
def test_an_out_of_range_value_is_refused_when_parsed(flag, value):
    try:
        with pytest.raises(flags.IllegalFlagValueError) as refusal:
            FLAGS(["launch.train", f"--{flag}={value}"])
    finally:
        FLAGS.unparse_flags()
    message = str(refusal.value)
    assert f"--{flag}=" in message, message
    allowed = ("range", "above", "finite", "positive", "negative", "int()", "number")
    assert any(word in message for word in allowed), message  # says what is allowed


def test_good_values_parse():
    try:
        FLAGS(["launch.train", "--clip_r=0.5", "--l2=1e-5", "--learning_rate=1e-3",
               "--loss_scale=1024", "--seed=4294967295", "--density=1"])
        assert FLAGS.clip_r == 0.5 and FLAGS.loss_scale == "1024"
    finally:
        FLAGS.unparse_flags()
