"""User-facing errors: one exception type for bad input, and the bridge from data errors raised
inside a tf.data graph (which reach Python as tf.errors.InvalidArgumentError) back to it."""

import re

# Data-pipeline checks raise InvalidArgumentError with this marker in front of the message, so the
# launcher can tell a bad input file from a bug and print the message without a traceback.
DATA_ERROR_MARKER = "[tfscale data error] "


class UserError(ValueError):
    """Bad input from the user (a file, a line in it, or a flag); the message says which and what
    to do. A ValueError, so a caller catching bad values catches it too. The launcher prints it
    as one paragraph and exits non-zero.

    Example:
        ```python
        try:
            model.compile(optimizer=RowSparseAdam(1e-3), loss="binary_crossentropy",
                          embedding_exchange="gtopk", embedding_staleness=1)
        except tfscale.UserError as error:
            print(error)  # `embedding_staleness=1` cannot be used with ...
        ```
    """


class NonFiniteTraining(UserError):
    """Training stopped producing finite numbers (inf/NaN loss or gradients) beyond what the loss
    scaler can absorb; the message says at which step and what was seen."""


def user_error_from_tf(error):
    """The UserError carried by a TF error raised by a data check, or None for any other error."""
    message = str(getattr(error, "message", error))
    match = re.search(re.escape(DATA_ERROR_MARKER) + r"(.*)", message, re.DOTALL)
    if match is None:
        return None
    # TF appends graph context ("\n\t [[{{node ...}}]]") after the message: keep the first line.
    return UserError(match.group(1).strip().splitlines()[0].strip())
