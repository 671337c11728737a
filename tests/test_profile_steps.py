"""A profile of a few steps for TensorBoard: tfscale.callbacks.ProfileSteps writes TensorFlow's
profile of its window of global steps, counted over several `fit` calls, once; the launcher's
--profile_steps writes it under <logdir>/train and refuses what it cannot do."""

import glob

import keras
import numpy as np
import pytest

import tfscale
from tests import grouped_launches

RUNS_DIR = "{dir}/profile_steps"
SMALL_DATA = ["--train_rows=2048", "--test_rows=256", "--synthetic_vocabulary_scale=0.002",
              "--dnn_units=16", "--batch_size=128", "--checkpoint_dir=none"]


def profiles(logdir):
    return glob.glob(f"{logdir}/plugins/profile/*/*.xplane.pb")


class RecordedSteps(tfscale.callbacks.ProfileSteps):
    """ProfileSteps that also notes the global step the profiler starts before and stops
    after."""

    def __init__(self, *args):
        super().__init__(*args)
        self.started_before = self.stopped_after = None

    def on_train_batch_begin(self, batch, logs=None):
        super().on_train_batch_begin(batch, logs)
        if self._profiling and self.started_before is None:
            self.started_before = int(self.model.optimizer.iterations) + 1

    def _stop(self):
        self.stopped_after = int(self.model.optimizer.iterations)
        super()._stop()


def small_model():
    ids = keras.Input((3,), dtype="int64")
    vectors = tfscale.FieldEmbedding([10, 10, 10], embedding_dim=4)(ids)
    outputs = keras.layers.Dense(1, activation="sigmoid")(keras.layers.Flatten()(vectors))
    model = tfscale.FunctionalTrainStepModel(ids, outputs)
    model.compile(optimizer=tfscale.optimizers.RowSparseAdam(1e-3), loss="binary_crossentropy")
    return model


def test_the_window_of_global_steps_is_profiled_once(tmp_path):
    model = small_model()
    x, y = np.random.randint(0, 10, (320, 3)), np.random.randint(0, 2, (320, 1))
    profile = RecordedSteps(str(tmp_path), 7, 8)
    for epoch in range(3):  # an epoch a `fit`, as tfscale.training.train calls it: 5 steps each
        model.fit(x, y, batch_size=64, initial_epoch=epoch, epochs=epoch + 1, verbose=0,
                  callbacks=[profile])
    assert (profile.started_before, profile.stopped_after) == (7, 8)
    assert len(profiles(tmp_path)) == 1


def test_a_window_an_epoch_ends_in_stops_there_and_does_not_start_again(tmp_path):
    model = small_model()
    x, y = np.random.randint(0, 10, (320, 3)), np.random.randint(0, 2, (320, 1))
    profile = RecordedSteps(str(tmp_path), 4, 20)
    model.fit(x, y, batch_size=64, verbose=0, callbacks=[profile])  # steps 1 to 5
    assert (profile.started_before, profile.stopped_after) == (4, 5)
    model.fit(x, y, batch_size=64, verbose=0, callbacks=[profile])  # steps 6 to 10: in the window
    assert profile.stopped_after == 5 and not profile._profiling
    assert len(profiles(tmp_path)) == 1


@pytest.mark.parametrize("steps", [(0, 3), (5, 4)])
def test_a_window_out_of_order_is_refused(steps):
    with pytest.raises(ValueError, match="1 <= first_step <= last_step"):
        tfscale.callbacks.ProfileSteps("logs", *steps)


PROFILED = grouped_launches.launcher_job(
    "launcher-profile-steps", 1, *SMALL_DATA, "--profile_steps=3,5",
    f"--logdir={RUNS_DIR}/logs")
WITHOUT_LOGDIR = grouped_launches.launcher_job(
    "launcher-profile-steps-without-logdir", 1, *SMALL_DATA, "--profile_steps=3,5",
    "--logdir=none")
OUT_OF_ORDER = grouped_launches.launcher_job(
    "launcher-profile-steps-out-of-order", 1, *SMALL_DATA, "--profile_steps=5,3",
    "--logdir=none")


def test_the_launcher_writes_the_profile_where_tensorboard_reads_it(launched_jobs):
    result = launched_jobs[PROFILED]
    assert result.returncode == 0, result.stderr()
    assert len(profiles(launched_jobs.path(f"{RUNS_DIR}/logs/train"))) == 1


@pytest.mark.parametrize("job, message", [
    (WITHOUT_LOGDIR, "--profile_steps writes a profile into --logdir: give a --logdir"),
    (OUT_OF_ORDER, "--profile_steps takes FIRST,LAST: two global steps, 1 <= FIRST <= LAST")])
def test_the_launcher_refuses_a_profile_it_cannot_write(launched_jobs, job, message):
    result = launched_jobs[job]
    assert result.returncode != 0
    assert message in result.stderr(), result.stderr()
    assert "Traceback" not in result.stderr()
