"""End to end through `python -m launch.train`: a few hundred training steps with progress,
evaluation, TensorBoard event files and checkpoints; a stopped-and-resumed run ending with
bitwise the same weights as an uninterrupted one; bad input ending in a one-paragraph error."""

import glob
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from tests.horovod_launch import REPO_ROOT, python_side_by_side

# A small DeepFM on a small synthetic set, so a few hundred steps take seconds.
# CowClip given: on the built-in data the launcher's default is Adam with sqrt scaling.
SMALL_RUN = ["--train_rows=40000", "--test_rows=8000", "--synthetic_vocabulary_scale=0.002",
             "--dnn_units=64,64", "--batch_size=256", "--log_every_steps=50", "--optimizer=cowclip"]


def launch(*flags, timeout=300):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.run([sys.executable, "-m", "launch.train", *flags], cwd=REPO_ROOT, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          timeout=timeout)


def launch_side_by_side(*flag_lists, timeout=300):
    """The CompletedProcesses of `python -m launch.train FLAGS` for each of `flag_lists`, run as
    concurrent processes (independent runs, one per core)."""
    return python_side_by_side([["-m", "launch.train", *flags] for flags in flag_lists],
                               timeout=timeout, separate_stderr=True)


def checkpoint_values(checkpoint_dir):
    """{name: array} of every value in the newest checkpoint of a CheckpointStore directory:
    the tables' files' under "<file>/<variable path>", the per-rank state (per_rank.npz) under
    "per_rank/<name>"."""
    with open(os.path.join(checkpoint_dir, "latest")) as f:
        step_dir = os.path.join(checkpoint_dir, f.read().strip())
    reader = tf.train.load_checkpoint(os.path.join(step_dir, "state"))
    values = {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()
              if not name.startswith("_CHECKPOINTABLE_OBJECT_GRAPH")}
    for path in glob.glob(os.path.join(step_dir, "*.npz")):
        prefix = os.path.basename(path).removesuffix(".npz")
        with np.load(path) as stored:
            values.update({f"{prefix}/{name}": stored[name] for name in stored.files})
    return values


def train_scalars(logdir):
    """{tag: last value} of the TensorBoard scalars in `logdir`/train (one event file)."""
    events, = glob.glob(f"{logdir}/train/events.out.tfevents.*")
    return {value.tag: float(tf.make_ndarray(value.tensor))
            for event in tf.compat.v1.train.summary_iterator(events)
            for value in event.summary.value}


def test_training_run_reports_auc_and_writes_logs_and_checkpoints(tmp_path):
    result = launch(*SMALL_RUN, "--epochs=2", f"--logdir={tmp_path}/logs",
                    f"--checkpoint_dir={tmp_path}/ckpt", "--checkpoint_every_steps=100")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "examples/s" in out
    assert "epoch 2/2: test AUC" in out
    final = [line for line in out.splitlines() if line.startswith("final test AUC")]
    assert final, out
    auc = float(final[0].split()[3].rstrip(","))
    ceiling = float(final[0].split("teacher ceiling: AUC ")[1].split(",")[0])
    assert 0.6 < auc < ceiling + 0.01, final[0]  # learned something, and no better than the teacher
    # 2 epochs of 156 steps: checkpoints at steps 100, 200, 300 and epoch ends; the newest 2 kept.
    steps = sorted(os.path.basename(d) for d in glob.glob(f"{tmp_path}/ckpt/step-*"))
    assert steps == ["step-0000000300", "step-0000000312"], steps
    train_events = glob.glob(f"{tmp_path}/logs/train/events.out.tfevents.*")
    test_events = glob.glob(f"{tmp_path}/logs/test/events.out.tfevents.*")
    assert train_events and test_events
    tags = {value.tag for event in tf.compat.v1.train.summary_iterator(train_events[0])
            for value in event.summary.value}
    assert {"loss", "auc", "examples_per_second", "step_time_seconds", "learning_rate/dense",
            "learning_rate/embedding"} <= tags, tags
    table = "cowclip/deepfm/field_embedding/deep_embedding/embeddings"
    assert {f"{table}/clipped_fraction", f"{table}/mean_clip_factor"} <= tags, tags


