"""The two engines train the same model: each launcher path (every exchange, row-sharded,
stale and dynamic tables, mixed precision with loss scaling, CowClip, CAME) runs with fixed
seeds in float32 math under horovodrun and under tfscale.run (TensorFlow's collective runtime),
and the checkpoints they end with hold the same values to 1e-6 relative at 2 ranks (the per-rank
state of the top-k exchanges and staleness queues included): a sum of two gradients is the same
whichever rank adds it. At 4 ranks each engine's ring adds the ranks' gradients in its own
order, so their sums differ in the last float32 bits and the runs drift apart by rounding alone:
held to 1e-4 relative (1e-7 absolute). CAME is held to the same at 2 ranks: its factored
statistics of one-column weights (the [n, 1] output kernels) come out one or two float32 ulps
apart at the first step (its gradients are the same: the other optimizers' runs, fed the same
gradients, are equal), and its normalisation carries that on; the two processes run the same
Python, so the difference lies in how TensorFlow compiles and threads the step around the
collectives. Half-precision tables are held to one unit in their last place (rtol 1e-2, atol
1e-4): a gradient one float32 ulp apart can flip a stochastic rounding. A run stopped on one engine resumes on the other and ends where an uninterrupted
run ends; a 2-rank run resumes on TensorFlow's engine at 4 ranks."""

import json

import numpy as np
import pytest

from tests import grouped_launches
from tests.grouped_launches import ENGINES, on_engine
from tests.run_outputs import checkpoint_values

SMALL = ["--train_rows=3072", "--test_rows=512", "--synthetic_vocabulary_scale=0.002",
         "--dnn_units=16,16", "--batch_size=256", "--epochs=1", "--logdir=none",
         "--log_every_steps=4", "--deterministic"]
PARITY_DIR = "{dir}/parity/{engine}"
# path name: (ranks, the flags beside SMALL)
ROUNDING_APART = {"rtol": 1e-4, "atol": 1e-7}
HALF_PRECISION = {"rtol": 1e-2, "atol": 1e-4}
TOLERANCE = {"came": ROUNDING_APART, "gtopk_4": ROUNDING_APART, "dynamic_4": ROUNDING_APART,
             "rowwise_bfloat16_dynamic": HALF_PRECISION,
             "rowwise_float16_row_stale": HALF_PRECISION,
             "adam_bfloat16_replicated": HALF_PRECISION}
PATHS = {
    "allgather": (2, ["--optimizer=adam"]),
    "cowclip": (2, ["--optimizer=cowclip"]),
    "came": (2, ["--optimizer=came"]),
    "topk": (2, ["--optimizer=adam", "--embedding_comm=topk", "--density=0.01"]),
    "gtopk_4": (4, ["--optimizer=adam", "--embedding_comm=gtopk", "--density=0.01"]),
    "row_sharded": (2, ["--optimizer=adam", "--embedding_sharding=row"]),
    "row_sharded_bf16_wire": (2, ["--optimizer=adam", "--embedding_sharding=row",
                                  "--sharded_wire_dtype=bfloat16"]),
    "stale": (2, ["--optimizer=adam", "--embedding_staleness=2"]),
    "dynamic": (2, ["--optimizer=adam", "--embedding_sharding=dynamic"]),
    "dynamic_4": (4, ["--optimizer=adam", "--embedding_sharding=dynamic"]),
    "loss_scaled": (2, ["--optimizer=adam", "--precision=float32", "--loss_scale=dynamic"]),
    # Half-precision tables: rows rounded stochastically from the same seed on either engine.
    "rowwise_bfloat16_dynamic": (2, ["--optimizer=rowwise_adagrad", "--table_dtype=bfloat16",
                                     "--embedding_sharding=dynamic",
                                     "--embedding_learning_rate=0.02"]),
    "rowwise_float16_row_stale": (2, ["--optimizer=rowwise_adagrad", "--table_dtype=float16",
                                      "--embedding_sharding=row", "--embedding_staleness=2",
                                      "--embedding_learning_rate=0.02"]),
    "adam_bfloat16_replicated": (2, ["--optimizer=adam", "--table_dtype=bfloat16"]),
}
JOBS = {path: grouped_launches.launcher_job(
    f"parity-{path}", ranks, *SMALL, *flags, f"--checkpoint_dir={PARITY_DIR}/{path}",
    engines=ENGINES, timeout=120) for path, (ranks, flags) in PATHS.items()}

# Stopped after 5 of 12 steps on one engine at 2 ranks and resumed on the other at 2, against
# the uninterrupted 2-rank run; and resumed on TensorFlow's engine at 4 ranks (row-sharded
# tables: their rows move between ranks when the number of ranks changes).
RESUME = ["--optimizer=adam", "--embedding_sharding=row"]
STOPPED = {engine: grouped_launches.launcher_job(
    f"parity-stopped-{engine}", 2, *SMALL, *RESUME, "--stop_after_steps=5",
    f"--checkpoint_dir={{dir}}/parity/resume-from-{engine}", engines=(engine,))
    for engine in ENGINES}
RESUMED = {engine: grouped_launches.launcher_job(
    f"parity-resumed-from-{engine}", 2, *SMALL, *RESUME, "--resume",
    f"--checkpoint_dir={{dir}}/parity/resume-from-{engine}", stage=1,
    engines=tuple(e for e in ENGINES if e != engine)) for engine in ENGINES}
UNINTERRUPTED = grouped_launches.launcher_job(
    "parity-uninterrupted", 2, *SMALL, *RESUME, "--checkpoint_dir={dir}/parity/uninterrupted")


