"""End to end through `python -m launch.train`: a few hundred training steps with progress,
evaluation, TensorBoard event files and checkpoints; a stopped-and-resumed run ending with
bitwise the same weights as an uninterrupted one; bad input ending in a one-paragraph error.

The runs are the launcher's command line (absl's app.run of launch.train.run, as its __main__
runs it) in one process for all of them, started once (tests/grouped_launches.py); the resumed
finished run and the TensorFlow start-up lines are processes of their own."""

import functools
import glob
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import pytest
import tensorflow as tf

from tests import grouped_launches
from tests.horovod_launch import REPO_ROOT
from tests.run_outputs import checkpoint_values

# A small DeepFM on a small synthetic set, so a few hundred steps take seconds.
# CowClip given: on the built-in data the launcher's default is Adam with sqrt scaling.
SMALL_RUN = ["--train_rows=40000", "--test_rows=8000", "--synthetic_vocabulary_scale=0.002",
             "--dnn_units=64,64", "--batch_size=256", "--log_every_steps=50", "--optimizer=cowclip"]
RUNS_DIR = "{dir}/launcher"


def launch(*flags, timeout=300):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.run([sys.executable, "-m", "launch.train", *flags], cwd=REPO_ROOT, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          timeout=timeout)


def launcher_job(name, *flags, stage=0):
    """Registers `python -m launch.train FLAGS` in one process as the job "launcher-NAME"
    (tests/grouped_launches.py, tests/multiworker/launcher_run.py: absl's app.run of the
    launcher, as its command line runs it); returns the name."""
    return grouped_launches.launcher_job(f"launcher-{name}", 1, *flags, stage=stage)


TRAINING_RUN = launcher_job("training-run", *SMALL_RUN, "--epochs=2",
                            f"--logdir={RUNS_DIR}/training/logs",
                            f"--checkpoint_dir={RUNS_DIR}/training/ckpt",
                            "--checkpoint_every_steps=100")


def test_training_run_reports_auc_and_writes_logs_and_checkpoints(launched_jobs):
    result = launched_jobs[TRAINING_RUN]
    assert result.returncode == 0, result.stderr()
    out = result.stdout()
    run_dir = launched_jobs.path(f"{RUNS_DIR}/training")
    assert "examples/s" in out
    assert "epoch 2/2: test AUC" in out
    final = [line for line in out.splitlines() if line.startswith("final test AUC")]
    assert final, out
    auc = float(final[0].split()[3].rstrip(","))
    ceiling = float(final[0].split("teacher ceiling: AUC ")[1].split(",")[0])
    assert 0.6 < auc < ceiling + 0.01, final[0]  # learned something, and no better than the teacher
    # 2 epochs of 156 steps: checkpoints at steps 100, 200, 300 and epoch ends; the newest 2 kept.
    steps = sorted(os.path.basename(d) for d in glob.glob(f"{run_dir}/ckpt/step-*"))
    assert steps == ["step-0000000300", "step-0000000312"], steps
    train_events = glob.glob(f"{run_dir}/logs/train/events.out.tfevents.*")
    test_events = glob.glob(f"{run_dir}/logs/test/events.out.tfevents.*")
    assert train_events and test_events
    tags = {value.tag for event in tf.compat.v1.train.summary_iterator(train_events[0])
            for value in event.summary.value}
    assert {"loss", "auc", "examples_per_second", "step_time_seconds", "learning_rate/dense",
            "learning_rate/embedding"} <= tags, tags
    table = "cowclip/deepfm/field_embedding/deep_embedding/embeddings"
    assert {f"{table}/clipped_fraction", f"{table}/mean_clip_factor"} <= tags, tags


def _has_cowclip_state(values):
    """The embedding optimizer's moments of the tables, in the tables' file."""
    return any(name.startswith("tables-0-of-1/embedding/") and name.endswith("_moments")
               for name in values)


def _has_came_state(values):
    """CAME's factored statistics: a vector as long as the embedding table has rows."""
    table_rows = max(value.shape[0] for value in values.values() if value.ndim == 2)
    return any(name.startswith("tables-0-of-1/") and value.shape == (table_rows,)
               for name, value in values.items())


