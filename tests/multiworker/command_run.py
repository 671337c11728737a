"""`python -m MODULE FLAGS` for a launcher module (launch.train, launch.predict, launch.export)
as a job of tests/multiworker/jobs.py: `main(module, *flags)` does what the module's `__main__`
does (absl's app.run of its `run` through absl_main, the flags parsed afresh), so exit statuses
and error paragraphs are the command line's. The launchers define flags of the same names, so
one process runs jobs of one module only."""

import importlib

from absl import app, flags

from launch.user_errors import absl_main
from tests.multiworker.jobs import fresh_session


def main(module, *flags_given):
    launcher = importlib.import_module(module)
    flags.FLAGS.unparse_flags()
    fresh_session()
    app.run(absl_main(launcher.run), argv=[module, *flags_given])