def stopped_then_resumed_at_4(prefix, flags, directory):
    """Jobs: a 2-rank Horovod run of `flags` stopped after 5 of 12 steps, and its resumption at
    4 ranks on TensorFlow's engine, both writing checkpoint directory `directory`."""
    stopped = grouped_launches.launcher_job(
        f"parity-{prefix}stopped-for-4", 2, *SMALL, *flags, "--stop_after_steps=5",
        f"--checkpoint_dir={directory}")
    resumed = grouped_launches.launcher_job(
        f"parity-{prefix}resumed-at-4", 4, *SMALL, *flags, "--resume",
        f"--checkpoint_dir={directory}", stage=1, engines=("tf",))
    return stopped, resumed


STOPPED_FOR_4, RESUMED_AT_4 = stopped_then_resumed_at_4("", RESUME,
                                                        "{dir}/parity/resume-at-4")
# The same with row-wise Adagrad and bfloat16 dynamic tables (checkpointed by id).
RESUME_HALF = ["--optimizer=rowwise_adagrad", "--table_dtype=bfloat16",
               "--embedding_sharding=dynamic", "--embedding_learning_rate=0.02"]
HALF_STOPPED_FOR_4, HALF_RESUMED_AT_4 = stopped_then_resumed_at_4(
    "half-", RESUME_HALF, "{dir}/parity/half-resume-at-4")


def latest_step(checkpoint_dir):
    """The directory of the last checkpoint written to `checkpoint_dir`."""
    return checkpoint_dir / (checkpoint_dir / "latest").read_text().strip()


def assert_same_values(mine, theirs, rtol=1e-6, atol=1e-9):
    """Every value of `mine` and `theirs` (checkpoint_values) equal: integers exactly, floats to
    `rtol` relative (`atol` for values near zero)."""
    assert sorted(mine) == sorted(theirs)
    for name, value in mine.items():
        value = np.asarray(value)
        if value.dtype.kind == "f":
            np.testing.assert_allclose(value, theirs[name], rtol=rtol, atol=atol, err_msg=name)
        else:
            np.testing.assert_array_equal(value, theirs[name], err_msg=name)


@pytest.mark.parametrize("path", sorted(PATHS))
def test_both_engines_end_with_the_same_weights(launched_jobs, path):
    directories = {}
    for engine in ENGINES:
        job = launched_jobs[on_engine(JOBS[path], engine)]
        assert job.returncode == 0, job.output
        assert f"({engine} engine)" in job.output, job.output
        directories[engine] = launched_jobs.path(PARITY_DIR.replace("{engine}", engine)
                                                 + f"/{path}")
    progress = [json.loads((latest_step(directories[e]) / "progress.json").read_text())
                for e in ENGINES]
    assert progress[0]["global_step"] == progress[1]["global_step"] > 0
    assert_same_values(checkpoint_values(directories["tf"]),
                       checkpoint_values(directories["horovod"]), **TOLERANCE.get(path, {}))


@pytest.mark.parametrize("engine", ENGINES)
def test_a_run_stopped_on_one_engine_resumes_on_the_other(launched_jobs, engine):
    other = next(e for e in ENGINES if e != engine)
    stopped = launched_jobs[on_engine(STOPPED[engine], engine)]
    assert stopped.returncode == 0, stopped.output
    resumed = launched_jobs[on_engine(RESUMED[engine], other)]
    assert resumed.returncode == 0, resumed.output
    assert f"2 ranks ({other} engine)" in resumed.output, resumed.output
    uninterrupted = launched_jobs[UNINTERRUPTED]
    assert uninterrupted.returncode == 0, uninterrupted.output
    assert_same_values(
        checkpoint_values(launched_jobs.path(f"{{dir}}/parity/resume-from-{engine}")),
        checkpoint_values(launched_jobs.path("{dir}/parity/uninterrupted")))


def test_a_horovod_run_resumes_on_tensorflows_engine_at_4_ranks(launched_jobs):
    assert launched_jobs[STOPPED_FOR_4].returncode == 0, launched_jobs[STOPPED_FOR_4].output
    resumed = launched_jobs[on_engine(RESUMED_AT_4, "tf")]
    assert resumed.returncode == 0, resumed.output
    assert "4 ranks (tf engine)" in resumed.output, resumed.output
    step_dir = latest_step(launched_jobs.path("{dir}/parity/resume-at-4"))
    assert json.loads((step_dir / "progress.json").read_text())["global_step"] == 12
    assert len(list(step_dir.glob("*.npz"))) == 4  # each of the 4 ranks' rows


def test_half_precision_dynamic_tables_resume_at_4_ranks(launched_jobs):
    stopped = launched_jobs[HALF_STOPPED_FOR_4]
    assert stopped.returncode == 0, stopped.output
    resumed = launched_jobs[on_engine(HALF_RESUMED_AT_4, "tf")]
    assert resumed.returncode == 0, resumed.output
    step_dir = latest_step(launched_jobs.path("{dir}/parity/half-resume-at-4"))
    assert json.loads((step_dir / "progress.json").read_text())["global_step"] == 12
    files = sorted(step_dir.glob("dynamic-*-of-4.npz"))
    assert len(files) == 4
    with np.load(files[0]) as arrays:  # the tables kept as bfloat16 (stored as their bits)
        tables = [name for name in arrays.files if name.endswith("/embeddings@bfloat16")]
        assert len(tables) == 2 and all(arrays[name].dtype == np.uint16 for name in tables)
