"""`python -m tfscale.run` (installed as `tfscale-run`): starts N processes of one program on this
host as the ranks of a job on TensorFlow's collective engine, like horovodrun and torchrun.

This module owns the command line: the arguments and their refusals, the ports, the environment
of each rank (TF_CONFIG, TFSCALE_ENGINE=tf, no HOROVOD_* variables) and where the ranks run: in
a private network namespace (tfscale.run_namespace, entered by a process forked for it, as the
launcher has threads once TensorFlow is imported) or on the host's network. The ranks while
they run: tfscale.run_ranks. The user guide: docs/launching.md.

Example:
    ```
    python -m tfscale.run -np 2 train.py --epochs=3
    python -m tfscale.run -np 4 -m launch.train --batch_size=65536
    ```
"""

import argparse
import ctypes
import importlib.util
import json
import os
import signal
import socket
import sys
import traceback

from tfscale import run_namespace, run_ranks
from tfscale.errors import UserError

PROG = "tfscale.run"
NETWORKS = ("private", "host")
_PR_SET_PDEATHSIG = 1
# The launcher's options that take a value (as the next argument, or after "=").
_VALUED = ("-np", "--num-proc", "--port", "--network")


class _Parser(argparse.ArgumentParser):
    """argparse, with its refusals on one line: `tfscale.run: error: ...`, exit status 2."""

    def error(self, message):
        _refuse(message)


def _refuse(message):
    sys.stderr.write(f"{PROG}: error: {message}\n")
    sys.stderr.flush()
    sys.exit(2)


def _parser():
    parser = _Parser(
        prog="python -m tfscale.run", allow_abbrev=False,
        usage="python -m tfscale.run [-h] -np N [--port BASE] [--network {private,host}] "
              "(SCRIPT | -m MODULE) [ARGS ...]",
        description="Runs N processes of a Python program on this host as the ranks of one job "
                    "on TensorFlow's collective engine (each gets TF_CONFIG and "
                    "TFSCALE_ENGINE=tf). Their output comes back prefixed [<rank>]<stdout>: and "
                    "[<rank>]<stderr>:; the first rank to fail stops the others.",
        epilog="Arguments after SCRIPT (or -m MODULE) go to the program untouched. "
               "Guide: docs/launching.md.")
    parser.add_argument("-np", "--num-proc", dest="num_proc", type=int, required=True,
                        metavar="N", help="the number of processes (ranks) to start")
    parser.add_argument("-m", "--module", action="store_true",
                        help="the program is a MODULE, run as `python -m MODULE`")
    parser.add_argument("--port", type=int, metavar="BASE",
                        help="rank i's server listens on port BASE+i (default: free ports "
                             "picked at start); with --network=host each must be free")
    parser.add_argument("--network", choices=NETWORKS, default="private",
                        help="private (default): the ranks run in a network namespace of their "
                             "own with only loopback, so their servers cannot be reached from "
                             "outside and they reach nothing beyond this host's loopback; host: "
                             "on the host's network, where their servers listen on every "
                             "interface")
    parser.add_argument("program", nargs="?", metavar="SCRIPT | MODULE",
                        help="the Python script (or, with -m, module) each rank runs, followed "
                             "by its arguments")
    return parser


def main(argv=None):
    """Launches the job `argv` (default: sys.argv[1:]) describes and exits with its status."""
    launcher, program = _split(sys.argv[1:] if argv is None else list(argv))
    options = _parser().parse_args(launcher + ["--"] + program[:1])
    options.arguments = program[1:]
    try:
        command = _checked(options)
    except UserError as error:
        _refuse(str(error))
    if options.network == "host":
        sys.exit(_launch(options, command))
    sys.exit(_in_private_network(lambda: _launch(options, command)))


def _split(argv):
    """(the launcher's arguments, [PROGRAM, ARGS...]): the program starts at the first argument
    that is neither an option of the launcher nor an option's value (or right after `--`), and
    its arguments are kept as given."""
    for index, argument in enumerate(argv):
        if argument == "--":
            return argv[:index], argv[index + 1:]
        if not argument.startswith("-") or argument == "-":
            if index and argv[index - 1] in _VALUED:
                continue
            return argv[:index], argv[index:]
    return argv, []


