"""`python -m launch.train FLAGS` in a process that runs other work before and after it (a job of
tests/multiworker/jobs.py, a case of tests/launcher_matrix.py): the flags parsed afresh, a new
Keras session, TensorFlow's op determinism off unless --deterministic turns it on; the exit
status as the command line's (0, or 2 after a one-paragraph user error on stderr)."""

import launch.train  # noqa: F401  (first: it defines every flag and imports TF quietly)

from absl import flags  # noqa: E402

from launch.user_errors import refuse_non_finite_floats, run_reporting_user_errors  # noqa: E402
from tests.multiworker.jobs import fresh_session  # noqa: E402

FLAGS = flags.FLAGS
refuse_non_finite_floats()  # as launch.train's main does


def start(flags_given):
    """Sets the launcher's flags to `flags_given` alone, in a fresh Keras session with op
    determinism off (until --deterministic turns it on)."""
    FLAGS.unparse_flags()
    FLAGS(["launch.train", *flags_given])
    fresh_session()


def main(*flags_given):
    start(flags_given)
    return run_reporting_user_errors(launch.train.run)
