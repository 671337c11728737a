"""TF_CONFIG read and checked: the cluster of a job on TensorFlow's engine, this process's place
in it (rank, local rank) and the port its server listens on. The rank order is the chief (if
the cluster names one) then the workers in their listed order, as TensorFlow numbers them.

TF_CONFIG is JSON: {"cluster": {"worker": ["host:port", ...]}, "task": {"type": "worker",
"index": i}} (a "chief" job of one task may come first). Kubernetes' TFJob, Vertex AI and
SageMaker set it; `python -m tfscale.run` writes it for the processes it starts."""

import dataclasses
import json
import os

from tfscale.errors import UserError

TRAINING_JOBS = ("chief", "worker")
_LOOPBACK = {"localhost", "127.0.0.1", "::1", "[::1]"}


@dataclasses.dataclass(frozen=True)
class TFCluster:
    """Where this process stands in a TF_CONFIG cluster.

    Attributes:
        spec: {job name: ["host:port", ...]} of the training jobs.
        job: this task's job ("chief" or "worker").
        task_index: this task's index in its job.
        rank: this task's index over all tasks (chief first).
        size: the number of tasks.
        local_rank: this task's index among the tasks on its host.
        local_size: the number of tasks on its host.
        port: the port this task's server listens on.
    """

    spec: dict
    job: str
    task_index: int
    rank: int
    size: int
    local_rank: int
    local_size: int
    port: int

    def device_prefix(self, rank):
        """The device name prefix of task `rank` ("/job:worker/replica:0/task:1")."""
        job, index = _tasks(self.spec)[rank]
        return f"/job:{job}/replica:0/task:{index}"

    def rank_of(self, job, index):
        """The rank of task `index` of `job`, or None when the cluster has no such task."""
        tasks = _tasks(self.spec)
        return tasks.index((job, index)) if (job, index) in tasks else None

    @property
    def addresses(self):
        """["host:port"] of every task, in rank order."""
        return [self.spec[job][index] for job, index in _tasks(self.spec)]


def configured():
    """Whether TF_CONFIG is set (to anything) in this process's environment."""
    return bool(os.environ.get("TF_CONFIG", "").strip())


def announced_size():
    """The number of training tasks TF_CONFIG names (1 when unset or unreadable)."""
    try:
        return read_cluster().size
    except UserError:
        return 1


def read_cluster(text=None):
    """The TFCluster of TF_CONFIG (or of `text`, its JSON).

    Raises:
        UserError: TF_CONFIG is not JSON, lacks "cluster" or "task", names a task that is not in
            the cluster, a job other than chief and worker, or an address without a port.
    """
    text = os.environ.get("TF_CONFIG", "") if text is None else text
    try:
        config = json.loads(text)
    except json.JSONDecodeError as error:
        raise UserError(f"TF_CONFIG is not JSON ({error}): it must look like "
                        '{"cluster": {"worker": ["host:port", ...]}, "task": {"type": "worker", '
                        '"index": 0}}') from None
    if not isinstance(config, dict) or not isinstance(config.get("cluster"), dict) \
            or not isinstance(config.get("task"), dict):
        raise UserError('TF_CONFIG needs a "cluster" object and a "task" object, e.g. '
                        '{"cluster": {"worker": ["host:port", ...]}, "task": {"type": "worker", '
                        '"index": 0}}')
    cluster, task = config["cluster"], config["task"]
    others = sorted(set(cluster) - set(TRAINING_JOBS))
    if others:
        raise UserError(f"TF_CONFIG's cluster names job(s) {others}: tfscale trains with "
                        f"{' and '.join(TRAINING_JOBS)} tasks only (every task a rank)")
    spec = {}
    for job in TRAINING_JOBS:
        addresses = cluster.get(job, [])
        if not isinstance(addresses, list) or not all(map(_is_address, addresses)):
            raise UserError(f'TF_CONFIG\'s cluster "{job}" must be a list of "host:port" '
                            f"addresses, got {addresses!r}")
        if addresses:
            spec[job] = list(addresses)
    if not spec:
        raise UserError('TF_CONFIG\'s cluster lists no "worker" (or "chief") addresses')
    repeated = sorted({a for a in sum(spec.values(), []) if sum(spec.values(), []).count(a) > 1})
    if repeated:
        raise UserError(f"TF_CONFIG's cluster lists {repeated} more than once: give each task "
                        "its own port")
    job, index = task.get("type"), task.get("index")
    if job not in spec or not isinstance(index, int) or not 0 <= index < len(spec[job]):
        raise UserError(f"TF_CONFIG's task {task!r} is not in its cluster (jobs and sizes: "
                        f"{ {name: len(tasks) for name, tasks in spec.items()} })")
    tasks = _tasks(spec)
    rank = tasks.index((job, index))
    hosts = [_host(spec[j][i]) for j, i in tasks]
    mine = hosts[rank]
    return TFCluster(spec=spec, job=job, task_index=index, rank=rank, size=len(tasks),
                     local_rank=hosts[:rank].count(mine), local_size=hosts.count(mine),
                     port=int(spec[job][index].rsplit(":", 1)[1]))


def on_loopback(cluster):
    """Whether every task of `cluster` has a loopback address (one host, nothing to reach)."""
    return all(_host(address) in _LOOPBACK for address in cluster.addresses)


def _tasks(spec):
    return [(job, i) for job in TRAINING_JOBS for i in range(len(spec.get(job, [])))]


def _is_address(address):
    if not isinstance(address, str) or ":" not in address:
        return False
    host, port = address.rsplit(":", 1)
    return bool(host) and port.isdigit() and 0 < int(port) < 65536


def _host(address):
    host = address.rsplit(":", 1)[0]
    return "localhost" if host in _LOOPBACK else host
