"""The user-error boundary of every entry point: bad input (a UserError, or a data error raised
inside the TF graph) becomes one paragraph on stderr and exit status 2 instead of a traceback."""

import sys


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
    print(f"error: {error}", file=sys.stderr, flush=True)
    return 2