def _has_loss_scale_state(values):
    """The scaler's scale (grown from 2^15 every 5 steps) next to the inner CowClip's state."""
    scales = [value for name, value in values.items() if value.ndim == 0
              and value.dtype == np.float32 and value > 2.0 ** 15]
    return _has_cowclip_state(values) and len(scales) == 1


# CowClip is resumed under float16 loss scaling: its state and the
# scaler's in one run.
RESUMED_CASES = {"came": (["--optimizer=came", "--embedding_update=dense"], _has_came_state),
                 "cowclip-float16": (["--precision=mixed_float16", "--loss_scale_growth_steps=5"],
                                     _has_loss_scale_state)}


def _resume_jobs(case, flags):
    """The uninterrupted run, one that stops at step 37 (mid-epoch 1: its newest checkpoint is
    step 30, so 7 steps are redone) and its resumption: (job names, run directory)."""
    run_dir = f"{RUNS_DIR}/resume-{case}"
    common = [*SMALL_RUN, "--train_rows=12800", "--epochs=2", "--checkpoint_every_steps=15",
              "--logdir=none", *flags]
    return (launcher_job(f"{case}-whole", *common, f"--checkpoint_dir={run_dir}/whole"),
            launcher_job(f"{case}-stopped", *common, f"--checkpoint_dir={run_dir}/split",
                         "--stop_after_steps=37"),
            launcher_job(f"{case}-resumed", *common, f"--checkpoint_dir={run_dir}/split",
                         "--resume", stage=1)), run_dir


RESUME_JOBS = {case: _resume_jobs(case, flags) for case, (flags, _) in RESUMED_CASES.items()}


@pytest.mark.parametrize("case", list(RESUMED_CASES))
def test_stopped_and_resumed_run_equals_uninterrupted_run(launched_jobs, case):
    flags, has_its_state = RESUMED_CASES[case]
    (whole, first, second), run_dir = RESUME_JOBS[case]
    whole, first, second = (launched_jobs[name] for name in (whole, first, second))
    assert whole.returncode == 0, whole.stderr()
    warns = "warning: --precision=mixed_float16 with no GPU" in whole.stdout()
    assert warns == ("--precision=mixed_float16" in flags
                     and not tf.config.list_physical_devices("GPU")), whole.stdout()
    assert first.returncode == 0, first.stderr()
    assert "stopped after global step 37" in first.stdout()
    assert second.returncode == 0, second.stderr()
    resumed = re.search(r"resumed from global step 30: epoch 1, batch (\d+)", second.stdout())
    assert resumed, second.stdout()
    if "--precision=mixed_float16" in flags:
        # The first steps at scale 2^15 overflow and are skipped: batches, not optimizer steps.
        assert int(resumed.group(1)) > 30
    else:
        assert int(resumed.group(1)) == 30

    run_dir = launched_jobs.path(run_dir)
    expected, actual = checkpoint_values(f"{run_dir}/whole"), checkpoint_values(f"{run_dir}/split")
    assert expected.keys() == actual.keys()
    weight_names = [n for n in expected if "embedding" in n or "kernel" in n]
    assert weight_names
    assert has_its_state(expected), {name: value.shape for name, value in expected.items()}
    for name in expected:
        np.testing.assert_array_equal(expected[name], actual[name], err_msg=name)


CRITEO_RUN = ["--data=criteo", "--batch_size=256", "--dnn_units=32", "--hash_buckets=1000",
              "--epochs=1", "--logdir=none", "--checkpoint_dir=none"]
CRITEO_DIR = f"{RUNS_DIR}/criteo"
# A whole run on a Criteo file with checkpoints, and the same command again (no --resume).
CHECKPOINTED_FLAGS = [*CRITEO_RUN[:-1], f"--train_path={CRITEO_DIR}/train.txt",
                      f"--checkpoint_dir={CRITEO_DIR}/ckpt"]
CHECKPOINTED_RUN = launcher_job("criteo-checkpointed", *CHECKPOINTED_FLAGS)
CHECKPOINTED_AGAIN = launcher_job("criteo-checkpointed-again", *CHECKPOINTED_FLAGS, stage=1)


def test_refuses_to_overwrite_a_run_without_resume(launched_jobs):
    checkpoint_dir = launched_jobs.path(f"{CRITEO_DIR}/ckpt")
    again = launched_jobs[CHECKPOINTED_AGAIN]
    assert again.returncode == 2
    assert f"--checkpoint_dir={checkpoint_dir} already holds a checkpoint" in again.stderr()
    assert "give --resume to continue" in again.stderr() and "Traceback" not in again.stderr()


