"""A user's own Keras model in one process and under horovodrun (docs/own_model.md): the scripts
of examples/ at 1 process and 2 ranks, a 2-rank job of checks on the README's model
(tests/multiworker/own_model_checks.py), and the refusals that need no second rank."""

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfscale
from tests import grouped_launches
from tests.horovod_launch import REPO_ROOT
from tfscale.data import rank_batches
from tfscale.errors import UserError
from tfscale.optimizers import RowSparseAdam

EXAMPLES_DIR = "{dir}/examples"
# Each example's arguments (small data), and how close its 2-rank run must end to its one-process
# run at the same global batch on the same rows: its weights' largest absolute difference, the
# relative (Frobenius) difference of all its weights, and its served scores' largest difference.
# The float32 examples differ only by the order of their float sums (about 1e-8 measured). The
# bfloat16 one rounds its gradients' sums in two orders, and its directions of zero gradient
# (the attention's key biases, whose gradient is rounding noise alone) take CAME's full-size
# normalised steps in different directions: its weights drift apart by up to 0.08 where the
# values reach 0.5 (0.064 relative) and its scores by 0.005 (measured on a 2-vCPU AMD EPYC,
# 28 steps).
EXAMPLES = {
    "criteo_cowclip": (["--train={dir}/examples/train.txt", "--test={dir}/examples/test.txt",
                        "--epochs=2", "--batch_size=1024"],
                       {"largest_difference": 1e-5, "relative_difference": 1e-6,
                        "scores": 1e-5}),
    "subclassed_came_bf16": (["--rows=16000", "--epochs=2", "--batch_size=1024"],
                             {"largest_difference": 0.2, "relative_difference": 0.1,
                              "scores": 0.02}),
    "sharded_stale": (["--rows=24000", "--epochs=2", "--batch_size=2048"],
                      {"largest_difference": 1e-5, "relative_difference": 1e-6,
                       "scores": 1e-5}),
}
ENGINES = grouped_launches.ENGINES
OWN_MODEL_DIR = "{dir}/own_model/{engine}"
OWN_MODEL = grouped_launches.job("own-model-checks", 2, "tests.multiworker.own_model_checks",
                                 "ranks", OWN_MODEL_DIR, engines=ENGINES)
REFUSALS = grouped_launches.job("own-model-refusals", 1, "tests.multiworker.own_model_refusals")
OWN_MODEL_RESUME = {engine: grouped_launches.job(
    f"own-model-resume-{engine}", 1, "tests.multiworker.own_model_checks", "resume",
    OWN_MODEL_DIR.replace("{engine}", engine), stage=1) for engine in ENGINES}


def _workdir(name, ranks, engine="horovod"):
    return f"{EXAMPLES_DIR}/{name}-P{ranks}" + ("" if ranks == 1 else f"-{engine}")


def _register_examples():
    """The examples in one process and at 2 ranks on each engine, each exported after."""
    jobs = {}
    for name, (args, _) in EXAMPLES.items():
        script = os.path.join(REPO_ROOT, "examples", f"{name}.py")
        for ranks, engine in ((1, "horovod"), *((2, engine) for engine in ENGINES)):
            workdir = _workdir(name, ranks, engine)
            jobs[name, ranks, engine] = grouped_launches.job(
                f"example-{name}-P{ranks}", ranks, "tests.multiworker.example_run", script,
                f"{workdir}/weights", f"--workdir={workdir}", *args, engines=(engine,))
            jobs[name, ranks, engine, "export"] = grouped_launches.job(
                f"example-{name}-P{ranks}-{engine}-export", 1, "tests.multiworker.example_run",
                script, f"{workdir}/weights", f"--workdir={workdir}", *args, "--export",
                stage=1)
    return jobs


EXAMPLE_JOBS = _register_examples()


@grouped_launches.prepare
def _criteo_files(directory):
    """Criteo-format train and test files of random lines, by the example's own writer."""
    import runpy

    writer = runpy.run_path(os.path.join(REPO_ROOT, "examples", "criteo_cowclip.py"))
    out = directory / "examples"
    for name, lines in (("train.txt", 12_000), ("test.txt", 3_000)):
        written = writer["write_random_lines"](str(out), lines=lines, name=name)
        assert written == str(out / name)


