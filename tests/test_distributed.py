"""Horovod data parallelism (tfscale.distributed): 2 ranks at batch B/2 train to the weights of
1 process at batch B, ranks stay bitwise identical, the dense embedding exchange trains to the
allgather's weights (and is refused with CowClip), an inf on one rank (in its dense features,
or in its embedding gradients alone) makes every rank skip the step, online training day by day
scores whole days and resumes on 2 ranks, a dead rank ends the job (replicated and row-sharded
tables), the ranks' evaluation equals one pass over the whole split, and the launcher trains on a
Criteo file under horovodrun with rank 0 alone reporting and writing, and stops and resumes
bitwise; single-process runs never import Horovod."""

import glob
import json
import os
import pathlib
import re
import shlex
import subprocess
import sys

import numpy as np
import pytest

from tests import grouped_launches
from tests.horovod_launch import (REPO_ROOT, horovodrun_command, horovodrun_side_by_side,
                                  side_by_side, tfscale_run_command)
from tests.multiworker import data_parallel_steps, loss_scale_skip, progressive_days
from tests.multiworker.data_parallel_steps import load_state
from tests.run_outputs import checkpoint_values, train_scalars
from tfscale.data.synthetic import SyntheticCTR
from tfscale.errors import UserError

# 6400 rows / 2 shards / 128 per rank = 25 steps per epoch.
SMALL_RUN = ["--train_rows=6400", "--test_rows=2000",
             "--synthetic_vocabulary_scale=0.002", "--dnn_units=32,32", "--batch_size=256",
             "--log_every_steps=10", "--checkpoint_every_steps=10"]


# The launched runs exchange embedding gradients by gTop-k: each rank then has its own
# error-feedback residuals (936 of 187,199 rows a step, fewer than a rank's batch touches: the
# rest wait in them), which checkpoints gather and a resume hands back.
GTOPK_FLAGS = ["--optimizer=adam", "--embedding_comm=gtopk", "--density=0.005"]


TWO_RANK_DIR, ONE_PROCESS_DIR = "{dir}/distributed/two_ranks", "{dir}/distributed/one_process"
# The data-parallel runs and the run with an inf on one rank, on 2 ranks; the one-process
# references, trained in a fresh process like the ranks (not in pytest's, where earlier tests
# have run).
DATA_PARALLEL = grouped_launches.job("data-parallel-steps", 2,
                                     "tests.multiworker.data_parallel_steps", TWO_RANK_DIR)
# The loss scaler's agreed skip on each engine, each writing to its own directory.
SKIP_DIRS = {"horovod": TWO_RANK_DIR, "tf": "{dir}/distributed/two_ranks_tf"}
LOSS_SCALE_SKIP = {engine: grouped_launches.job(
    f"loss-scale-skip-{engine}", 2, "tests.multiworker.loss_scale_skip", directory,
    engines=(engine,)) for engine, directory in SKIP_DIRS.items()}
PROGRESSIVE_DAYS = grouped_launches.job("progressive-days", 2,
                                        "tests.multiworker.progressive_days", TWO_RANK_DIR)
ONE_PROCESS = grouped_launches.job("data-parallel-reference", 1,
                                   "tests.multiworker.data_parallel_steps", ONE_PROCESS_DIR)


@pytest.fixture(scope="module")
def two_rank_dir(launched_jobs):
    """The output directory of the 2-rank data-parallel runs."""
    job = launched_jobs[DATA_PARALLEL]
    assert job.returncode == 0, job.output
    return launched_jobs.path(TWO_RANK_DIR)


@pytest.fixture(scope="module")
def two_rank_states(two_rank_dir):
    return {(name, exchange, staleness, rank):
            load_state(two_rank_dir / f"{name}-{exchange}-stale{staleness}-rank{rank}.npz")
            for name, exchange, staleness in data_parallel_steps.RUNS for rank in (0, 1)}


@pytest.fixture(scope="module")
def one_process_states(launched_jobs):
    job = launched_jobs[ONE_PROCESS]
    assert job.returncode == 0, job.output
    out_dir = launched_jobs.path(ONE_PROCESS_DIR)
    return {(name, staleness, part): load_state(
                out_dir / f"{name}-allgather-stale{staleness}-reference{part}.npz")
            for name, exchange, staleness in data_parallel_steps.RUNS if exchange == "allgather"
            for part in ("", "-initial")}