BAD_FLAGS = [
    (["--model=deepcross"], "--model"),
    (["--batch_size=0"], "--batch_size"),
    (["--batch_size=-5"], "--batch_size"),
    (["--dnn_units=400,x"], "--dnn_units"),
    (["--resume"], "--resume needs --checkpoint_dir"),
    (["--loss_scale=big"], "--loss_scale=big"),
    (["--optimizer=adam", "--embedding_comm=gtopk", "--embedding_staleness=1"],
     "--embedding_staleness=1 cannot be used with --embedding_comm=gtopk"),
    (["--optimizer=cowclip", "--embedding_comm=dense"],
     "--embedding_comm=dense cannot be used with CowClip"),
    (["--clip_r=0"], "--clip_r=0.0: --clip_r must be above 0"),
    (["--zeta=nan"], "--zeta=nan: --zeta must be a finite number"),
    (["--optimizer=cowclip", "--l2=1"], "--l2=1.0 with --clip_r=1.0: CowClip needs 2*l2 <= r"),
    (["--optimizer=cowclip", "--clip_r=0.5", "--l2=0.3"], "lower --l2 or raise --clip_r"),
    # Dense updates of the built-in data's default (Adam, sqrt) put the L2 on whole tables.
    (["--embedding_sharding=row", "--embedding_update=dense"], "--embedding_sharding=row needs "
     "the tables' gradients as rows, and --l2=1e-05 (the sqrt rule's) with --optimizer=adam is a "
     "regularizer on whole tables: give --embedding_update=row (which applies --l2 to the "
     "batch's rows) or --l2=0"),
    (["--optimizer=sgd", "--l2=0.001", "--embedding_sharding=row", "--embedding_staleness=2",
      "--embedding_update=dense"],
     "--embedding_sharding=row and --embedding_staleness=2 need the tables' gradients as rows, "
     "and --l2=0.001 with --optimizer=sgd is"),
    (["--optimizer=adagrad", "--l2=0", "--embedding_sharding=row", "--embedding_update=dense"],
     "Adagrad would update the row-sharded table deepfm/field_embedding/deep_embedding/"
     "embeddings whole every step: give it an optimizer that updates it by row "
     "(--embedding_update=row: "),
    (["--optimizer=cowclip", "--scaling_rule=sqrt"],
     "--optimizer=cowclip and --scaling_rule=cowclip go together (got --optimizer=cowclip, "
     "--scaling_rule=sqrt)"),
    (["--train_rows=1000", "--batch_size=2048"],
     "--batch_size=2048 is larger than the training split"),
]
# Small data under every bad flag (whose own flags come after, and win), so that the refusals
# that come once the data and the model are built do not build the default 4M-row set first.
SMALL_DATA = ["--train_rows=1000", "--test_rows=100", "--synthetic_vocabulary_scale=0.002",
              "--dnn_units=16", "--batch_size=128"]
BAD_FLAG_JOBS = [launcher_job(f"bad-flags-{row}", *SMALL_DATA, *flags, "--logdir=none",
                              "--checkpoint_dir=none")
                 for row, (flags, _) in enumerate(BAD_FLAGS)]


@pytest.mark.parametrize("row", range(len(BAD_FLAGS)),
                         ids=[" ".join(flags) for flags, _ in BAD_FLAGS])
def test_bad_flags_give_a_clear_error(launched_jobs, row):
    result, message = launched_jobs[BAD_FLAG_JOBS[row]], BAD_FLAGS[row][1]
    assert result.returncode != 0
    assert message in result.stderr(), result.stderr()
    assert "Traceback" not in result.stderr()


UNLABELLED_DIR = f"{RUNS_DIR}/unlabelled"
# Criteo's own test.txt has no label column.
UNLABELLED = launcher_job("unlabelled-test-file", *CRITEO_RUN[:-1],
                          f"--train_path={UNLABELLED_DIR}/train.txt",
                          f"--test_path={UNLABELLED_DIR}/test.txt",
                          f"--checkpoint_dir={UNLABELLED_DIR}/ckpt")