# Loads SavedModels with TensorFlow alone and prints, as JSON, the differences of the first's and
# the last's variables and every one's scores of one request (argv: the model directories, the
# request's .npz).
SERVE_WITH_TF_ALONE = """
import json, sys
import numpy as np
import tensorflow as tf
request = dict(np.load(sys.argv[-1]))
loaded = [tf.saved_model.load(path) for path in sys.argv[1:-1]]
assert not any(m.startswith("tfscale") for m in sys.modules), "not TF alone"
def served(model):
    inputs = request["x"] if "x" in request else request
    return model.serve(inputs).numpy().reshape(-1).tolist()
pairs = [(a.numpy(), b.numpy()) for a, b in zip(loaded[0].variables, loaded[-1].variables)]
assert all(a.shape == b.shape for a, b in pairs)
norm = lambda arrays: float(np.sqrt(sum(np.square(a.astype(np.float64)).sum() for a in arrays)))
relative = norm([a - b for a, b in pairs]) / norm([a for a, _ in pairs])
print(json.dumps({"scores": [served(m) for m in loaded],
                  "variables": len(pairs),
                  "largest_difference": max(float(np.abs(a - b).max()) for a, b in pairs),
                  "relative_difference": relative}))
"""


def served(paths, request, tmp_path):
    """{"scores", "variables", "largest_difference", "relative_difference"} of the SavedModels
    `paths` (the script above), loaded and run
    by a Python with TensorFlow alone on `request` (a dict of arrays)."""
    request_path = tmp_path / "request.npz"
    np.savez(request_path, **request)
    done = subprocess.run([sys.executable, "-c", SERVE_WITH_TF_ALONE, *map(str, paths),
                           str(request_path)], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


REQUESTS = {  # one request per example's served inputs (ids 0: a row every table has)
    "criteo_cowclip": {"dense": np.linspace(0, 3, 5 * 13, dtype=np.float32).reshape(5, 13),
                       "categorical": np.zeros((5, 26), np.int64)},
    "subclassed_came_bf16": {"x": np.arange(5 * 8, dtype=np.int64).reshape(5, 8) % 7},
    "sharded_stale": {"dense": np.linspace(0, 1, 5 * 13, dtype=np.float32).reshape(5, 13),
                      "categorical": np.zeros((5, 26), np.int64)},
}


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_example_trains_alike_on_one_and_two_ranks_and_serves(launched_jobs, name, engine,
                                                               tmp_path):
    """The example at 2 ranks on each engine: both ranks end with the same weights, TensorBoard
    events written once, and its export (loaded by TensorFlow alone) holds the weights of the
    one-process run at the same global batch on the same rows, within the example's
    tolerance."""
    keys = ((name, 1, "horovod"), (name, 2, engine), (name, 1, "horovod", "export"),
            (name, 2, engine, "export"))
    for key in keys:
        trained_on_ranks = len(key) == 3 and key[1] == 2
        job = launched_jobs[grouped_launches.on_engine(EXAMPLE_JOBS[key], key[2])
                            if trained_on_ranks else EXAMPLE_JOBS[key]]
        assert job.returncode == 0, job.output
    two = launched_jobs.path(_workdir(name, 2, engine))
    ranks = [np.load(two / "weights" / f"rank{r}.npz") for r in (0, 1)]
    assert ranks[0].files == ranks[1].files and ranks[0].files
    for key in ranks[0].files:
        np.testing.assert_array_equal(ranks[0][key], ranks[1][key], err_msg=key)
    events = list((two / "tensorboard" / "train").glob("events.out.tfevents.*"))
    assert len(events) == 1, events

    one = launched_jobs.path(_workdir(name, 1))
    result = served([one / "served" / "1", two / "served" / "1"], REQUESTS[name], tmp_path)
    tolerances = EXAMPLES[name][1]
    assert result["variables"] > 3
    for measure in ("largest_difference", "relative_difference"):
        assert result[measure] <= tolerances[measure], (measure, result)
    np.testing.assert_allclose(result["scores"][0], result["scores"][1],
                               atol=tolerances["scores"])


@pytest.mark.parametrize("engine", ENGINES)
def test_own_model_on_two_ranks(launched_jobs, engine):
    """tests/multiworker/own_model_checks.py: every check passed on both ranks."""
    job = launched_jobs[grouped_launches.on_engine(OWN_MODEL, engine)]
    assert job.returncode == 0, job.output
    for check in ("broadcast", "metrics", "uneven arrays", "unknown length",
                  "batch not divisible", "load_weights", "plain model refused",
                  "callbacks refused", "in-job export", "row uneven evaluation",
                  "dynamic uneven evaluation"):
        assert job.output.count(f"{check} ok") == 2, (check, job.output)


@pytest.mark.parametrize("engine", ENGINES)
def test_resume_at_another_number_of_ranks_and_export(launched_jobs, engine, tmp_path):
    """A row-sharded run's checkpoint from 2 ranks resumes in one process; row-sharded and
    dynamic tables export from the 2-rank checkpoints, and TensorFlow alone scores as the
    2-rank model did."""
    job = launched_jobs[OWN_MODEL_RESUME[engine]]
    assert job.returncode == 0, job.output
    assert "exported ok" in job.output and "resumed at another number of ranks ok" in job.output, \
        job.output
    out = launched_jobs.path(OWN_MODEL_DIR.replace("{engine}", engine))
    batch = {"x": np.load(out / "fixed_batch.npy")}
    for kind in ("row", "dynamic"):
        scores = served([out / f"{kind}-served"], batch, tmp_path)["scores"][0]
        np.testing.assert_allclose(scores, np.load(out / f"{kind}-predictions.npy").reshape(-1),
                                   rtol=1e-5)
        np.testing.assert_allclose(
            scores, np.load(out / f"{kind}-export-predictions.npy").reshape(-1), rtol=1e-6)


def _readme_model():
    ids = keras.Input((3,), dtype="int64")
    vectors = tfscale.FieldEmbedding([5, 5, 5], embedding_dim=2)(ids)
    return tfscale.FunctionalTrainStepModel(
        ids, keras.layers.Dense(1, activation="sigmoid")(keras.layers.Flatten()(vectors)))


def test_refusals_of_launchers_variables_in_one_process(launched_jobs):
    """tests/multiworker/own_model_refusals.py: building or compiling under horovodrun or
    tfscale.run before init, and a plain keras.Model's step with a tfscale optimizer in a job of
    two, refused."""
    job = launched_jobs[REFUSALS]
    assert job.returncode == 0, job.output
    for launcher in ("horovodrun", "tfscale.run"):
        assert f"{launcher}: init before building ok" in job.output, job.output
        assert f"{launcher}: plain model refused ok" in job.output, job.output


def test_rank_batches_in_one_process_are_the_global_batches():
    """One process: the global batches in order, the incomplete last one left out for
    training and kept for evaluation; a shuffle reorders every epoch."""
    x, y = np.arange(10)[:, None], np.arange(10)[:, None] * 2
    batches = [b[0].numpy()[:, 0].tolist() for b in rank_batches((x, y), 4)]
    assert batches == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert int(rank_batches((x, y), 4).cardinality()) == 2
    evaluation = rank_batches((x, y), 4, drop_remainder=False)
    assert int(evaluation.cardinality()) == 3
    assert [len(b[0]) for b in evaluation] == [4, 4, 2]
    shuffled = rank_batches((x, y), 5, shuffle_seed=1)
    first, second = ([b[0].numpy()[:, 0].tolist() for b in shuffled] for _ in range(2))
    assert sorted(sum(first, [])) == list(range(10)) and first != second
    examples = tf.data.Dataset.from_tensor_slices((x, y))
    assert [b[1].numpy()[:, 0].tolist() for b in rank_batches(examples, 4)] == [[0, 2, 4, 6],
                                                                         [8, 10, 12, 14]]
    with pytest.raises(UserError, match="more than the 10 rows"):
        rank_batches((x, y), 16)
    with pytest.raises(UserError, match="different numbers of rows"):
        rank_batches((x, y[:5]), 4)


def test_checkpoint_refuses_to_replace_a_run_and_export_a_used_path(tmp_path):
    """tfscale.callbacks.Checkpoint(resume=False) refuses a directory holding a checkpoint;
    export_model refuses an existing path and an unbuilt model without a signature."""
    x, y = np.zeros((8, 3), np.int64), np.ones((8, 1), np.float32)
    model = _readme_model()
    model.compile(optimizer=RowSparseAdam(), loss="binary_crossentropy")
    directory = str(tmp_path / "checkpoints")
    model.fit(x, y, batch_size=4, verbose=0, callbacks=[tfscale.callbacks.Checkpoint(directory)])
    with pytest.raises(UserError, match="already holds a checkpoint"):
        model.fit(x, y, batch_size=4, verbose=0,
                  callbacks=[tfscale.callbacks.Checkpoint(directory, resume=False)])
    with pytest.raises(UserError, match="exists already"):
        tfscale.serving.export_model(model, str(tmp_path))
    with pytest.raises(UserError, match="give `input_signature`"):
        tfscale.serving.export_model(tfscale.TrainStepModel(), str(tmp_path / "new"))
