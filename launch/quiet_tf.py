"""Quiet start-up for the entry points: TensorFlow's C++ log lines (oneDNN, cudart_stub, the
`E0000 ... failed call to cuInit` error on a machine without a GPU, absl's early-log notice) are
hidden unless the command line has --verbose_tf.

TensorFlow reads TF_CPP_MIN_LOG_LEVEL once, when it is first imported, before absl has parsed
any flag; so this module must be imported before anything that imports TensorFlow, and it reads
the flag from sys.argv itself (`--verbose_tf` is also defined here, so absl accepts it). A
TF_CPP_MIN_LOG_LEVEL set in the environment is left alone. The level does not reach the lines
TensorFlow's libraries log while they load (written before absl::InitializeLog, whatever the
level), so TensorFlow is imported here with stderr captured, and the captured text is written
back without those informational lines; anything else (an error, a Python warning) still shows.

Importing TensorFlow imports Keras whole, and Keras imports scikit-learn, pandas and matplotlib
when they are installed (and TensorFlow's old Keras, SciPy) for what the entry points never use:
its scikit-learn wrappers, DataFrames given to `fit`, its plotting functions, sparse matrices.
They are held back while TensorFlow is imported (about 1.4 s of CPU a process: 4 ranks on 2
cores wait about 3 s for them); importing one afterwards works as usual, only Keras's own
support for it stays off in this process.
"""

import contextlib
import os
import re
import sys
import tempfile

from absl import flags

flags.DEFINE_bool("verbose_tf", False,
                  "Show TensorFlow's C++ start-up log lines (hidden by default).")


def _wants_verbose(argv):
    verbose = False
    for arg in argv[1:]:
        if arg == "--":
            break
        if arg in ("--verbose_tf", "--verbose_tf=true", "--verbose_tf=True", "--verbose_tf=1"):
            verbose = True
        elif arg in ("--noverbose_tf", "--verbose_tf=false", "--verbose_tf=False",
                     "--verbose_tf=0"):
            verbose = False
    return verbose


# An info or warning line of absl's C++ logging ("I0000 00:00:1795... port.cc:153] ..."), its
# notice about logging before InitializeLog, and cpu_feature_guard's continuation line.
_LOAD_CHATTER = re.compile(
    r"^(?:[IW]\d{4} \d\d:\d\d:[\d.]+ +\d+ [\w.]+:\d+\] .*"
    r"|WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    r"|To enable the following instructions: .* in other operations, rebuild TensorFlow with the "
    r"appropriate compiler flags\.)$")


def without_load_chatter(text):
    """`text` without the lines _LOAD_CHATTER matches."""
    return "".join(line for line in text.splitlines(keepends=True)
                   if not _LOAD_CHATTER.match(line.rstrip("\r\n")))


# Packages Keras (and TensorFlow's old Keras) import when installed, none of them needed here.
HELD_BACK = ("sklearn", "pandas", "matplotlib", "scipy")


@contextlib.contextmanager
def held_back(names=HELD_BACK):
    """Within it, importing any of the packages `names` not yet imported fails with ImportError
    (which Keras takes as "not installed"); after it they import as usual."""
    held = [name for name in names if name not in sys.modules]
    for name in held:
        sys.modules[name] = None
    try:
        yield
    finally:
        for name in held:
            if name in sys.modules and sys.modules[name] is None:
                del sys.modules[name]


def _import_tensorflow_quietly():
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as captured:
        os.dup2(captured.fileno(), 2)
        try:
            with held_back():
                import tensorflow  # noqa: F401
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            rest = without_load_chatter(captured.read().decode("utf-8", "replace"))
            if rest:
                sys.stderr.write(rest)
                sys.stderr.flush()


if _wants_verbose(sys.argv):
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "0"
    if "tensorflow" not in sys.modules:
        with held_back():
            import tensorflow  # noqa: F401
else:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    if "tensorflow" not in sys.modules:
        _import_tensorflow_quietly()