def _checked(options):
    """The argv of every rank, once `options` are found sound.

    Raises:
        UserError: no program, a script that does not exist, a module that cannot be found, a
            number of processes or ports out of range.
    """
    if options.num_proc < 1:
        raise UserError(f"-np {options.num_proc}: give 1 or more processes")
    if options.port is not None and not 0 < options.port <= 65536 - options.num_proc:
        raise UserError(f"port {options.port}: ports {options.port}.."
                        f"{options.port + options.num_proc - 1} must lie in 1..65535")
    if not options.program:
        raise UserError("no program given: name a SCRIPT, or -m MODULE, after the options")
    if options.module:
        _find_module(options.program)
        return [sys.executable, "-m", options.program, *options.arguments]
    if not os.path.exists(options.program):
        raise UserError(f"script {options.program!r} does not exist (in {os.getcwd()})")
    return [sys.executable, options.program, *options.arguments]


def _find_module(name):
    """Raises a UserError unless module `name` can be found as `python -m` would find it (the
    working directory first on the path); imports its parent packages only."""
    sys.path.insert(0, os.getcwd())
    try:
        spec = importlib.util.find_spec(name)
    except Exception as error:  # a parent package missing or failing on import
        raise UserError(f"module {name!r} cannot be found: {type(error).__name__}: "
                        f"{error}") from None
    finally:
        sys.path.pop(0)
    if spec is None:
        raise UserError(f"module {name!r} cannot be found (from {os.getcwd()} and the Python "
                        "path)")


def _launch(options, command):
    """Picks the ports, then runs the ranks (tfscale.run_ranks); returns the exit status."""
    try:
        ports = _free_ports(options.num_proc) if options.port is None else _checked_ports(
            range(options.port, options.port + options.num_proc))
    except UserError as error:
        _refuse(str(error))
    if options.network == "host":
        sys.stderr.write(f"{PROG}: warning: --network=host: {_ports_text(ports)} listen on every "
                         "interface of this host, and TensorFlow's servers run what any client "
                         "connecting to them sends; use it on a trusted network only\n")
        sys.stderr.flush()
    return run_ranks.run(command, [_rank_environment(ports, rank)
                                   for rank in range(options.num_proc)])


def _rank_environment(ports, rank):
    """The launcher's environment without HOROVOD_* variables, with TFSCALE_ENGINE=tf and a
    TF_CONFIG naming every rank's `localhost:port` (in rank order) and `rank`'s index."""
    cluster = {"cluster": {"worker": [f"localhost:{port}" for port in ports]},
               "task": {"type": "worker", "index": rank}}
    environment = {key: value for key, value in os.environ.items()
                   if not key.startswith("HOROVOD_")}
    environment.update(TF_CONFIG=json.dumps(cluster), TFSCALE_ENGINE="tf")
    return environment


def _free_ports(count):
    """`count` distinct ports free on every interface: each bound to port 0, read back, then
    released together (a rank's server binds it a moment later)."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for probe in sockets:
            probe.bind(("", 0))
        return [probe.getsockname()[1] for probe in sockets]
    finally:
        for probe in sockets:
            probe.close()


def _checked_ports(ports):
    """`ports` as a list, once each is found free on every interface.

    Raises:
        UserError: one of them is taken (or not allowed to this user).
    """
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind(("", port))
            except OSError as error:
                raise UserError(f"port {port} cannot be used: {error.strerror}") from None
    return list(ports)


def _ports_text(ports):
    if ports == list(range(ports[0], ports[0] + len(ports))) and len(ports) > 1:
        return f"ports {ports[0]}..{ports[-1]}"
    return ("port " if len(ports) == 1 else "ports ") + ", ".join(map(str, ports))


def _in_private_network(launch):
    """Runs `launch()` in a process forked into a private network namespace
    (tfscale.run_namespace); this process forwards SIGINT/SIGTERM/SIGHUP to it and returns its
    exit status. The forked process gets SIGTERM if this one dies."""
    sys.stdout.flush()
    sys.stderr.flush()
    parent = os.getpid()
    child = os.fork()
    if child == 0:
        status = 1
        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
            if os.getppid() != parent:  # the launcher died before the line above
                os._exit(128 + signal.SIGTERM)
            run_namespace.enter_private_network()
            status = launch()
        except run_namespace.NamespaceUnavailable as error:
            sys.stderr.write(f"{PROG}: error: {error}; or give --network=host to run the ranks "
                             "on the host's network, where their ports listen on every "
                             "interface\n")
            status = 2
        except SystemExit as exit_:
            status = exit_.code if isinstance(exit_.code, int) else 1
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(status)

    def forward(number, _):
        try:
            os.kill(child, number)
        except ProcessLookupError:
            pass

    for number in run_ranks.STOP_SIGNALS:
        signal.signal(number, forward)
    _, wait_status = os.waitpid(child, 0)
    return run_ranks.exit_status(os.waitstatus_to_exitcode(wait_status))


if __name__ == "__main__":
    main()
