"""`python -m launch.train FLAGS` in a process that runs other work before and after it.

`main(*flags)`, a job of tests/multiworker/jobs.py, does what launch.train's `__main__` does
(absl's app.run of launch.train.run through absl_main, which re-parses the flags on every run),
so bad flags, user errors and their exit statuses are the command line's: the status comes as
the SystemExit app.run ends with. `start(flags)` only sets the flags, for tests/launcher_matrix.py,
which calls launch.train.run itself. Either way the run starts in a fresh Keras session with op
determinism off (until --deterministic turns it on)."""

import launch.train  # noqa: F401  (first: it defines every flag and imports TF quietly)

from absl import flags  # noqa: E402

from tests.multiworker import command_run  # noqa: E402
from tests.multiworker.jobs import fresh_session  # noqa: E402

FLAGS = flags.FLAGS


def start(flags_given):
    """Sets the launcher's flags to `flags_given` alone, in a fresh session."""
    FLAGS.unparse_flags()
    FLAGS(["launch.train", *flags_given])
    fresh_session()


def main(*flags_given):
    command_run.main("launch.train", *flags_given)
