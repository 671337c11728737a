"""The user-error boundary of every entry point: bad input (a UserError, or a data error raised
inside the TF graph) becomes one paragraph on stderr and exit status 2 instead of a traceback,
with the library's argument names (written `argument=value`) turned into the flags that set
them."""

import ast
import math
import re
import sys

from absl import app, flags

# Library argument -> the launcher flag that sets it.
ARGUMENT_FLAGS = {
    "batch_size": "batch_size",
    "capacity": "dynamic_capacity",
    "checkpoint_dir": "checkpoint_dir",
    "columns": "parquet_columns",
    "deduplicate": "dedup_ids",
    "dense_transform": "integer_transform",
    "embedding_exchange": "embedding_comm",
    "embedding_staleness": "embedding_staleness",
    "embedding_update": "embedding_update",
    "epochs": "epochs",
    "expire_after_steps": "dynamic_expire_after_steps",
    "l2": "l2",
    "logdir": "logdir",
    "min_count": "dynamic_min_count",
    "r": "clip_r",
    "table_l2": "l2",
    "test_fraction": "test_fraction",
    "test_paths": "test_path",
    "zeta": "zeta",
    "gradient_compression": "gradient_compression",
    "hash_buckets": "hash_buckets",
    "on_bad_line": "on_bad_line",
    "on_short_line": "on_short_line",
    "profile_steps": "profile_steps",
    "resume": "resume",
    "sharding": "embedding_sharding",
    "stop_after_steps": "stop_after_steps",
    "table_dtype": "table_dtype",
    "train_progressively": "progressive",
    "vocabulary_cache_dir": "vocabulary_cache_dir",
}


def in_flag_terms(message):
    """`message` with every `argument=value` or `argument` of ARGUMENT_FLAGS written as its flag
    (`--flag=value`, or `--flag` alone for a value of True; a dict value as the KEY=VALUE pairs
    the list flags take)."""

    def as_flag(match):
        flag = ARGUMENT_FLAGS.get(match.group(1))
        if flag is None:
            return match.group(0)
        value = match.group(2)
        if value is None or value == "True":
            return f"--{flag}"
        if value.startswith("{"):
            pairs = ast.literal_eval(value)
            return f"--{flag}={','.join(f'{key}={item}' for key, item in pairs.items())}"
        return f"--{flag}={value.strip(chr(39) + chr(34))}"

    return re.sub(r"`(\w+)(?:=([^`]*))?`", as_flag, message)


def run_reporting_user_errors(run):
    """Calls `run()` and returns the process exit status: 0, or 2 after printing a user error."""
    import tensorflow as tf

    from tfscale.errors import UserError, user_error_from_tf

    try:
        run()
    except UserError as error:
        return _print_user_error(error)
    except tf.errors.InvalidArgumentError as error:
        user_error = user_error_from_tf(error)
        if user_error is None:
            raise
        return _print_user_error(user_error)
    return 0


def _print_user_error(error):
    print(f"error: {in_flag_terms(str(error))}", file=sys.stderr, flush=True)
    return 2


def refuse_non_finite_floats():
    """Registers, for every float flag defined so far, that nan and inf are refused when the
    flags are parsed (absl's bounds let nan through)."""
    for name in flags.FLAGS:
        flag = flags.FLAGS[name]
        if flag.name == name and flag.flag_type() == "float":
            flags.register_validator(name, lambda value: value is None or math.isfinite(value),
                                     message=f"--{name} must be a finite number")


def absl_main(run):
    """The `main(argv)` for `absl.app.run` of an entry point whose work is `run()`: no
    positional arguments, the process's exit status from run_reporting_user_errors. Float flags
    must be finite."""
    refuse_non_finite_floats()

    def main(argv):
        if len(argv) > 1:
            raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
        sys.exit(run_reporting_user_errors(run))

    return main
