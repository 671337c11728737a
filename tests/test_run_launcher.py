"""`python -m tfscale.run`: the ranks' environment (TF_CONFIG, distinct ports, no HOROVOD_*),
horovodrun's output prefixes with whole lines, exit statuses and the stopping of the other ranks
(their process groups, SIGKILL after the grace), signals to the launcher, the refusals (exit 2,
no rank started), the private network (a rank's port unreachable from this process) and
`--network=host`. The programs are small scripts that import no TensorFlow, except one job that
runs TensorFlow's engine for real.

Each launcher imports tfscale (and so TensorFlow) before it starts anything: the launches wait
in minutes, not seconds. The refusals run in this process, with starting a rank or a private
network made to fail the test."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

LAUNCHER = [sys.executable, "-m", "tfscale.run"]
# A launch's bound: the launcher's and the ranks' start-up, then at most a few seconds of work.
TIMEOUT = 240


def write(path, text):
    path.write_text(textwrap.dedent(text))
    return path


def launch(arguments, cwd, **kwargs):
    return subprocess.run(LAUNCHER + arguments, cwd=cwd, capture_output=True, text=True,
                          timeout=TIMEOUT, **kwargs)


def relayed(text, stream):
    """{rank: [line, ...]} of the launcher's `stream` output ("stdout" or "stderr"), the
    prefix `[<rank>]<stream>:` taken off; the lines without a prefix under None."""
    lines = {}
    for line in text.splitlines():
        match = re.fullmatch(rf"\[(\d+)\]<{stream}>:(.*)", line)
        rank, content = (int(match.group(1)), match.group(2)) if match else (None, line)
        lines.setdefault(rank, []).append(content)
    return lines


def launcher_lines(stderr):
    return [line for line in stderr.splitlines() if line.startswith("tfscale.run:")]


def gone(pid, within=10.0):
    """Whether process `pid` has ended (or is a zombie) within `within` seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                if stat.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.1)
    return False


def wait_for(path, within=TIMEOUT):
    deadline = time.monotonic() + within
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.1)


def test_each_rank_gets_its_tf_config_and_its_lines_come_back_whole_and_prefixed(tmp_path):
    script = write(tmp_path / "job.py", """\
        import json, os, sys
        config = json.loads(os.environ["TF_CONFIG"])
        rank = config["task"]["index"]
        print(json.dumps({"config": config, "argv": sys.argv[1:], "cwd": os.getcwd(),
                          "engine": os.environ.get("TFSCALE_ENGINE"),
                          "horovod": sorted(k for k in os.environ if k.startswith("HOROVOD_")),
                          "kept": os.environ.get("KEPT")}), flush=True)
        for _ in range(300):  # long lines from every rank at once: none may be cut
            sys.stdout.write(str(rank) * 5000 + "\\n")
        sys.stdout.flush()
        sys.stderr.write(f"no newline from {rank}")
        """)
    environment = dict(os.environ, HOROVOD_RANK="7", HOROVOD_SIZE="9", KEPT="yes")
    result = launch(["-np", "3", script.name, "-np", "5", "--", "-m", "x y"], tmp_path,
                    env=environment)
    assert result.returncode == 0, result.stderr[-3000:]
    out = relayed(result.stdout, "stdout")
    assert None not in out and sorted(out) == [0, 1, 2]
    reports = {rank: json.loads(lines[0]) for rank, lines in out.items()}
    workers = reports[0]["config"]["cluster"]["worker"]
    assert len(workers) == 3 and all(re.fullmatch(r"localhost:\d+", w) for w in workers)
    assert len(set(workers)) == 3
    for rank, report in reports.items():
        assert report["config"] == {"cluster": {"worker": workers},
                                    "task": {"type": "worker", "index": rank}}
        assert report["argv"] == ["-np", "5", "--", "-m", "x y"]
        assert report["cwd"] == str(tmp_path)
        assert report["engine"] == "tf" and report["horovod"] == [] and report["kept"] == "yes"
        assert out[rank][1:] == [str(rank) * 5000] * 300
    err = relayed(result.stderr, "stderr")
    for rank in range(3):
        assert f"no newline from {rank}" in err[rank]