@pytest.mark.parametrize("staleness", [0, 1])
@pytest.mark.parametrize("optimizer", data_parallel_steps.OPTIMIZERS)
def test_two_ranks_at_half_batch_match_one_process_at_full_batch(two_rank_states,
                                                                 one_process_states, optimizer,
                                                                 staleness):
    """With de-duplicated lookups (the default): each rank's unique rows and, for CowClip, their
    counts, summed over the ranks, are the global batch's."""
    expected = one_process_states[(optimizer, staleness, "")]
    actual = two_rank_states[(optimizer, "allgather", staleness, 0)]
    assert len(actual) == len(expected)
    for i, (want, got) in enumerate(zip(expected, actual)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=f"variable {i}")
    initial = one_process_states[(optimizer, staleness, "-initial")]
    model_variables = len(data_parallel_steps.compiled_model(
        data_parallel_steps.source().schema, "adam").variables)
    unmoved = [i for i, (a, b) in enumerate(zip(expected[:model_variables], initial))
               if np.array_equal(a, b)]
    assert not unmoved, unmoved  # every variable of the model was trained


def test_two_rank_evaluation_equals_one_pass_on_the_same_weights(two_rank_dir):
    """Each rank scores its shard of the test split and the AUC is the union's: the same as
    rank 0 alone scoring the whole split with the same (bitwise identical) weights."""
    for rank in (0, 1):
        (gathered, alone) = np.load(two_rank_dir / f"adam-allgather-stale0-rank{rank}"
                                                   "-evaluations.npy")
        assert gathered[2] == alone[2] == data_parallel_steps.source().test_rows
        np.testing.assert_allclose(gathered[:2], alone[:2], rtol=0, atol=1e-6)


@pytest.mark.parametrize("optimizer, exchange, staleness", data_parallel_steps.RUNS)
def test_ranks_end_bitwise_identical(two_rank_states, optimizer, exchange, staleness):
    for i, (rank0, rank1) in enumerate(zip(two_rank_states[(optimizer, exchange, staleness, 0)],
                                           two_rank_states[(optimizer, exchange, staleness, 1)])):
        np.testing.assert_array_equal(rank0, rank1, err_msg=f"variable {i}")


def test_dense_embedding_exchange_trains_to_the_allgathers_weights(two_rank_states):
    allgather = two_rank_states[("adam", "allgather", 0, 0)]
    dense = two_rank_states[("adam", "dense", 0, 0)]
    assert len(dense) == len(allgather)
    for i, (want, got) in enumerate(zip(allgather, dense)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=f"variable {i}")


def test_dense_embedding_exchange_is_refused_with_cowclip():
    data = data_parallel_steps.source()
    with pytest.raises(UserError, match=r"`embedding_exchange=dense` cannot be used with "
                                        r"CowClip"):
        data_parallel_steps.compiled_model(data.schema, data_parallel_steps.make_optimizer(
            "cowclip"), embedding_exchange="dense")


@pytest.mark.parametrize("engine", grouped_launches.ENGINES)
def test_inf_on_one_rank_skips_the_step_on_every_rank(launched_jobs, engine):
    job = launched_jobs[grouped_launches.on_engine(LOSS_SCALE_SKIP[engine], engine)]
    assert job.returncode == 0, job.output
    ranks = [np.load(launched_jobs.path(SKIP_DIRS[engine]) / f"rank{rank}.npz")
             for rank in (0, 1)]
    for saved in ranks:
        assert int(saved["skipped_steps"]) == 1
        assert float(saved["scale"]) == loss_scale_skip.INITIAL_SCALE / 2
    names = [k for k in ranks[0] if k.startswith("arr_")]
    assert names
    for name in names:
        np.testing.assert_array_equal(ranks[0][name], ranks[1][name], err_msg=name)


