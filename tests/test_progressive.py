"""Online training day by day (tfscale.training.progressive, `launch.train --progressive`): each
day's progressive metrics are an evaluation of the model on that day before it trains on it; a
resumed run continues with the next day (more days may follow those done) and a run stopped
within a day resumes bitwise equal to an uninterrupted one; files given as days get their
vocabulary from the first day; bad days and flags are refused before anything is written. (The
2-rank run: tests/test_distributed.py, from tests/multiworker/progressive_days.py.)"""

import glob
import os
import re
import shutil

import keras
import numpy as np
import pytest
import tensorflow as tf
from absl import flags

import launch.train  # noqa: F401  (defines the launcher's flags)
import models
from launch import progressive_flags
from tests.horovod_launch import launch_side_by_side
from tests.run_outputs import checkpoint_values
from tfscale.data import drifting_days
from tfscale.data.drifting import DriftingCTR
from tfscale.data.synthetic import SyntheticCTR
from tfscale.errors import UserError
from tfscale.optimizers import RowSparseAdam
from tfscale.training import ProgressiveConfig, TrainingConfig, train, train_progressively
from tfscale.checkpoints.store import CheckpointStore
from tfscale.training.evaluation import evaluate_exact

FLAGS = flags.FLAGS
BATCH = 256  # 8 steps a day of 2,048 rows


@pytest.fixture(scope="module")
def stream():
    return DriftingCTR(seed=0, days=3, rows_per_day=2048, vocabulary_scale=0.002,
                       half_life_days=2)


@pytest.fixture(scope="module")
def days(stream):
    return drifting_days.drifting_days(stream, drifting_days.hashed_ids(1000))


def compiled_model(schema):
    keras.utils.set_random_seed(0)
    # One name for every model (and optimizer) of the process: checkpoints key the tables and
    # their state by variable path.
    model = models.MODELS["deepfm"](schema, hidden_units=[16], name="deepfm")
    model.compile(optimizer=RowSparseAdam(1e-3, name="adam"), loss="binary_crossentropy")
    return model


def day_metrics(result):
    return [{key: day[key] for key in ("day", "name", "auc", "logloss", "examples", "steps")}
            for day in result.days]


@pytest.fixture(scope="module")
def two_days(days, tmp_path_factory):
    """A run over the first two days with its checkpoints: (checkpoint dir, its result, the
    evaluation of the fresh model on day 1, the evaluation of the model after two days on day
    3, its printed lines)."""
    checkpoint_dir = str(tmp_path_factory.mktemp("two_days") / "ckpt")
    model = compiled_model(days[0][1].schema)
    fresh = evaluate_exact(model, days[0][1].test_batches(BATCH))
    lines = []
    result = train_progressively(model, days[:2], ProgressiveConfig(
        BATCH, checkpoint_dir=checkpoint_dir, log_every_steps=4), print_fn=lines.append)
    after_two = evaluate_exact(model, days[2][1].test_batches(BATCH))
    return checkpoint_dir, result, fresh, after_two, lines


def test_each_day_is_scored_by_the_model_before_it_trains_on_that_day(days, two_days, tmp_path):
    checkpoint_dir, result, fresh, after_two, lines = two_days
    assert [day["day"] for day in result.days] == [1, 2]
    assert result.global_step == 16 and not result.stopped_early
    first = result.days[0]
    assert (first["auc"], first["logloss"], first["examples"]) == (
        fresh["auc"], fresh["logloss"], 2048)
    assert lines[0].startswith(f"day 1/2: progressive AUC {fresh['auc']:.4f}, logloss "
                               f"{fresh['logloss']:.4f} on 2,048 examples, scored before training "
                               f"on it ({days[0][0]})"), lines
    assert re.match(r"day 1 batch \d/8 step \d: loss [\d.]+, [\d,]+ examples/s", lines[1]), lines
    # A third day after the two: resumed from the second day's checkpoint, it is scored by the
    # model the first run left (its evaluation above), then trained on.
    resumed_dir = str(tmp_path / "ckpt")
    shutil.copytree(checkpoint_dir, resumed_dir)
    resumed_lines = []
    resumed = train_progressively(compiled_model(days[0][1].schema), days, ProgressiveConfig(
        BATCH, checkpoint_dir=resumed_dir, resume=True), print_fn=resumed_lines.append)
    assert resumed_lines[0] == f"resumed from global step 16: day 3 ({days[2][0]}), batch 0"
    assert day_metrics(resumed)[:2] == day_metrics(result)
    third = resumed.days[2]
    assert (third["day"], third["auc"], third["logloss"]) == (3, after_two["auc"],
                                                             after_two["logloss"])
    assert resumed.global_step == 24
    # Resumed once more with the same days: nothing left.
    again = []
    finished = train_progressively(compiled_model(days[0][1].schema), days, ProgressiveConfig(
        BATCH, checkpoint_dir=resumed_dir, resume=True), print_fn=again.append)
    assert finished.finished_before and day_metrics(finished) == day_metrics(resumed)
    assert again == ["the run finished its 3 days at global step 24; nothing left to do"]


