"""The ranks of one `python -m tfscale.run` job while they run: each started in a process group
of its own, its output relayed line by line with horovodrun's prefixes (`[<rank>]<stdout>:`,
`[<rank>]<stderr>:`), its exit watched. The first rank to fail, or SIGINT/SIGTERM/SIGHUP to the
launcher, stops the others: SIGTERM to their process groups, SIGKILL after STOP_GRACE_SECONDS."""

import os
import selectors
import signal
import subprocess
import sys
import threading
import time

# How long the ranks being stopped have between SIGTERM and SIGKILL.
STOP_GRACE_SECONDS = 10
# How long the relay waits for the last lines of an ended rank (a process it started in
# another session may hold its pipes open).
DRAIN_SECONDS = 2
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def run(command, environments):
    """Runs `command` once per rank, rank i with `environments[i]`, until all exit or one fails.

    Args:
        command: the argv of every rank.
        environments: one environment per rank.

    Returns:
        The launcher's exit status: 0 when every rank exits 0; else the status of the first rank
        that failed (128 + the signal for one killed by a signal), or 128 + the signal that
        stopped the launcher.
    """
    relay = _Relay()
    received = []
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    previous_wakeup = signal.set_wakeup_fd(wake_write, warn_on_full_buffer=False)
    previous = {number: signal.signal(number, lambda number, _: received.append(number))
                for number in STOP_SIGNALS}
    ranks, selector = [], selectors.DefaultSelector()
    try:
        selector.register(wake_read, selectors.EVENT_READ)
        for rank, environment in enumerate(environments):
            if received:
                break
            process = subprocess.Popen(command, env=environment, stdin=subprocess.DEVNULL,
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                       start_new_session=True)
            ranks.append(process)
            relay.follow(rank, process)
            selector.register(os.pidfd_open(process.pid), selectors.EVENT_READ, rank)
        return _watch(ranks, selector, received, relay)
    finally:
        _stop([process for process in ranks if process.poll() is None])
        for key in list(selector.get_map().values()):
            os.close(key.fd)
        selector.close()
        signal.set_wakeup_fd(previous_wakeup)
        os.close(wake_write)
        for number, handler in previous.items():
            signal.signal(number, handler)
        relay.drain()


def exit_status(returncode):
    """A process's exit status as a shell gives it: 128 + the signal for one killed by a signal.

    Args:
        returncode: a Popen returncode (negative: killed by that signal).
    """
    return 128 - returncode if returncode < 0 else returncode


def describe(returncode):
    """"status 3", or "status -9 (SIGKILL)" for a process killed by a signal."""
    if returncode >= 0:
        return f"status {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    return f"status {returncode} ({name})"


def _watch(ranks, selector, received, relay):
    """Waits until every rank has exited 0 (returns 0), one fails or the launcher is signalled
    (stops the others and returns the status)."""
    running = set(range(len(ranks)))
    while running and not received:
        for key, _ in selector.select():
            if key.data is None:
                os.read(key.fd, 512)
                continue
            rank = key.data
            selector.unregister(key.fd)
            os.close(key.fd)
            running.discard(rank)
            returncode = ranks[rank].wait()
            if returncode != 0:
                relay.drain(rank)  # its last lines (a traceback) before the verdict
                others = [ranks[r] for r in sorted(running)]
                relay.say(f"tfscale.run: rank {rank} exited with {describe(returncode)}"
                          + (f"; stopping the other {len(others)} process(es)" if others else ""))
                _stop(others)
                return exit_status(returncode)
    if received:
        others = [process for process in ranks if process.poll() is None]
        relay.say(f"tfscale.run: received {signal.Signals(received[0]).name}; stopping "
                  f"{len(others)} process(es)")
        _stop(others)
        return 128 + received[0]
    return 0


def _stop(processes):
    """SIGTERM to the process group of each of `processes`, SIGKILL to those still running
    STOP_GRACE_SECONDS later; returns once all have exited."""
    for process in processes:
        _signal_group(process, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_SECONDS
    for process in processes:
        try:
            process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal_group(process, signal.SIGKILL)
            process.wait()


def _signal_group(process, number):
    try:
        os.killpg(process.pid, number)
    except ProcessLookupError:
        pass


class _Relay:
    """Copies the ranks' output to the launcher's, each line whole and prefixed."""

    def __init__(self):
        self._lock = threading.Lock()
        self._threads = {}

    def follow(self, rank, process):
        """Starts copying `process`'s stdout and stderr (pipes) as rank `rank`'s."""
        self._threads[rank] = [
            threading.Thread(target=self._copy, args=(f"[{rank}]<{name}>:".encode(), pipe, out),
                             name=f"rank {rank} {name}", daemon=True)
            for name, pipe, out in (("stdout", process.stdout, sys.stdout),
                                    ("stderr", process.stderr, sys.stderr))]
        for thread in self._threads[rank]:
            thread.start()

    def say(self, line):
        """Writes the launcher's own `line` to its stderr, between whole lines of the ranks."""
        self._write(sys.stderr, (line + "\n").encode())

    def drain(self, rank=None):
        """Waits (DRAIN_SECONDS at most) for the relay of rank `rank`, or of all, to end."""
        deadline = time.monotonic() + DRAIN_SECONDS
        threads = self._threads.get(rank, []) if rank is not None else sum(
            self._threads.values(), [])
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def _copy(self, prefix, pipe, out):
        with pipe:
            for line in iter(pipe.readline, b""):
                self._write(out, prefix + (line if line.endswith(b"\n") else line + b"\n"))

    def _write(self, out, data):
        with self._lock:
            try:
                out.flush()
                out.buffer.write(data)
                out.buffer.flush()
            except (OSError, ValueError):
                pass  # the launcher's output is closed: keep reading, so no rank blocks on it
