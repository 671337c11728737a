"""What the launcher's start-up does not spend (docs/results/startup.md): the train step is
traced once, though its first trace creates the step's scalar variables; the entry points
import TensorFlow without the packages Keras would import only for what they never use, which
stay importable; the dynamic tables' capacity check reads no batch when no batch could exceed
the capacity, and still refuses one that can."""

import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import models
from tests.horovod_launch import REPO_ROOT
from tfscale.data.schema import FeatureSchema
from tfscale.data.synthetic import SyntheticCTR
from tfscale.embedding.dynamic import DynamicTables
from tfscale.errors import UserError
from tfscale.optimizers import RowSparseAdam
from tfscale.step_scalars import StepScalars


def test_a_step_scalar_first_recorded_while_tracing_does_not_make_the_function_trace_again():
    scalars, traces = StepScalars(), []

    @tf.function
    def step(x):
        traces.append(1)
        scalars.record("x", x * 2)
        with_clock, seconds = scalars.timed(x, lambda: x + 1)
        return with_clock + tf.cast(seconds, x.dtype) * 0

    for value in (1.0, 2.0, 3.0):
        assert float(step(tf.constant(value))) == value + 1
    assert len(traces) == 1
    assert scalars.summary_scalars() == {"x": 6.0}


@pytest.mark.parametrize("sharding, staleness", [
    ("replicated", 0), (DynamicTables(capacity=50_000), 0), ("replicated", 1),
], ids=["replicated", "dynamic", "stale"])
def test_the_train_step_is_traced_once(sharding, staleness):
    """Stale embedding updates' queues are made in the first trace too."""
    source = SyntheticCTR(seed=0, train_rows=512, test_rows=64, vocabulary_scale=0.002)
    keras.utils.set_random_seed(0)
    model = models.build_model("deepfm", source.schema, embedding_dim=4, hidden_units=[8],
                               embedding_sharding=sharding)
    model.compile(optimizer=RowSparseAdam(1e-3), loss=keras.losses.BinaryCrossentropy(),
                  metrics=[keras.metrics.AUC(name="auc")], embedding_staleness=staleness)
    traces, train_step = [], model.train_step

    def counted(data):
        traces.append(1)
        return train_step(data)

    model.train_step = counted
    model.fit(source.train_batches(128), epochs=1, verbose=0, shuffle=False)
    assert len(traces) == 1
    # The scalars the step records (the unique-id rate; dynamic tables' rows in use) are read.
    assert 0 < model.summary_scalars()["embedding/unique_id_rate"] <= 1


def test_the_entry_points_import_tensorflow_without_keras_extras_which_stay_importable():
    extras = ("sklearn", "pandas", "matplotlib", "scipy")
    code = (
        "import sys\n"
        "import launch.quiet_tf\n"
        f"print(sorted(name for name in {extras!r} if name in sys.modules))\n"
        "import importlib.util\n"
        f"for name in {extras!r}:\n"
        "    if importlib.util.find_spec(name) is not None:\n"
        "        __import__(name)\n"
        "        assert sys.modules[name] is not None, name\n"
        "print('importable')\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=300,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["[]", "importable"], done.stdout + done.stderr


class _Source:
    """A source whose first batch holds `distinct` ids in each of 2 fields, counting its reads."""

    def __init__(self, distinct):
        self.distinct, self.reads = distinct, 0
        self.schema = FeatureSchema(dense_names=(), categorical_names=("a", "b"),
                                    vocabulary_sizes=(1000, 1000))

    def train_batches(self, batch_size, shard_index=0, num_shards=1):
        self.reads += 1
        ids = np.arange(batch_size)[:, None] % self.distinct + np.zeros((1, 2), np.int64)
        return tf.data.Dataset.from_tensors(({"categorical": ids}, np.zeros((batch_size, 1))))


def test_the_capacity_check_reads_a_batch_only_when_one_could_exceed_the_capacity():
    from absl import flags
    from absl.testing import flagsaver

    from launch import hybrid_flags, train  # noqa: F401  (defines the launcher's flags)

    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()
    with flagsaver.flagsaver(embedding_sharding="dynamic", dynamic_capacity=200):
        room = _Source(distinct=100)  # 100 rows x 2 fields <= 200: no batch can exceed it
        assert hybrid_flags.dynamic_capacity(room, 100, whole_files=True) == 200
        assert room.reads == 0
        tight = _Source(distinct=50)  # 101 rows x 2 fields > 200: read, 100 distinct ids fit
        assert hybrid_flags.dynamic_capacity(tight, 101, whole_files=True) == 200
        assert tight.reads == 1
        over = _Source(distinct=101)  # 202 distinct ids in the first batch
        with pytest.raises(UserError, match="the first training batch alone holds 202 "
                                            "distinct ids"):
            hybrid_flags.dynamic_capacity(over, 101, whole_files=True)