def test_an_unlabelled_test_file_is_refused_before_anything_is_written(launched_jobs):
    result = launched_jobs[UNLABELLED]
    assert result.returncode == 2, result.stdout() + result.stderr()
    assert "the test split has no label column" in result.stderr(), result.stderr()
    assert "give labelled --test_path, or none to hold out --test_fraction" in result.stderr()
    assert "Traceback" not in result.stderr() and "examples/s" not in result.stdout()
    assert not launched_jobs.path(f"{UNLABELLED_DIR}/ckpt").exists()


def test_library_arguments_are_told_as_flags():
    from launch.user_errors import in_flag_terms

    assert in_flag_terms("`embedding_exchange=\"gtopk\"` with `embedding_staleness=1`; "
                         "give `resume=True` or a `checkpoint_dir`; `unknown_arg=3`; "
                         "`columns={'I1': 'your_column'}`; `table_dtype=\"float32\"`") == (
        "--embedding_comm=gtopk with --embedding_staleness=1; give --resume or a "
        "--checkpoint_dir; `unknown_arg=3`; --parquet_columns=I1=your_column; "
        "--table_dtype=float32")


@functools.lru_cache(maxsize=None)
def _criteo_lines():
    """The lines of a 3,000-line Criteo-format file from the synthetic generator."""
    from tfscale.data.synthetic import SyntheticCTR

    path = pathlib.Path(tempfile.mkdtemp()) / "train.txt"
    SyntheticCTR(seed=3, train_rows=3000, test_rows=10,
                 vocabulary_scale=0.002).write_criteo_tsv(str(path), 0, 3000)
    lines = path.read_text().splitlines(keepends=True)
    shutil.rmtree(path.parent)
    return lines


def _criteo_file(path, lines_to_replace=None):
    """_criteo_lines() written to `path` (its directory made), with some lines replaced."""
    lines = list(_criteo_lines())
    for number, text in (lines_to_replace or {}).items():
        lines[number - 1] = text
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(lines))
    return path


def _field_missing(line):
    return "\t".join(line.rstrip("\n").split("\t")[:-1]) + "\n"


def _integer_not_numeric(line):
    fields = line.rstrip("\n").split("\t")
    fields[3] = "12x"
    return "\t".join(fields) + "\n"


SHORT_LINES_FILE = f"{RUNS_DIR}/short_lines/train.txt"
SHORT_LINES = launcher_job("short-lines", *CRITEO_RUN, f"--train_path={SHORT_LINES_FILE}")
SHORT_LINES_REFUSED = launcher_job("short-lines-refused", *CRITEO_RUN,
                                   f"--train_path={SHORT_LINES_FILE}", "--on_short_line=error")
# name: (the corruption of line 1234, the message naming the line)
MALFORMED = {"integer-not-numeric": (_integer_not_numeric, "line 1234")}
MALFORMED_JOBS = {
    name: (launcher_job(f"malformed-{name}", *CRITEO_RUN,
                        f"--train_path={RUNS_DIR}/malformed-{name}/train.txt"),
           launcher_job(f"malformed-{name}-skipped", *CRITEO_RUN,
                        f"--train_path={RUNS_DIR}/malformed-{name}/train.txt",
                        "--on_bad_line=skip"))
    for name in MALFORMED}
MISSING = launcher_job("missing-file", *CRITEO_RUN, f"--train_path={RUNS_DIR}/nope.txt")
EMPTY = launcher_job("empty-file", *CRITEO_RUN, f"--train_path={RUNS_DIR}/empty.txt")


@grouped_launches.prepare
def _criteo_files(directory):
    """The files the Criteo runs read."""
    runs_dir = pathlib.Path(RUNS_DIR.format(dir=directory))
    lines = _criteo_lines()
    _criteo_file(runs_dir / "criteo" / "train.txt")
    train_file = _criteo_file(runs_dir / "unlabelled" / "train.txt")
    (runs_dir / "unlabelled" / "test.txt").write_text(
        "".join(line.split("\t", 1)[1] for line in train_file.read_text().splitlines(True)))
    _criteo_file(pathlib.Path(SHORT_LINES_FILE.format(dir=directory)),
                 {3: _field_missing(_field_missing(lines[2])), 1234: _field_missing(lines[1233])})
    for name, (corrupt, _) in MALFORMED.items():
        _criteo_file(runs_dir / f"malformed-{name}" / "train.txt", {1234: corrupt(lines[1233])})
    (runs_dir / "empty.txt").write_text("")