@pytest.mark.parametrize("every_steps, stop, position, resumed_at", [
    (0, 9, (1, 0), "day 2 ("),  # day 1's own checkpoint: the next day
    (4, 8, (0, 8), "day 1 ("),  # day 1's last batch, before the day's catch-up and checkpoint
], ids=["next-day", "last-batch"])
def test_a_stopped_run_resumes_bitwise(days, two_days, tmp_path, every_steps, stop, position,
                                       resumed_at):
    """Stopped on day 2, the newest checkpoint is day 1's own (the run resumes with day 2), or
    one of day 1's last batch, taken before the catch-up of the rows it left behind and the
    day's own checkpoint (the run finishes day 1 without training); either way it ends bitwise
    as the uninterrupted run did."""
    config = ProgressiveConfig(BATCH, checkpoint_dir=str(tmp_path / "ckpt"),
                               checkpoint_every_steps=every_steps, stop_after_steps=stop)
    stopped = train_progressively(compiled_model(days[0][1].schema), days[:2], config)
    assert stopped.stopped_early and day_metrics(stopped) == day_metrics(two_days[1])[:position[0]]
    progress = CheckpointStore(str(tmp_path / "ckpt"), model=None).latest_progress()
    assert (progress["epoch"], progress["batches_done"]) == position
    lines = []
    resumed = train_progressively(compiled_model(days[0][1].schema), days[:2], ProgressiveConfig(
        BATCH, checkpoint_dir=str(tmp_path / "ckpt"), resume=True), print_fn=lines.append)
    assert lines[0].startswith(f"resumed from global step 8: {resumed_at}"), lines
    assert day_metrics(resumed) == day_metrics(two_days[1])
    expected, actual = checkpoint_values(two_days[0]), checkpoint_values(str(tmp_path / "ckpt"))
    assert expected.keys() == actual.keys()
    for name in expected:
        np.testing.assert_array_equal(expected[name], actual[name], err_msg=name)


def checkpoint_files(directory):
    """{path: (size, modification time)} of every file under `directory`."""
    return {path: (os.path.getsize(path), os.path.getmtime(path))
            for path in glob.glob(f"{directory}/**", recursive=True) if os.path.isfile(path)}


def test_a_resume_with_other_days_is_refused_and_leaves_the_checkpoint(days, two_days):
    checkpoint_dir = two_days[0]
    before = checkpoint_files(checkpoint_dir)
    config = ProgressiveConfig(BATCH, checkpoint_dir=checkpoint_dir, resume=True)
    for given, message in [
            ([days[1], days[0], days[2]], f"whose day 1 was {days[0][0]!r}; the days given now "
                                          f"have {days[1][0]!r} there"),
            (days[:1], f"whose day 2 was {days[1][0]!r}; the days given now have only 1 days")]:
        with pytest.raises(UserError) as refusal:
            train_progressively(compiled_model(days[0][1].schema), given, config)
        assert (message + ": resume with the days it has trained on (2) first, in the same "
                "order (more may follow them)") in str(refusal.value)
    # Not resumed: the run is never overwritten.
    with pytest.raises(UserError, match="already holds a checkpoint .*give `resume=True`"):
        train_progressively(compiled_model(days[0][1].schema), days,
                            ProgressiveConfig(BATCH, checkpoint_dir=checkpoint_dir))
    assert checkpoint_files(checkpoint_dir) == before


def test_runs_by_epochs_and_by_days_do_not_resume_each_other(days, two_days, tmp_path):
    model = compiled_model(days[0][1].schema)
    with pytest.raises(UserError, match=r"holds a run trained day by day \(`train_progressively` "
                                        "trains day by day\\), not by epochs: resume it day by day"):
        train(model, days[0][1], TrainingConfig(BATCH, epochs=1, checkpoint_dir=two_days[0],
                                                resume=True))
    model = compiled_model(days[0][1].schema)
    model(next(iter(days[0][1].test_batches(8)))[0])
    model.optimizer.build(model.trainable_variables)
    CheckpointStore(str(tmp_path), model=model, optimizer=model.optimizer).save(
        5, {"epoch": 1, "batches_done": 0})
    with pytest.raises(UserError, match="holds a run trained by epochs .*not day by day: resume "
                                        "it by epochs"):
        train_progressively(model, days, ProgressiveConfig(BATCH, checkpoint_dir=str(tmp_path),
                                                           resume=True))