@pytest.mark.parametrize("engine", grouped_launches.ENGINES)
def test_inf_on_one_rank_in_its_embedding_gradients_only_skips_the_step_on_every_rank(
        launched_jobs, engine):
    """Rank 1's table gradients alone are inf (its dense ones finite) and CowClip takes the
    gathered rows with their counts: both ranks skip that step, halve the scale, leave every
    model and optimizer variable as it was over it, and train the other steps."""
    job = launched_jobs[grouped_launches.on_engine(LOSS_SCALE_SKIP[engine], engine)]
    assert job.returncode == 0, job.output
    ranks = [np.load(launched_jobs.path(SKIP_DIRS[engine]) / f"embedding-rank{rank}.npz")
             for rank in (0, 1)]
    skipped_by_step = [int(i >= loss_scale_skip.BAD_STEP) for i in range(loss_scale_skip.STEPS)]
    for saved in ranks:
        assert saved["skipped_by_step"].tolist() == skipped_by_step
        assert float(saved["scale"]) == loss_scale_skip.INITIAL_SCALE / 2
        assert int(saved["iterations"]) == loss_scale_skip.STEPS - 1
        assert saved["changed"].tolist() == []
    names = [k for k in ranks[0] if k.startswith("arr_")]
    assert names
    for name in names:
        assert np.isfinite(ranks[0][name]).all(), name
        np.testing.assert_array_equal(ranks[0][name], ranks[1][name], err_msg=name)


def test_two_ranks_train_day_by_day_and_resume(launched_jobs):
    """Each rank trains on its shard of each day; a day's progressive validation covers every
    row of it (the ranks' shards gathered) and, after a resume on both ranks, equals one
    process's evaluation of the model the first run left."""
    job = launched_jobs[PROGRESSIVE_DAYS]
    assert job.returncode == 0, job.output
    two_rank_dir = launched_jobs.path(TWO_RANK_DIR)
    ranks = [np.load(two_rank_dir / f"progressive-rank{rank}.npz") for rank in (0, 1)]
    names = [k for k in ranks[0] if k.startswith("arr_")]
    assert names
    for name in names:
        np.testing.assert_array_equal(ranks[0][name], ranks[1][name], err_msg=name)
    for saved in ranks:
        resumed = saved["resumed"]  # day, auc, logloss, examples, steps
        np.testing.assert_array_equal(resumed[:, 0], [1, 2, 3])
        np.testing.assert_array_equal(resumed[:, 3:], [[progressive_days.ROWS_PER_DAY, 6]] * 3)
        np.testing.assert_array_equal(resumed[:1], saved["first"])
        np.testing.assert_allclose(resumed[1, 1:4], saved["day_2_alone"], rtol=0, atol=1e-6)
        assert int(saved["global_step"]) == 18
    np.testing.assert_array_equal(ranks[0]["resumed"], ranks[1]["resumed"])


SHARDINGS = ("replicated", "row")


def _unlaunched_ranks_command(num_ranks, args, port):
    """A shell command starting `python ARGS` as `num_ranks` processes of TensorFlow's engine by
    hand (each its TF_CONFIG, no launcher to stop the others), their output prefixed with their
    rank, that waits for all of them and exits with rank 0's status."""
    workers = [f"localhost:{port + rank}" for rank in range(num_ranks)]
    starts = []
    for rank in range(num_ranks):
        config = json.dumps({"cluster": {"worker": workers},
                             "task": {"type": "worker", "index": rank}})
        starts.append(f"TF_CONFIG={shlex.quote(config)} {shlex.quote(sys.executable)} "
                      f"{' '.join(map(shlex.quote, args))} 2>&1 | sed 's/^/[{rank}]/' &")
    return ["bash", "-c", "set -o pipefail; " + " ".join(starts[1:]) + " "
            + starts[0].rstrip("& ") + "; status=$?; wait; exit $status"]


@pytest.fixture(scope="module")
def killed_rank_launches():
    """{(launcher, sharding): CompletedProcess} of the 2-rank launches in which rank 1 kills
    itself, with replicated and with row-sharded tables, under horovodrun, under tfscale.run,
    and as two processes of TensorFlow's engine started by hand (no launcher ends rank 0: its
    engine must), side by side."""
    commands = {}
    for i, sharding in enumerate(SHARDINGS):
        args = ["tests/multiworker/rank_dies.py", sharding]
        commands["horovodrun", sharding] = horovodrun_command(2, args)
        commands["tfscale.run", sharding] = tfscale_run_command(2, args)
        commands["by hand", sharding] = _unlaunched_ranks_command(2, args, 29700 + 10 * i)
    return dict(zip(commands, side_by_side(list(commands.values()), timeout=300)))


# What names the dead rank: horovodrun, tfscale.run, or rank 0's own error on TensorFlow's engine.
NAMES_THE_DEAD_RANK = {"horovodrun": "Process name: 1",
                       "tfscale.run": "tfscale.run: rank 1 exited with status -9 (SIGKILL)",
                       "by hand": "lost rank 1"}