def _has_cowclip_state(values):
    """The embedding optimizer's moments of the tables, in the tables' file."""
    return any(name.startswith("tables-0-of-1/embedding/") and name.endswith("_momentum")
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
@pytest.mark.parametrize("flags, has_its_state", [
    (["--optimizer=came", "--embedding_update=dense"], _has_came_state),
    (["--precision=mixed_float16", "--loss_scale_growth_steps=5"], _has_loss_scale_state),
], ids=["came", "cowclip-float16"])
def test_stopped_and_resumed_run_equals_uninterrupted_run(tmp_path, flags, has_its_state):
    common = [*SMALL_RUN, "--train_rows=12800", "--epochs=2", "--checkpoint_every_steps=15",
              "--logdir=none", *flags]
    # The uninterrupted run, and one that stops at step 37 (mid-epoch 1): its newest checkpoint
    # is step 30, so 7 steps are redone.
    whole, first = launch_side_by_side(
        [*common, f"--checkpoint_dir={tmp_path}/whole"],
        [*common, f"--checkpoint_dir={tmp_path}/split", "--stop_after_steps=37"])
    assert whole.returncode == 0, whole.stderr
    warns = "warning: --precision=mixed_float16 with no GPU" in whole.stdout
    assert warns == ("--precision=mixed_float16" in flags
                     and not tf.config.list_physical_devices("GPU")), whole.stdout
    assert first.returncode == 0, first.stderr
    assert "stopped after global step 37" in first.stdout
    second = launch(*common, f"--checkpoint_dir={tmp_path}/split", "--resume")
    assert second.returncode == 0, second.stderr
    resumed = re.search(r"resumed from global step 30: epoch 1, batch (\d+)", second.stdout)
    assert resumed, second.stdout
    if "--precision=mixed_float16" in flags:
        # The first steps at scale 2^15 overflow and are skipped: batches, not optimizer steps.
        assert int(resumed.group(1)) > 30
    else:
        assert int(resumed.group(1)) == 30

    expected, actual = checkpoint_values(f"{tmp_path}/whole"), checkpoint_values(f"{tmp_path}/split")
    assert expected.keys() == actual.keys()
    weight_names = [n for n in expected if "embedding" in n or "kernel" in n]
    assert weight_names
    assert has_its_state(expected), {name: value.shape for name, value in expected.items()}
    for name in expected:
        np.testing.assert_array_equal(expected[name], actual[name], err_msg=name)


def test_refuses_to_overwrite_a_run_without_resume(criteo_checkpointed_run):
    _, flags, checkpoint_dir, _ = criteo_checkpointed_run
    again = launch(*flags)
    assert again.returncode == 2
    assert f"--checkpoint_dir={checkpoint_dir} already holds a checkpoint" in again.stderr
    assert "give --resume to continue" in again.stderr and "Traceback" not in again.stderr


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
     "--embedding_sharding=row with --optimizer=adagrad and --embedding_update=dense would "
     "update every rank's shard whole every step with Keras's optimizer; give "
     "--embedding_update=row"),
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


@pytest.fixture(scope="module")
def bad_flag_launches():
    """{flags: the CompletedProcess of launching with them} for every row of BAD_FLAGS, two
    launches at a time side by side."""
    launches = {}
    for first in range(0, len(BAD_FLAGS), 2):
        rows = [flags for flags, _ in BAD_FLAGS[first:first + 2]]
        results = launch_side_by_side(*[[*SMALL_DATA, *flags, "--logdir=none",
                                         "--checkpoint_dir=none"] for flags in rows])
        launches.update(zip(map(tuple, rows), results))
    return launches


@pytest.mark.parametrize("flags, message", BAD_FLAGS)
def test_bad_flags_give_a_clear_error(bad_flag_launches, flags, message):
    result = bad_flag_launches[tuple(flags)]
    assert result.returncode != 0
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_an_unlabelled_test_file_is_refused_before_anything_is_written(tmp_path):
    train_file = _criteo_file(tmp_path / "train.txt")
    unlabelled = tmp_path / "test.txt"  # as Criteo's own test.txt: no label column
    unlabelled.write_text("".join(line.split("\t", 1)[1]
                                  for line in train_file.read_text().splitlines(keepends=True)))
    result = launch(*CRITEO_RUN[:-1], f"--train_path={train_file}", f"--test_path={unlabelled}",
                    f"--checkpoint_dir={tmp_path}/ckpt")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "the test split has no label column" in result.stderr, result.stderr
    assert "give labelled --test_path, or none to hold out --test_fraction" in result.stderr
    assert "Traceback" not in result.stderr and "examples/s" not in result.stdout
    assert not (tmp_path / "ckpt").exists()


def test_library_arguments_are_told_as_flags():
    from launch.user_errors import in_flag_terms

    assert in_flag_terms("`embedding_exchange=\"gtopk\"` with `embedding_staleness=1`; "
                         "give `resume=True` or a `checkpoint_dir`; `unknown_arg=3`") == (
        "--embedding_comm=gtopk with --embedding_staleness=1; give --resume or a "
        "--checkpoint_dir; `unknown_arg=3`")


