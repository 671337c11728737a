"""Which engine a process starts, checked in one process: from horovodrun's variables, from
TF_CONFIG, forced by TFSCALE_ENGINE, none in one process; TF_CONFIG read into ranks, local ranks
and ports, and every malformed TF_CONFIG, a bad TFSCALE_ENGINE, a bad timeout, a taken port and
a missing Horovod refused with a message naming what to fix."""

import json
import socket
import sys

import pytest

from tfscale.distributed import horovod_engine, runtime, tf_cluster, tf_engine
from tfscale.errors import UserError


def tf_config(workers, index=0, chief=(), job="worker"):
    cluster = {"worker": list(workers)}
    if chief:
        cluster["chief"] = list(chief)
    return json.dumps({"cluster": cluster, "task": {"type": job, "index": index}})


@pytest.fixture
def environment(monkeypatch):
    """os.environ without any launcher's variables; returns monkeypatch.setenv."""
    for name in ("HOROVOD_RANK", "HOROVOD_SIZE", "TF_CONFIG", "TFSCALE_ENGINE",
                 "TFSCALE_COLLECTIVE_TIMEOUT_SECONDS"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch.setenv


def test_the_launcher_picks_the_engine(environment):
    assert runtime.launched_engine() is None and runtime.announced_size() == 1
    environment("TF_CONFIG", tf_config(["a:1", "b:2", "c:3"], index=2))
    assert runtime.launched_engine() == "tf" and runtime.announced_size() == 3
    environment("HOROVOD_RANK", "0")
    environment("HOROVOD_SIZE", "4")
    assert runtime.launched_engine() == "horovod" and runtime.announced_size() == 4
    environment("TFSCALE_ENGINE", "tf")
    assert runtime.launched_engine() == "tf" and runtime.announced_size() == 3
    environment("TFSCALE_ENGINE", "mpi")
    with pytest.raises(UserError, match=r"TFSCALE_ENGINE='mpi': give one of horovod, tf"):
        runtime.launched_engine()


def test_tf_config_gives_rank_local_rank_and_port():
    cluster = tf_cluster.read_cluster(tf_config(["h1:10", "h2:11", "h1:12"], index=1,
                                                chief=["h2:9"]))
    # ranks: chief h2:9, workers h1:10, h2:11, h1:12; this task is worker 1 (h2:11)
    assert (cluster.rank, cluster.size, cluster.port) == (2, 4, 11)
    assert (cluster.local_rank, cluster.local_size) == (1, 2)
    assert cluster.device_prefix(0) == "/job:chief/replica:0/task:0"
    assert cluster.rank_of("worker", 2) == 3 and cluster.rank_of("worker", 7) is None
    assert tf_cluster.on_loopback(tf_cluster.read_cluster(tf_config(["localhost:1",
                                                                     "127.0.0.1:2"])))


@pytest.mark.parametrize("text, message", [
    ("{not json", "TF_CONFIG is not JSON"),
    (json.dumps({"cluster": {"worker": ["a:1"]}}), 'needs a "cluster" object and a "task"'),
    (json.dumps({"cluster": {"worker": ["a:1"], "ps": ["b:2"]},
                 "task": {"type": "worker", "index": 0}}), r"job\(s\) \['ps'\]"),
    (tf_config(["a:1", "b"]), 'must be a list of "host:port"'),
    (tf_config(["a:1", "a:1"]), r"lists \['a:1'\] more than once"),
    (tf_config(["a:1", "b:2"], index=2), "is not in its cluster"),
    (tf_config(["a:1"], job="evaluator"), "is not in its cluster"),
    (json.dumps({"cluster": {}, "task": {"type": "worker", "index": 0}}), "lists no"),
])
def test_a_malformed_tf_config_is_refused(text, message):
    with pytest.raises(UserError, match=message):
        tf_cluster.read_cluster(text)


def test_a_malformed_tf_config_is_refused_at_init_before_anything_starts(environment):
    environment("TF_CONFIG", '{"cluster": ')
    with pytest.raises(UserError, match="TF_CONFIG is not JSON"):
        runtime.init()
    assert runtime.engine() is None


@pytest.mark.parametrize("value", ["0", "-3", "soon"])
def test_a_bad_collective_timeout_is_refused(environment, value):
    environment("TFSCALE_COLLECTIVE_TIMEOUT_SECONDS", value)
    with pytest.raises(UserError, match="TFSCALE_COLLECTIVE_TIMEOUT_SECONDS"):
        runtime.collective_timeout_seconds()


def test_a_taken_port_is_refused_naming_it():
    holder = socket.socket()
    holder.bind(("", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        with pytest.raises(UserError, match=f"port {port}, which another process holds"):
            tf_engine._check_port_free(port)
    finally:
        holder.close()


def test_horovod_missing_is_said_in_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "horovod", None)  # as if never installed
    monkeypatch.delitem(sys.modules, "horovod.tensorflow", raising=False)
    with pytest.raises(ImportError) as raised:
        horovod_engine.HorovodEngine(timeout_seconds=30)
    message = str(raised.value)
    assert "Horovod does not import" in message and "python -m tfscale.run" in message
    assert "\n" not in message