def test_a_failing_rank_stops_the_others_and_their_subprocesses_and_gives_its_status(tmp_path):
    script = write(tmp_path / "job.py", """\
        import json, os, pathlib, subprocess, sys, time
        rank = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
        if rank == 0:
            child = subprocess.Popen(["sleep", "600"])
            print("child", child.pid, flush=True)
            pathlib.Path("started").touch()
            time.sleep(600)
        while not pathlib.Path("started").exists():
            time.sleep(0.05)
        print("failing", flush=True)
        sys.exit(3)
        """)
    start = time.monotonic()
    result = launch(["-np", "2", script.name], tmp_path)
    assert result.returncode == 3, result.stderr[-3000:]
    assert time.monotonic() - start < 120  # not the 600 s of rank 0's sleep
    assert launcher_lines(result.stderr) == [
        "tfscale.run: rank 1 exited with status 3; stopping the other 1 process(es)"]
    out = relayed(result.stdout, "stdout")
    assert out[1] == ["failing"]
    assert gone(int(out[0][0].split()[1]))  # rank 0's own subprocess, in its process group


def test_a_rank_killed_by_a_signal_gives_128_plus_it_and_a_rank_ignoring_sigterm_is_killed(
        tmp_path):
    from tfscale import run_ranks

    script = write(tmp_path / "job.py", """\
        import json, os, pathlib, signal, time
        rank = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
        if rank == 0:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            pathlib.Path("ignoring").touch()
            time.sleep(600)
        while not pathlib.Path("ignoring").exists():
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGKILL)
        """)
    process = subprocess.Popen(LAUNCHER + ["-np", "2", script.name], cwd=tmp_path,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(tmp_path / "ignoring")
    start = time.monotonic()
    stdout, stderr = process.communicate(timeout=TIMEOUT)
    assert process.returncode == 128 + signal.SIGKILL, stderr[-3000:]
    assert launcher_lines(stderr) == ["tfscale.run: rank 1 exited with status -9 (SIGKILL); "
                                      "stopping the other 1 process(es)"]
    # Rank 1 dies at once; rank 0 ignores SIGTERM and is killed after the grace.
    assert run_ranks.STOP_GRACE_SECONDS - 1 < time.monotonic() - start < 60


def test_sigterm_to_the_launcher_stops_every_rank(tmp_path):
    script = write(tmp_path / "job.py", """\
        import json, os, pathlib, time
        rank = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
        pathlib.Path(f"pid{rank}").write_text(str(os.getpid()))
        time.sleep(600)
        """)
    process = subprocess.Popen(LAUNCHER + ["-np", "2", script.name], cwd=tmp_path,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for rank in range(2):
        wait_for(tmp_path / f"pid{rank}")
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    assert launcher_lines(stderr) == ["tfscale.run: received SIGTERM; stopping 2 process(es)"]
    for rank in range(2):
        assert gone(int((tmp_path / f"pid{rank}").read_text()))


@pytest.fixture
def in_process_launcher(monkeypatch):
    """tfscale.run's `main`, run in this process, where starting a rank or forking the private
    network's process fails the test."""
    from tfscale import run, run_ranks

    def started(*_):
        raise AssertionError("a refused launch started something")

    monkeypatch.setattr(run_ranks, "run", started)
    monkeypatch.setattr(os, "fork", started)
    return run.main


@pytest.fixture
def taken_port():
    with socket.socket() as holder:
        holder.bind(("", 0))
        holder.listen()
        yield holder.getsockname()[1]


@pytest.mark.parametrize("arguments, message", [
    (["-np", "0", "job.py"], "-np 0: give 1 or more processes"),
    (["-np", "-2", "job.py"], "-np -2: give 1 or more processes"),
    (["-np", "2", "missing.py"], "script 'missing.py' does not exist"),
    (["-np", "2", "-m", "no_such_package.job"], "module 'no_such_package.job' cannot be found"),
    (["-np", "2", "-m", "json.no_such_module"], "module 'json.no_such_module' cannot be found"),
    (["-np", "2"], "no program given"),
    (["-np", "2", "--port", "65535", "job.py"], "ports 65535..65536 must lie in 1..65535"),
    (["-np", "2", "--network=host", "--port", "TAKEN", "job.py"], "port TAKEN cannot be used"),
    (["-np", "2", "--network=wide", "job.py"], "argument --network: invalid choice"),
], ids=["np0", "np-negative", "missing-script", "missing-package", "missing-module",
        "no-program", "ports-beyond-65535", "taken-port", "unknown-network"])
def test_bad_input_is_refused_before_anything_starts(in_process_launcher, tmp_path, monkeypatch,
                                                     capsys, taken_port, arguments, message):
    write(tmp_path / "job.py", "print('started')\n")
    monkeypatch.chdir(tmp_path)
    arguments = [a.replace("TAKEN", str(taken_port)) for a in arguments]
    with pytest.raises(SystemExit) as exit_:
        in_process_launcher(arguments)
    assert exit_.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("tfscale.run: error: ") and captured.err.count("\n") == 1
    assert message.replace("TAKEN", str(taken_port)) in captured.err


def test_a_refusal_exits_2_from_the_command_line(tmp_path):
    result = launch(["-np", "2", "missing.py"], tmp_path)
    assert result.returncode == 2 and result.stdout == ""
    assert launcher_lines(result.stderr) == [
        f"tfscale.run: error: script 'missing.py' does not exist (in {tmp_path})"]


LISTENING_RANK = """\
    import json, os, pathlib, socket, sys, time
    config = json.loads(os.environ["TF_CONFIG"])
    rank = config["task"]["index"]
    ports = [int(w.rsplit(":", 1)[1]) for w in config["cluster"]["worker"]]
    server = socket.socket()
    server.bind(("", ports[rank]))  # every interface, as TensorFlow's server does
    server.listen()
    pathlib.Path(f"listening{rank}").touch()
    while not pathlib.Path(f"listening{1 - rank}").exists():
        time.sleep(0.05)
    socket.create_connection(("localhost", ports[1 - rank]), 5).close()  # the peer, on lo
    print(json.dumps({"ports": ports, "interfaces": [n for _, n in socket.if_nameindex()]}),
          flush=True)
    pathlib.Path(f"ready{rank}").touch()
    while not pathlib.Path("done").exists():
        time.sleep(0.05)
    """


def host_addresses():
    """This host's addresses other than loopback (IPv4), as far as its interfaces tell."""
    import fcntl
    import struct

    addresses = []
    for _, name in socket.if_nameindex():
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            try:
                answer = fcntl.ioctl(probe, 0x8915, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue  # no IPv4 address
        address = socket.inet_ntoa(answer[20:24])
        if not address.startswith("127."):
            addresses.append(address)
    return addresses


def run_listening_job(tmp_path, arguments):
    """Starts two listening ranks (LISTENING_RANK), waits until both are ready; returns the
    launcher process, the ranks' report and whether each of their ports accepted a connection
    from this process (on loopback and on each of this host's other addresses)."""
    write(tmp_path / "listen.py", LISTENING_RANK)
    (tmp_path / "pkg").mkdir()
    write(tmp_path / "pkg" / "__init__.py", "")
    write(tmp_path / "pkg" / "listen.py", LISTENING_RANK)
    process = subprocess.Popen(LAUNCHER + ["-np", "2"] + arguments, cwd=tmp_path,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for rank in range(2):
            wait_for(tmp_path / f"ready{rank}")
        reached = {}
        report = None
        for line in process.stdout:
            report = json.loads(line.split(":", 1)[1])
            break
        for port in report["ports"]:
            for address in ["127.0.0.1"] + host_addresses():
                try:
                    socket.create_connection((address, port), 5).close()
                    reached[address, port] = True
                except OSError:
                    reached[address, port] = False
    finally:
        (tmp_path / "done").touch()
    stdout, stderr = process.communicate(timeout=TIMEOUT)
    return process, report, reached, stderr


def test_the_private_network_keeps_the_ranks_ports_out_of_reach(tmp_path):
    process, report, reached, stderr = run_listening_job(tmp_path, ["listen.py"])
    assert process.returncode == 0, stderr[-3000:]
    assert report["interfaces"] == ["lo"]
    assert reached and not any(reached.values()), reached


def test_network_host_runs_a_module_on_the_host_network_and_warns(tmp_path):
    process, report, reached, stderr = run_listening_job(
        tmp_path, ["--network=host", "-m", "pkg.listen"])
    assert process.returncode == 0, stderr[-3000:]
    assert report["interfaces"] == [name for _, name in socket.if_nameindex()]
    assert reached and all(reached.values()), reached
    ports = report["ports"]
    assert launcher_lines(stderr) == [
        f"tfscale.run: warning: --network=host: ports {ports[0]}, {ports[1]} listen on every "
        "interface of this host, and TensorFlow's servers run what any client connecting to "
        "them sends; use it on a trusted network only"]


@pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists("/usr/bin/setpriv"),
                    reason="drops CAP_SYS_ADMIN with setpriv, as root")
def test_without_the_right_to_a_network_namespace_the_launcher_says_why_and_what_to_do(
        tmp_path):
    write(tmp_path / "job.py", "open('started', 'w').close()\n")
    result = subprocess.run(["setpriv", "--bounding-set=-sys_admin", "--inh-caps=-sys_admin"]
                            + LAUNCHER + ["-np", "2", "job.py"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=TIMEOUT)
    assert result.returncode == 2 and result.stdout == ""
    [line] = launcher_lines(result.stderr)
    assert line.startswith("tfscale.run: error: cannot make a private network namespace for "
                           "the ranks (unshare: Operation not permitted): this process lacks "
                           "CAP_SYS_ADMIN")
    assert "--network=host" in line
    assert not (tmp_path / "started").exists()


def test_tensorflows_engine_runs_under_the_launcher_out_of_reach(tmp_path):
    """Two ranks on TensorFlow's collective runtime allreduce; their gRPC servers, listening on
    every interface inside the private network, cannot be reached from this process."""
    script = write(tmp_path / "job.py", """\
        import json, os, pathlib, time
        import tfscale
        tfscale.distributed.init()
        import tensorflow as tf
        e = tfscale.distributed.engine()
        print(e.name, e.rank, e.size, float(e.allreduce(tf.constant(1.0), "sum", "probe")))
        print(json.loads(os.environ["TF_CONFIG"])["cluster"]["worker"][e.rank], flush=True)
        while not pathlib.Path("done").exists():
            time.sleep(0.05)
        """)
    with open(tmp_path / "stderr", "w") as stderr:
        process = subprocess.Popen(LAUNCHER + ["-np", "2", script.name], cwd=tmp_path,
                                   stdout=subprocess.PIPE, stderr=stderr, text=True)
    try:
        out = {}
        for line in process.stdout:  # until both ranks have printed both lines
            rank, content = re.fullmatch(r"\[(\d)\]<stdout>:(.*)", line.rstrip("\n")).groups()
            out.setdefault(int(rank), []).append(content)
            if sum(map(len, out.values())) == 4:
                break
        reached = {}
        for rank in sorted(out):
            port = int(out[rank][1].rsplit(":", 1)[1])
            for address in ["127.0.0.1"] + host_addresses():
                try:
                    socket.create_connection((address, port), 5).close()
                    reached[address, port] = True
                except OSError:
                    reached[address, port] = False
    finally:
        (tmp_path / "done").touch()
    process.communicate(timeout=TIMEOUT)
    assert process.returncode == 0, (tmp_path / "stderr").read_text()[-3000:]
    assert {rank: lines[0] for rank, lines in out.items()} == {0: "tf 0 2 2.0", 1: "tf 1 2 2.0"}
    assert len(reached) == 2 * (1 + len(host_addresses())) and not any(reached.values()), reached
