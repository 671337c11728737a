"""Timing a model's training steps from inside `model.fit`, the machine line every benchmark
prints (and its CPU flags), the CPU time other processes took meanwhile, and the start of the
benchmarks that run under horovodrun."""

import os
import pathlib
import platform
import subprocess
import time

import keras
import tensorflow as tf


def machine_description():
    """CPU model, cores, Python, TensorFlow and Keras versions."""
    cpuinfo = pathlib.Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.exists() else []
    model_name = next((line.split(":", 1)[1].strip() for line in lines
                       if line.startswith("model name")), platform.machine())
    return (f"{model_name}, {os.cpu_count()} cores (shared with other work), Python "
            f"{platform.python_version()}, TensorFlow {tf.__version__}, Keras {keras.__version__}")


def cpu_flags():
    """The CPU's vector and matrix flags (lscpu), as the results pages quote them."""
    listed = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    flags_line = next((line for line in listed.splitlines() if line.startswith("Flags:")), "")
    return " ".join(f for f in flags_line.split()[1:] if f.startswith(("avx", "amx", "fma")))


def machine_busy_seconds():
    """CPU seconds every core has been busy since boot (/proc/stat: user..steal; guest time is
    inside user)."""
    with open("/proc/stat") as stat:
        fields = [int(value) for value in stat.readline().split()[1:]]
    idle, iowait = fields[3], fields[4]
    return (sum(fields[:8]) - idle - iowait) / os.sysconf("SC_CLK_TCK")


class OtherProcessesCPU:
    """CPU seconds the rest of the machine used since construction: every core's busy time
    (/proc/stat) less this process's own, so a timed interval can say whether it ran alone."""

    def __init__(self):
        self._start = machine_busy_seconds() - self._own()

    def seconds(self):
        return machine_busy_seconds() - self._own() - self._start

    @staticmethod
    def _own():
        times = os.times()
        return times.user + times.system


class StepDurations(keras.callbacks.Callback):
    """Seconds from the start to the end of each training batch (`seconds`)."""

    def __init__(self):
        super().__init__()
        self.seconds = []

    def on_train_batch_begin(self, batch, logs=None):
        self._started = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        self.seconds.append(time.perf_counter() - self._started)


class StepTimer(keras.callbacks.Callback):
    """Records the time at the end of every training batch."""

    def __init__(self):
        super().__init__()
        self.times = []

    def on_train_batch_end(self, batch, logs=None):
        self.times.append(time.perf_counter())


def examples_per_second(model, fit_args, batch_size, warmup, steps):
    """Examples/s of `model.fit(**fit_args)` over `steps` steps after `warmup` untimed ones."""
    timer = StepTimer()
    model.fit(**fit_args, callbacks=[timer], verbose=0, shuffle=False)
    timed = timer.times[warmup - 1:warmup + steps]
    return batch_size * (len(timed) - 1) / (timed[-1] - timed[0])


def start_horovod_ranks():
    """Starts Horovod in a benchmark launched by horovodrun with 2 or more ranks, or stops it
    with a usage error."""
    from absl import app

    from tfscale import distributed

    if not distributed.launched_by_horovodrun():
        raise app.UsageError("run under horovodrun -np P (P >= 2), see the module docstring")
    distributed.init()
    if not distributed.is_active():
        raise app.UsageError("needs at least 2 Horovod ranks")