@pytest.mark.parametrize("launcher", sorted(NAMES_THE_DEAD_RANK))
@pytest.mark.parametrize("sharding", SHARDINGS)
def test_a_killed_rank_ends_the_job_with_an_error(killed_rank_launches, sharding, launcher):
    result = killed_rank_launches[launcher, sharding]
    killed = re.search(r"rank 1: killing itself at ([0-9.]+)", result.stdout)
    assert killed, result.stdout
    assert result.returncode != 0, result.stdout
    assert NAMES_THE_DEAD_RANK[launcher] in result.stdout, result.stdout
    # Timed from the kill, not from the start: start-up on a loaded machine is not the point.
    after_kill = result.ended - float(killed.group(1))
    assert after_kill < 60, f"the job ended {after_kill:.0f} s after the kill"


CRITEO_FILE, LAUNCHED_DIR = "{dir}/distributed/criteo.txt", "{dir}/distributed/launched"
# A 2-rank run on a Criteo-format file of 7,112 lines (10% held out by line hash: 729 test lines,
# 6,383 training lines, 24 steps of 2 x 128), whose vocabulary both ranks count (each its share)
# and rank 0 caches on first use.
CRITEO_RUN = ["--data=criteo", f"--train_path={CRITEO_FILE}", "--dnn_units=32,32",
              "--batch_size=256", "--log_every_steps=10", "--checkpoint_every_steps=10",
              *GTOPK_FLAGS, "--gradient_compression=fp16"]
# The whole run with logs and checkpoints; one stopped after step 17, resumed in a later launch.
LAUNCHED = grouped_launches.launcher_job("criteo-2-ranks", 2, *CRITEO_RUN,
                                         f"--logdir={LAUNCHED_DIR}/logs",
                                         f"--checkpoint_dir={LAUNCHED_DIR}/ckpt")
STOPPED = grouped_launches.launcher_job("criteo-2-ranks-stopped", 2, *CRITEO_RUN,
                                        "--logdir=none", f"--checkpoint_dir={LAUNCHED_DIR}/split",
                                        "--stop_after_steps=17")
RESUMED = grouped_launches.launcher_job("criteo-2-ranks-resumed", 2, *CRITEO_RUN,
                                        "--logdir=none", f"--checkpoint_dir={LAUNCHED_DIR}/split",
                                        "--resume", stage=1)


@grouped_launches.prepare
def _inputs_and_output_directories(directory):
    path = pathlib.Path(CRITEO_FILE.format(dir=directory))
    path.parent.mkdir(parents=True, exist_ok=True)
    for out_dir in (*SKIP_DIRS.values(), ONE_PROCESS_DIR):
        pathlib.Path(out_dir.format(dir=directory)).mkdir(parents=True, exist_ok=True)
    SyntheticCTR(seed=0, train_rows=7112, test_rows=10,
                 vocabulary_scale=0.002).write_criteo_tsv(str(path), 0, 7112)


@pytest.fixture(scope="module")
def launched_run(launched_jobs):
    """(stdout, run directory) of the whole 2-rank launcher run with logs and checkpoints."""
    job = launched_jobs[LAUNCHED]
    assert job.returncode == 0, job.output
    return job.output, launched_jobs.path(LAUNCHED_DIR)


def test_launcher_under_horovodrun(launched_run):
    out, run_dir = launched_run
    assert ("2 ranks (horovod engine) at batch 128 each, gradient compression fp16, embedding exchange "
            "gtopk at density 0.005") in out, out
    final_lines = re.findall(r"^\[(\d)\]<stdout>:final test AUC", out, re.MULTILINE)
    assert final_lines == ["0"], out
    assert "counted in" in out and "on 729 examples; trained 24 steps" in out, out
    assert not re.search(r"^\[1\]<stdout>:", out, re.MULTILINE), out
    # One writer of each kind: rank 0's (a second rank would add its own event files).
    for split in ("train", "test"):
        assert len(glob.glob(f"{run_dir}/logs/{split}/events.out.tfevents.*")) == 1
    # run.json, vocabulary.parquet, trained_predictions.json: rank 0's
    assert sorted(os.listdir(f"{run_dir}/ckpt")) == [
        "latest", "run.json", "step-0000000020", "step-0000000024", "trained_predictions.json",
        "vocabulary.parquet"]
    # Bytes of the gradient exchange per step in TensorBoard (dense allreduce and gTop-k rounds).
    scalars = train_scalars(f"{run_dir}/logs")
    assert scalars["exchange/bytes_sent"] > 0 and scalars["exchange/bytes_received"] > 0, scalars
    # The start-up line on the residuals: rank 0's, as they are in its checkpoint.
    residuals = [value for name, value in checkpoint_values(f"{run_dir}/ckpt").items()
                 if name.startswith("per_rank/residual/") and name.endswith("@rank0")]
    assert len(residuals) == 2, residuals  # the deep and the wide table
    rows = sum(value.shape[0] for value in residuals)
    megabytes = sum(value.astype(np.float32).nbytes for value in residuals) / 1e6
    assert (f"[0]<stdout>:gtopk error-feedback residuals: {rows:,} table rows, {megabytes:,.1f} "
            "MB float32 per rank, every row passed over each step") in out, out