@pytest.fixture(scope="module")
def vocabulary_days(stream):
    return drifting_days.drifting_days(stream, drifting_days.vocabulary_ids(
        drifting_days.count_day_vocabulary(stream, 0, min_count=2)))


def test_bad_days_are_refused_before_anything_is_written(days, vocabulary_days, tmp_path):
    short = DriftingCTR(seed=0, days=2, rows_per_day=200, vocabulary_scale=0.002,
                        half_life_days=2)
    cases = [
        ([], "`days` is empty"),
        ([days[0], days[1], days[0]], f"`days` names {days[0][0]!r} more than once"),
        ([days[0], vocabulary_days[1]], "has another feature schema than day"),
        (drifting_days.drifting_days(short, drifting_days.hashed_ids(1000)),
         "has less than one full batch of `batch_size=256`: an empty or too short day"),
    ]
    for given, message in cases:
        with pytest.raises(UserError, match=re.escape(message)):
            train_progressively(compiled_model(days[0][1].schema), given, ProgressiveConfig(
                BATCH, checkpoint_dir=str(tmp_path / "ckpt"), logdir=str(tmp_path / "logs")))
    assert not os.listdir(tmp_path)


# ----------------------------------------------------------------------------- the launcher

@pytest.mark.parametrize("given, message", [
    (["--data=drifting"], "--data=drifting is a stream of days: train on it with --progressive"),
    (["--progressive"], "--progressive trains on days: give --data=drifting"),
    (["--data=drifting", "--progressive", "--epochs=2"],
     "--epochs=2 has no meaning there; leave --epochs at 1"),
    (["--data=criteo", "--train_path=a,b", "--progressive", "--test_path=c"],
     "--test_path: with --progressive each day is scored before it is trained on"),
    (["--data=criteo", "--train_path=a,b", "--progressive", "--test_fraction=0.2"],
     "--test_fraction: with --progressive each day is scored"),
    (["--data=drifting", "--progressive", "--train_rows=1000"],
     "--train_rows sizes --data=synthetic"),
    (["--days=3"], "--days shapes the drifting stream's days: it goes with --data=drifting"),
    (["--data=drifting", "--progressive", "--categorical_encoding=raw"],
     "--categorical_encoding=raw gives ids up to 2^56 in every field, which only tables keyed by "
     "id can hold: give --embedding_sharding=dynamic (not replicated)"),
])
def test_flags_that_need_or_refuse_progressive(given, message):
    try:
        FLAGS(["launch.train", *given])
        with pytest.raises(UserError) as refusal:
            progressive_flags.check_flags()
    finally:
        FLAGS.unparse_flags()
    assert message in str(refusal.value)


# A small DeepFM; 3 files of 1,600 lines: 6 steps of 256 a day.
DAY_LINES = 1600
SMALL_RUN = ["--data=criteo", "--progressive", "--dnn_units=16,16", "--batch_size=256",
             "--log_every_steps=3", "--checkpoint_every_steps=4", "--vocabulary_min_count=2"]


@pytest.fixture(scope="module")
def day_files(tmp_path_factory):
    directory = tmp_path_factory.mktemp("days")
    data = SyntheticCTR(seed=0, train_rows=3 * DAY_LINES, test_rows=10, vocabulary_scale=0.002)
    paths = [str(directory / f"day{d + 1}.txt") for d in range(3)]
    for d, path in enumerate(paths):
        data.write_criteo_tsv(path, d * DAY_LINES, DAY_LINES)
    return paths


@pytest.fixture(scope="module")
def file_runs(day_files, tmp_path_factory):
    """(the uninterrupted run's stdout, the stopped run's, the resumed run's, run directory):
    the stopped run ends at step 9 (day 2, batch 3), its newest checkpoint is step 8."""
    run_dir = tmp_path_factory.mktemp("file_runs")
    flags_ = [*SMALL_RUN, f"--train_path={','.join(day_files)}"]
    whole, stopped = launch_side_by_side(
        [*flags_, f"--logdir={run_dir}/logs", f"--checkpoint_dir={run_dir}/whole"],
        [*flags_, "--logdir=none", f"--checkpoint_dir={run_dir}/split", "--stop_after_steps=9"])
    resumed, = launch_side_by_side(
        [*flags_, "--logdir=none", f"--checkpoint_dir={run_dir}/split", "--resume"])
    for result in (whole, stopped, resumed):
        assert result.returncode == 0, result.stdout + result.stderr
    return whole.stdout, stopped.stdout, resumed.stdout, run_dir