def test_trains_on_a_criteo_file(launched_jobs):
    result = launched_jobs[CHECKPOINTED_RUN]
    assert result.returncode == 0, result.stderr()
    assert "final test AUC" in result.stdout()


def test_short_line_trains_by_default_and_is_refused_on_request(launched_jobs):
    result = launched_jobs[SHORT_LINES]
    assert result.returncode == 0, result.stderr()
    assert "of 2 short lines as missing values (--on_short_line=missing)" in result.stdout()
    refused = launched_jobs[SHORT_LINES_REFUSED]
    assert refused.returncode == 2, refused.stdout() + refused.stderr()
    path = launched_jobs.path(SHORT_LINES_FILE)
    assert f"{path} line 3: expected 40 tab-separated fields, found 38 (a line missing only " \
           "trailing fields reads them as missing with --on_short_line=missing)" in refused.stderr()
    assert "Traceback" not in refused.stderr()


@pytest.mark.parametrize("name", list(MALFORMED))
def test_malformed_line_names_file_and_line(launched_jobs, name):
    message = MALFORMED[name][1]
    result, skipped = (launched_jobs[job] for job in MALFORMED_JOBS[name])
    assert result.returncode == 2, result.stdout() + result.stderr()
    assert "train.txt" in result.stderr() and message in result.stderr(), result.stderr()
    assert "Traceback" not in result.stderr()

    assert skipped.returncode == 0, skipped.stderr()
    assert "skipped 1 malformed lines" in skipped.stdout()


def test_missing_and_empty_files_give_a_clear_error(launched_jobs):
    missing, empty = launched_jobs[MISSING], launched_jobs[EMPTY]
    assert missing.returncode == 2 and "nope.txt" in missing.stderr()
    assert "Traceback" not in missing.stderr()
    assert empty.returncode == 2 and "empty.txt" in empty.stderr() and "empty" in empty.stderr()
    assert "Traceback" not in empty.stderr()


def test_resume_of_a_finished_run_reports_its_result(launched_jobs):
    first = launched_jobs[CHECKPOINTED_RUN]
    assert first.returncode == 0, first.stderr()
    final = [line for line in first.stdout().splitlines() if line.startswith("final test AUC")]
    path = launched_jobs.path(f"{CRITEO_DIR}/train.txt")
    checkpoint_dir = launched_jobs.path(f"{CRITEO_DIR}/ckpt")
    with open(path, "a") as stream:  # the data changes: its cached vocabulary is recounted,
        stream.write(path.read_text().splitlines(keepends=True)[0])  # the run keeps its own
    again = launch(*[flag.format(dir=launched_jobs.directory) for flag in CHECKPOINTED_FLAGS],
                   "--resume")
    assert again.returncode == 0, again.stderr
    assert "the run finished its 1 epochs at global step 10; nothing left to do" in again.stdout
    assert final and final[0] in again.stdout.splitlines(), again.stdout
    assert "resumed from" not in again.stdout
    assert f"vocabulary: the resumed run's own, {checkpoint_dir}/vocabulary.parquet" in again.stdout
    assert "counting the categorical values" not in again.stdout


@pytest.mark.parametrize("verbose", [False, True])
def test_tensorflow_start_up_lines_hidden_unless_verbose_tf(tmp_path, verbose):
    path = _criteo_file(tmp_path / "train.txt")
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    done = subprocess.run(
        [sys.executable, "-m", "launch.build_vocab", "--format=criteo", f"--input={path}",
         f"--output={tmp_path}/v.json", *(["--verbose_tf"] if verbose else [])],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    # A line of TensorFlow's C++ log ("I0000 00:00:17... cudart_stub.cc:31] ..."): which ones it
    # writes depends on the machine (oneDNN's only where TensorFlow turns it on).
    tf_log_line = re.search(r"^[IWE]\d{4} \d\d:\d\d:[\d.]+ +\d+ [\w.]+:\d+\] ", done.stderr, re.M)
    assert bool(tf_log_line) == verbose, done.stderr
    assert ("cuInit" in done.stderr) == (verbose and "cuInit" in done.stderr)
    if not verbose:
        assert done.stderr == "", done.stderr