def test_resumed_two_rank_run_equals_uninterrupted_one(launched_run, launched_jobs):
    """On the Criteo file; the resumed run reads the vocabulary its checkpoints recorded."""
    stopped = launched_jobs[STOPPED]
    assert stopped.returncode == 0, stopped.output
    # Rank 0 restores step 10 and broadcasts its variables and position to rank 1.
    resumed = launched_jobs[RESUMED]
    assert resumed.returncode == 0, resumed.output
    assert "resumed from global step 10: epoch 1, batch 10" in resumed.output, resumed.output
    expected = checkpoint_values(f"{launched_run[1]}/ckpt")
    actual = checkpoint_values(f"{launched_run[1]}/split")
    assert expected.keys() == actual.keys()
    residuals = [name for name in expected
                 if name.startswith("per_rank/residual/") and name.endswith("@rank0")]
    assert len(residuals) == 2, list(expected)  # the deep and the wide table
    for name in residuals:  # one array per rank, and the ranks' residuals differ
        other = name.replace("@rank0", "@rank1")
        assert expected[name].any() and other in expected, name
        assert not np.array_equal(expected[name], expected[other]), name
    for name in expected:
        np.testing.assert_array_equal(expected[name], actual[name], err_msg=name)


USER_ERRORS = [
    (["--batch_size=255", "--checkpoint_dir=none"],
     "--batch_size=255 is the global batch and must divide evenly over the 2 ranks"),
    (["--checkpoint_dir={run_dir}/ckpt"], "already holds a checkpoint"),  # found by rank 0 only
]


@pytest.fixture(scope="module")
def user_error_launches(launched_run):
    """The CompletedProcesses of 2-rank launcher runs with each of USER_ERRORS' flags, side by
    side."""
    return horovodrun_side_by_side(2, [
        ["-m", "launch.train", *SMALL_RUN, "--logdir=none",
         *[flag.format(run_dir=launched_run[1]) for flag in flags]]
        for flags, _ in USER_ERRORS])


@pytest.mark.parametrize("case", range(len(USER_ERRORS)),
                         ids=[message for _, message in USER_ERRORS])
def test_launcher_user_errors_stop_every_rank_cleanly(user_error_launches, case):
    result, message = user_error_launches[case], USER_ERRORS[case][1]
    assert result.returncode != 0
    # Every rank raises the error; the first to exit makes horovodrun end the others, which may
    # not have printed it yet.
    assert re.search(r"^\[\d\]<stderr>:error: .*" + re.escape(message), result.stdout,
                     re.MULTILINE), result.stdout
    assert not re.search(r"^\[\d\]<stderr>:Traceback", result.stdout, re.MULTILINE), result.stdout


def test_single_process_training_never_imports_horovod():
    script = ("import sys, models\n"
              "from tfscale.data.synthetic import SyntheticCTR\n"
              "from tfscale.training.evaluation import evaluate_exact\n"
              "source = SyntheticCTR(seed=0, train_rows=512, test_rows=256, "
              "vocabulary_scale=0.002)\n"
              "model = models.build_model('deepfm', source.schema, hidden_units=[8])\n"
              "model.compile(optimizer='adam', loss='binary_crossentropy')\n"
              "model.fit(source.train_batches(256), verbose=0)\n"
              "evaluate_exact(model, source.test_batches(256))\n"
              "assert not [m for m in sys.modules if m.startswith('horovod')]\n")
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT,
                            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stdout