def scores(out):
    """{day: (auc, logloss)} of the progressive validation lines of a launcher run."""
    return {int(day): (auc, logloss) for day, auc, logloss in re.findall(
        r"^day (\d)/3: progressive AUC ([\d.]+), logloss ([\d.]+)", out, re.MULTILINE)}


def test_file_days_are_scored_trained_and_resumed_bitwise(day_files, file_runs):
    whole, stopped, resumed, run_dir = file_runs
    assert "3 days once each" in whole
    assert re.search(r"^progressive validation over 3 days: mean AUC [\d.]+, mean logloss [\d.]+;"
                     r" day 3: AUC [\d.]+, logloss [\d.]+$", whole, re.MULTILINE), whole
    for day in (1, 2, 3):
        assert f"day {day}/3: trained 6 steps" in whole
    # The vocabulary of the first day alone (an online run cannot know the later ones), counted
    # by the first of the two runs side by side to look for it (the other may find it cached).
    assert f"vocabulary: counting the categorical values of {day_files[0]} (" in whole + stopped
    caches = glob.glob(f"{os.path.dirname(day_files[0])}/*.tfscale-vocab-*")
    assert [os.path.basename(path).split(".")[0] for path in caches] == ["day1"]
    # Stopped on day 2; resumed from its step-8 checkpoint: day 2's score is the one taken
    # before the interruption, and everything ends as in the uninterrupted run.
    assert "stopped after global step 9" in stopped
    assert f"resumed from global step 8: day 2 ({day_files[1]}), batch 2" in resumed, resumed
    assert re.search(r"^day 2/3: progressive AUC .* scored before the interruption", resumed,
                     re.MULTILINE), resumed
    assert scores(stopped) == {day: scores(whole)[day] for day in (1, 2)}
    assert scores(resumed) == {day: scores(whole)[day] for day in (2, 3)}
    expected = checkpoint_values(f"{run_dir}/whole")
    actual = checkpoint_values(f"{run_dir}/split")
    assert expected.keys() == actual.keys()
    for name in expected:
        np.testing.assert_array_equal(expected[name], actual[name], err_msg=name)
    # TensorBoard: one point per day, the day as the step.
    events, = glob.glob(f"{run_dir}/logs/progressive/events.out.tfevents.*")
    logged = {}
    for event in tf.compat.v1.train.summary_iterator(events):
        for value in event.summary.value:
            logged.setdefault(value.tag, {})[event.step] = float(tf.make_ndarray(value.tensor))
    assert sorted(logged) == ["auc", "logloss"]
    assert {day: (f"{logged['auc'][day]:.4f}", f"{logged['logloss'][day]:.4f}")
            for day in logged["auc"]} == scores(whole)


def test_launcher_refusals_write_nothing(day_files, file_runs, tmp_path):
    """A resume with the days in another order, and a drifting day shorter than a batch: each a
    one-paragraph error before anything is written."""
    run_dir = file_runs[3]
    before = checkpoint_files(f"{run_dir}/whole")
    reordered = [day_files[1], day_files[0], day_files[2]]
    other_days, short_day = launch_side_by_side(
        [*SMALL_RUN, f"--train_path={','.join(reordered)}", "--logdir=none",
         f"--checkpoint_dir={run_dir}/whole", "--resume"],
        ["--data=drifting", "--progressive", "--rows_per_day=200", "--days=2",
         "--synthetic_vocabulary_scale=0.002", "--dnn_units=16", "--batch_size=256",
         f"--logdir={tmp_path}/logs", f"--checkpoint_dir={tmp_path}/ckpt"])
    assert other_days.returncode == 2, other_days.stdout + other_days.stderr
    assert (f"error: --checkpoint_dir={run_dir}/whole holds a run whose day 1 was "
            f"'{day_files[0]}'; the days given now have '{day_files[1]}' there") \
        in other_days.stderr
    assert checkpoint_files(f"{run_dir}/whole") == before
    assert short_day.returncode == 2, short_day.stdout + short_day.stderr
    assert "has less than one full batch of --batch_size=256" in short_day.stderr
    for result in (other_days, short_day):
        assert "Traceback" not in result.stderr
    assert not os.listdir(tmp_path)
