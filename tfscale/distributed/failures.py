"""A collective that failed because a rank was lost, said as such: which rank, and how to go
on. On TensorFlow's engine a dead peer fails the others' next collective at once (its gRPC
connection closes) and a hung one after the collective timeout; the runtime's error names the
peer's task, which this module turns into its rank. Under horovodrun, horovodrun names the dead
process and ends the job itself."""

import re

from tfscale.distributed import runtime

_TASK = re.compile(r"/job:(chief|worker)/replica:\d+/task:(\d+)")
_COLLECTIVE_FAILED = ("Collective ops is aborted", "Horovod has been shut down")


class RankLost(RuntimeError):
    """A collective failed because another rank of the job died, hung or left.

    Example:
        ```python
        try:
            model.fit(batches, epochs=5)
        except tfscale.distributed.RankLost as lost:
            print(lost)  # "rank 0: the job lost rank 1; ... Resume from the last checkpoint ..."
        ```
    """


def as_rank_lost(error):
    """A RankLost saying which rank the job lost and how to resume, when `error` (raised by a
    step or a collective) is a collective's failure in a job of several ranks; else None.

    Args:
        error: an exception.

    Returns:
        A RankLost, or None.

    Example:
        ```python
        try:
            model.fit(batches, epochs=5)
        except tf.errors.OpError as error:
            raise tfscale.distributed.as_rank_lost(error) or error
        ```
    """
    engine = runtime.engine()
    text = str(error)
    if engine is None or not any(marker in text for marker in _COLLECTIVE_FAILED):
        return None
    lost = sorted({engine.rank_of_task(job, int(index)) for job, index in _TASK.findall(text)}
                  - {engine.rank, None})
    who = (f"lost rank {', '.join(map(str, lost))}" if lost
           else "lost a rank (the launcher's output names it)")
    timed_out = "DeadlineExceeded" in type(error).__name__ or "deadline" in text.lower()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    first_line = next((line for line in lines if any(m in line for m in _COLLECTIVE_FAILED)),
                      lines[0] if lines else type(error).__name__)[:300]
    return RankLost(
        f"rank {engine.rank}: the job {who}"
        + (f" (no answer within {runtime.collective_timeout_seconds():.0f} s)" if timed_out
           else "")
        + f"; its collectives cannot go on ({first_line}). Resume from the last checkpoint "
        "(tfscale.callbacks.Checkpoint, or launch.train --resume), at any number of processes")