def _criteo_file(path, lines_to_replace=None):
    """A 3,000-line Criteo-format file from the synthetic generator, with some lines replaced."""
    from tfscale.data.synthetic import SyntheticCTR

    SyntheticCTR(seed=3, train_rows=3000, test_rows=10,
                 vocabulary_scale=0.002).write_criteo_tsv(str(path), 0, 3000)
    lines = path.read_text().splitlines(keepends=True)
    for number, text in (lines_to_replace or {}).items():
        lines[number - 1] = text
    path.write_text("".join(lines))
    return path


def _field_missing(line):
    return "\t".join(line.rstrip("\n").split("\t")[:-1]) + "\n"


def _integer_not_numeric(line):
    fields = line.rstrip("\n").split("\t")
    fields[3] = "12x"
    return "\t".join(fields) + "\n"


CRITEO_RUN = ["--data=criteo", "--batch_size=256", "--dnn_units=32", "--hash_buckets=1000",
              "--epochs=1", "--logdir=none", "--checkpoint_dir=none"]


@pytest.fixture(scope="module")
def criteo_checkpointed_run(tmp_path_factory):
    """(training file, flags, checkpoint directory, CompletedProcess) of a whole run on a Criteo
    file with checkpoints."""
    directory = tmp_path_factory.mktemp("criteo_run")
    path = _criteo_file(directory / "train.txt")
    flags = [*CRITEO_RUN[:-1], f"--train_path={path}", f"--checkpoint_dir={directory}/ckpt"]
    return path, flags, f"{directory}/ckpt", launch(*flags)


def test_trains_on_a_criteo_file(criteo_checkpointed_run):
    result = criteo_checkpointed_run[-1]
    assert result.returncode == 0, result.stderr
    assert "final test AUC" in result.stdout


def test_short_line_trains_by_default_and_is_refused_on_request(tmp_path):
    path = tmp_path / "train.txt"
    _criteo_file(path)
    lines = path.read_text().splitlines(keepends=True)
    _criteo_file(path, {3: _field_missing(_field_missing(lines[2])), 1234: _field_missing(lines[1233])})
    result = launch(*CRITEO_RUN, f"--train_path={path}")
    assert result.returncode == 0, result.stderr
    assert "of 2 short lines as missing values (--on_short_line=missing)" in result.stdout
    refused = launch(*CRITEO_RUN, f"--train_path={path}", "--on_short_line=error")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert f"{path} line 3: expected 40 tab-separated fields, found 38 (a line missing only " \
           "trailing fields reads them as missing with --on_short_line=missing)" in refused.stderr
    assert "Traceback" not in refused.stderr


@pytest.mark.parametrize("corrupt, message", [
    (_integer_not_numeric, "line 1234"),
])
def test_malformed_line_names_file_and_line(tmp_path, corrupt, message):
    path = tmp_path / "train.txt"
    _criteo_file(path)
    original = path.read_text().splitlines(keepends=True)[1233]
    _criteo_file(path, {1234: corrupt(original)})
    result = launch(*CRITEO_RUN, f"--train_path={path}")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "train.txt" in result.stderr and message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr

    skipped = launch(*CRITEO_RUN, f"--train_path={path}", "--on_bad_line=skip")
    assert skipped.returncode == 0, skipped.stderr
    assert "skipped 1 malformed lines" in skipped.stdout


def test_missing_and_empty_files_give_a_clear_error(tmp_path):
    (tmp_path / "empty.txt").write_text("")
    missing, empty = launch_side_by_side([*CRITEO_RUN, f"--train_path={tmp_path}/nope.txt"],
                                         [*CRITEO_RUN, f"--train_path={tmp_path}/empty.txt"])
    assert missing.returncode == 2 and "nope.txt" in missing.stderr
    assert "Traceback" not in missing.stderr
    assert empty.returncode == 2 and "empty.txt" in empty.stderr and "empty" in empty.stderr
    assert "Traceback" not in empty.stderr


def test_resume_of_a_finished_run_reports_its_result(criteo_checkpointed_run):
    path, flags, checkpoint_dir, first = criteo_checkpointed_run
    assert first.returncode == 0, first.stderr
    final = [line for line in first.stdout.splitlines() if line.startswith("final test AUC")]
    with open(path, "a") as stream:  # the data changes: its cached vocabulary is recounted,
        stream.write(path.read_text().splitlines(keepends=True)[0])  # the run keeps its own
    again = launch(*flags, "--resume")
    assert again.returncode == 0, again.stderr
    assert "the run finished its 1 epochs at global step 10; nothing left to do" in again.stdout
    assert final and final[0] in again.stdout.splitlines(), again.stdout
    assert "resumed from" not in again.stdout
    assert f"vocabulary: the resumed run's own, {checkpoint_dir}/vocabulary.json" in again.stdout
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
    assert ("oneDNN" in done.stderr) == verbose, done.stderr
    assert ("cuInit" in done.stderr) == (verbose and "cuInit" in done.stderr)
    if not verbose:
        assert done.stderr == "", done.stderr
