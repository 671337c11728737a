"""From a trained run to predictions and a served model: `launch.predict` scores every line of a
file in order, `launch.export` writes a SavedModel whose graph holds the preprocessing, and that
SavedModel, loaded by TensorFlow alone in a fresh process where tfscale cannot be imported,
scores lines (score_lines) and fields by name (serving_default).

All of them are checked against the trained model itself: at its end a run scores the first
lines of its test split with the model still in memory (`trained_predictions.json` beside the
checkpoints), so a restore that lost trained weights (tables back from their initializer, say)
cannot agree with it, even though predict and export would still agree with each other. Each
run trains once (a job of the grouped launches, tests/grouped_launches.py: the one-process runs
in one process, the 2-rank ones in one launch) and is shared by the tests that use it. Hashed,
vocabulary and min-max encodings; DeepFM, Wide & Deep, DCN and DCN-v2; float32, mixed_float16 and
mixed_bfloat16; one process and two Horovod ranks (replicated, row-sharded and dynamic tables);
Criteo (plain, and a .gz file longer than two read chunks) and Avazu."""

import csv
import gzip
import json
import os
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tests import grouped_launches
from tests.horovod_launch import REPO_ROOT, python_side_by_side

# A tiny model, one epoch of about 9 steps; learning rates high enough that the trained weights
# are far from their initial values (so a restore that loses them cannot pass as trained).
TINY_RUN = ["--batch_size=64", "--dnn_units=16", "--cross_layers=1", "--epochs=1",
            "--logdir=none", "--vocabulary_min_count=2", "--hash_buckets=300",
            "--checkpoint_every_steps=0", "--learning_rate=0.01",
            "--embedding_learning_rate=0.05", "--warmup_epochs=0"]

# How far launch.predict and the SavedModel may be from the trained model's own scores. float32:
# the same computation on batches of another size, which changes at most the last bits of the
# sums. Mixed precision computes the logit in float16/bfloat16 and casts it to float32 before
# the sigmoid (slope <= 1/4): another batch size may round a sum differently by one unit in the
# last place of the compute dtype, about eps * |logit| <= 4 eps for |logit| <= 4, i.e. at most
# eps in probability (float16: eps = 2^-10, bfloat16: 2^-7). Training moves the probabilities
# by far more: a restore that left the tables at their initial values was off by 0.26 to 0.72
# in float32, float16 and bfloat16 alike (checked by hand).
TOLERANCE = {"float32": 1e-5, "mixed_float16": 2.0**-10, "mixed_bfloat16": 2.0**-7}

# name: (training flags beside TINY_RUN and the data flags, Horovod ranks)
RUNS = {
    "deepfm-hash": (["--model=deepfm", "--categorical_encoding=hash"], 1),
    "dcn_v2-bfloat16": (["--model=dcn_v2", "--precision=mixed_bfloat16"], 1),
    "wide_deep-hash-float16": (["--model=wide_deep", "--categorical_encoding=hash",
                                "--precision=mixed_float16"], 1),
    "dcn-minmax": (["--model=dcn", "--integer_transform=minmax"], 1),
    "deepfm-2-ranks": (["--model=deepfm"], 2),
    # each rank wrote its own rows; predict and export read them all in one process
    "deepfm-2-ranks-sharded": (["--model=deepfm", "--embedding_sharding=row"], 2),
    # dynamic tables keyed by fingerprints, each rank's ids by key: read into one process
    "deepfm-2-ranks-dynamic": (["--model=deepfm", "--embedding_sharding=dynamic",
                                "--categorical_encoding=fingerprint", "--dynamic_capacity=6000"],
                               2),
}


def run_module(module, *flags, timeout=300):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    return subprocess.run([sys.executable, "-m", module, *flags], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def criteo_files(directory, rows=700):
    """A labelled Criteo file from the synthetic generator and the same lines without labels."""
    from tfscale.data.synthetic import SyntheticCTR

    labelled = directory / "train.txt"
    SyntheticCTR(seed=5, train_rows=rows, test_rows=10,
                 vocabulary_scale=0.002).write_criteo_tsv(str(labelled), 0, rows)
    lines = labelled.read_text().splitlines()
    # Two lines missing trailing fields, as a stripping export writes them.
    lines[5] = "\t".join(lines[5].split("\t")[:-3])
    lines[9] = "\t".join(lines[9].split("\t")[:20])
    labelled.write_text("\n".join(lines) + "\n")
    unlabelled = directory / "test.txt"
    unlabelled.write_text("\n".join(criteo_without_label(lines)) + "\n")
    return labelled, unlabelled


def criteo_without_label(lines):
    return [line.split("\t", 1)[1] for line in lines]


AVAZU_HEADER = ("id,click,hour,C1,banner_pos,site_id,site_domain,site_category,app_id,"
                "app_domain,app_category,device_id,device_ip,device_model,device_type,"
                "device_conn_type,C14,C15,C16,C17,C18,C19,C20,C21")


def avazu_without_label(lines):
    """Avazu lines (header or data) without their second column, the label."""
    return [",".join(fields[:1] + fields[2:]) for fields in (line.split(",") for line in lines)]


def avazu_files(directory, rows=500):
    """A labelled Avazu file of `rows` lines after its header."""
    rng = np.random.default_rng(0)
    labelled = []
    for row in range(rows):
        values = [f"v{rng.integers(0, 4 + 3 * column)}" for column in range(21)]
        click = str(int(values[2] in ("v0", "v1")))
        row_id = str(10**19 + row * 7919)  # larger than int64, passed through as text
        hour = f"1410{21 + row % 9:02d}{row % 24:02d}"
        labelled.append(",".join([row_id, click, hour] + values))
    path = directory / "avazu_train.csv"
    path.write_text("\n".join([AVAZU_HEADER] + labelled) + "\n")
    return path


def read_predictions(path):
    with open(path) as stream:
        rows = list(csv.reader(stream))
    return rows[0], rows[1:]


def trained_predictions(checkpoint_dir):
    """(lines, float32 probabilities, global step) the run recorded from the model in memory."""
    record = json.loads((checkpoint_dir / "trained_predictions.json").read_text())
    assert len(record["lines"]) == len(record["probabilities"]) > 0
    return record["lines"], np.array(record["probabilities"], np.float32), record["global_step"]


def predict_flags(checkpoint_dir, path, output):
    return [f"--checkpoint_dir={checkpoint_dir}", f"--input={path}", f"--output={output}",
            "--batch_size=100"]


def predict(checkpoint_dir, path, output):
    """launch.predict on `path`: (CSV header, rows, its report on stdout)."""
    done = run_module("launch.predict", *predict_flags(checkpoint_dir, path, output))
    assert done.returncode == 0, done.stdout + done.stderr
    header, rows = read_predictions(output)
    return header, rows, done.stdout


def predict_and_export(checkpoint_dir, path, output, served):
    """launch.predict on `path` (as `predict`) and launch.export to `served`, side by side:
    (CSV header, rows, predict's report on stdout)."""
    predicted, exported = python_side_by_side(
        [["-m", "launch.predict", *predict_flags(checkpoint_dir, path, output)],
         ["-m", "launch.export", f"--checkpoint_dir={checkpoint_dir}", f"--output={served}"]],
        timeout=300, separate_stderr=True)
    assert predicted.returncode == 0, predicted.stdout + predicted.stderr
    assert exported.returncode == 0, exported.stdout + exported.stderr
    header, rows = read_predictions(output)
    return header, rows, predicted.stdout


LOAD_SCRIPT = textwrap.dedent("""
    import json
    import sys
    # tfscale (installed in this environment) and the repository's packages cannot be imported
    # here: loading needs TensorFlow alone.
    for blocked in ("tfscale", "models", "launch"):
        sys.modules[blocked] = None
    import numpy as np
    import tensorflow as tf
    saved_model, out, fields, *files = sys.argv[1:]
    loaded = tf.saved_model.load(saved_model)
    score_lines = loaded.signatures["score_lines"]
    results = {}
    for name, path, header_lines in zip(files[::3], files[1::3], files[2::3]):
        lines = open(path).read().splitlines()[int(header_lines):]
        results[name] = score_lines(lines=tf.constant(lines))["probability"].numpy()
        results[name + "_one_by_one"] = np.concatenate([
            score_lines(lines=tf.constant(lines[i:i + 1]))["probability"].numpy()
            for i in range(0, len(lines), 97)])
    if fields != "-":
        columns = json.load(open(fields))
        results["serving_default"] = loaded.signatures["serving_default"](
            **{name: tf.constant(values) for name, values in columns.items()})[
            "probability"].numpy()
    np.savez(out, **results)
""")


def load_in_fresh_process(tmp_path, saved_model, files, fields=None):
    """score_lines of the SavedModel on each {name: (path, header lines)}, whole and every 97th
    line alone (`<name>_one_by_one`), and serving_default on `fields` ({name: column of
    values}, if given; "serving_default"), run by TensorFlow only: outside the checkout, no
    PYTHONPATH, isolated, tfscale's packages blocked."""
    script = tmp_path / "load_saved_model.py"
    script.write_text(LOAD_SCRIPT)
    out = tmp_path / "loaded"
    fields_file = "-"
    if fields is not None:
        fields_file = tmp_path / "fields.json"
        fields_file.write_text(json.dumps(fields))
    args = [str(value) for name, (path, header) in files.items() for value in (name, path, header)]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-I", str(script), str(saved_model), str(out),
                           str(fields_file), *args],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return dict(np.load(f"{out}.npz"))


PREDICT_DIR = "{dir}/predict"
CRITEO_FILE = f"{PREDICT_DIR}/train.txt"
AVAZU_FILE = f"{PREDICT_DIR}/avazu_train.csv"


def checkpoints_of(run):
    """The checkpoint directory of training job `run`, as a job argument."""
    return f"{PREDICT_DIR}/{run}/checkpoints"


def train(run, data_flags, *flags, ranks=1):
    """Registers the training job `run` (tests/grouped_launches.py); returns its name."""
    return grouped_launches.launcher_job(f"predict-{run}", ranks, *TINY_RUN, *data_flags,
                                         *flags, f"--checkpoint_dir={checkpoints_of(run)}")


for _run, (_flags, _ranks) in RUNS.items():
    train(_run, ["--data=criteo", f"--train_path={CRITEO_FILE}"], *_flags, ranks=_ranks)
AVAZU_RUN = train("avazu", ["--data=avazu", f"--train_path={AVAZU_FILE}"])
SYNTHETIC_RUN = train("synthetic", ["--train_rows=2000", "--test_rows=200",
                                    "--synthetic_vocabulary_scale=0.001"])


@grouped_launches.prepare
def _training_files(directory):
    """The Criteo files (labelled and not) and the Avazu file the runs train on."""
    predict_dir = pathlib.Path(PREDICT_DIR.format(dir=directory))
    predict_dir.mkdir(parents=True)
    criteo_files(predict_dir)
    avazu_files(predict_dir)


def trained(launched_jobs, run):
    """The checkpoint directory of training job `run`, which must have succeeded."""
    job = launched_jobs[f"predict-{run}"]
    assert job.returncode == 0, job.output
    return launched_jobs.path(checkpoints_of(run))


def assert_scores(actual, expected, tolerance, what):
    np.testing.assert_allclose(actual, expected, rtol=0, atol=tolerance, err_msg=what)


@pytest.fixture(scope="module")
def criteo(launched_jobs):
    """The labelled Criteo file the runs trained on and its lines without labels."""
    labelled = launched_jobs.path(CRITEO_FILE)
    return labelled, labelled.parent / "test.txt"


def precision_of(run):
    flags, _ = RUNS[run]
    return next((flag.split("=")[1] for flag in flags if flag.startswith("--precision=")),
                "float32")


@pytest.mark.parametrize("run", list(RUNS))
def test_predict_and_saved_model_score_as_the_trained_model(tmp_path, criteo, launched_jobs, run):
    """launch.predict on a labelled file and the SavedModel's score_lines (lines with and without
    labels, whole and one by one) and serving_default (fields by name) give the trained model's
    own scores of its test lines, and agree with each other on every line of the file."""
    labelled, _ = criteo
    checkpoint_dir = trained(launched_jobs, run)
    reference_lines, reference, global_step = trained_predictions(checkpoint_dir)
    tolerance = TOLERANCE[precision_of(run)]
    n = len(reference)
    lines = reference_lines + labelled.read_text().splitlines()
    scored = tmp_path / "lines.txt"
    scored.write_text("\n".join(lines) + "\n")
    unlabelled = tmp_path / "unlabelled.txt"
    unlabelled.write_text("\n".join(criteo_without_label(lines)) + "\n")

    served = tmp_path / "served"
    header, rows, report = predict_and_export(checkpoint_dir, scored, tmp_path / "p.csv", served)
    assert f"at global step {global_step};" in report, report
    assert "AUC " in report and "logloss" in report, report
    assert header == ["probability"] and len(rows) == len(lines)
    probabilities = np.array([row[0] for row in rows], np.float32)
    assert_scores(probabilities[:n], reference, tolerance, "launch.predict")

    from tfscale.data.criteo import CATEGORICAL_NAMES, DENSE_NAMES

    names = DENSE_NAMES + CATEGORICAL_NAMES
    columns = [line.split("\t") + [""] * (len(names) - len(line.split("\t")))
               for line in criteo_without_label(lines)]
    loaded = load_in_fresh_process(
        tmp_path, served, {"labelled": (scored, 0), "unlabelled": (unlabelled, 0)},
        fields={name: [column[i] for column in columns] for i, name in enumerate(names)})
    for name in ("labelled", "unlabelled"):
        assert_scores(loaded[name][:n], reference, tolerance, f"score_lines, {name}")
        assert_scores(loaded[name], probabilities, 1e-6, f"score_lines, {name}, vs predict")
        assert_scores(loaded[f"{name}_one_by_one"], probabilities[::97], 1e-6,
                      f"score_lines one line at a time, {name}")

    by_fields = loaded["serving_default"]
    assert_scores(by_fields[:n], reference, tolerance, "serving_default")
    assert_scores(by_fields, probabilities, 1e-6, "serving_default vs predict")


def test_predict_reads_a_gz_file_of_several_chunks_in_order(tmp_path, criteo, launched_jobs):
    """An unlabelled .gz file longer than two read chunks (CHUNK_LINES lines each) is scored line
    for line: the trained model's test lines, placed across the first chunk boundary and at the
    end, get the trained model's scores, and every line gets score_lines' score."""
    from tfscale.data.text_lines import CHUNK_LINES

    _, unlabelled = criteo
    checkpoint_dir = trained(launched_jobs, "deepfm-hash")
    reference_lines, reference, _ = trained_predictions(checkpoint_dir)
    n = len(reference)
    filler = unlabelled.read_text().splitlines()
    filler = filler * (2 * CHUNK_LINES // len(filler) + 2)
    first = CHUNK_LINES - n // 2  # the reference lines straddle the end of the first chunk
    lines = (filler[:first] + criteo_without_label(reference_lines)
             + filler[first:2 * CHUNK_LINES + 50] + criteo_without_label(reference_lines))
    last = len(lines) - n
    assert len(lines) > 2 * CHUNK_LINES
    path = tmp_path / "many.txt.gz"
    with gzip.open(path, "wt") as stream:
        stream.write("\n".join(lines) + "\n")

    served = tmp_path / "served"
    header, rows, _ = predict_and_export(checkpoint_dir, path, tmp_path / "p.csv", served)
    assert header == ["probability"] and len(rows) == len(lines)
    probabilities = np.array([row[0] for row in rows], np.float32)
    assert_scores(probabilities[first:first + n], reference, TOLERANCE["float32"],
                  "across the chunk boundary")
    assert_scores(probabilities[last:], reference, TOLERANCE["float32"], "at the end")

    plain = tmp_path / "many.txt"
    plain.write_text("\n".join(lines) + "\n")
    loaded = load_in_fresh_process(tmp_path, served, {"lines": (plain, 0)})
    assert_scores(loaded["lines"], probabilities, 1e-6, "every line, score_lines vs predict")


def test_predict_scores_a_labelled_file_of_one_class(tmp_path, criteo, launched_jobs):
    """A labelled file whose labels are all 0 is scored, with its log loss and an undefined AUC
    in the report (it used to end in a traceback from the AUC)."""
    labelled, _ = criteo
    negatives = [line for line in labelled.read_text().splitlines() if line.startswith("0\t")]
    path = tmp_path / "negatives.txt"
    path.write_text("\n".join(negatives[:20]) + "\n")
    header, rows, report = predict(trained(launched_jobs, "deepfm-hash"), path,
                                   tmp_path / "p.csv")
    assert header == ["probability"] and len(rows) == 20
    assert "AUC undefined" in report and "logloss" in report, report


def test_avazu_predictions_keep_order_and_ids(tmp_path, launched_jobs):
    """Avazu: launch.predict hands the id column through in order and gives the trained model's
    scores of its test lines; score_lines (labelled, with the header skipped) and
    serving_default agree."""
    train_lines = launched_jobs.path(AVAZU_FILE).read_text().splitlines()[1:]
    checkpoint_dir = trained(launched_jobs, "avazu")
    reference_lines, reference, _ = trained_predictions(checkpoint_dir)
    n = len(reference)
    lines = reference_lines + train_lines
    unlabelled = tmp_path / "unlabelled.csv"
    unlabelled.write_text("\n".join(avazu_without_label([AVAZU_HEADER] + lines)) + "\n")
    served = tmp_path / "served"
    header, rows, _ = predict_and_export(checkpoint_dir, unlabelled, tmp_path / "p.csv", served)
    assert header == ["id", "probability"]
    assert [row[0] for row in rows] == [line.split(",")[0] for line in lines]
    probabilities = np.array([row[1] for row in rows], np.float32)
    assert_scores(probabilities[:n], reference, TOLERANCE["float32"], "launch.predict")

    scored = tmp_path / "lines.csv"
    scored.write_text("\n".join([AVAZU_HEADER] + lines) + "\n")
    columns = avazu_without_label([AVAZU_HEADER])[0].split(",")
    values = [line.split(",") for line in avazu_without_label(lines)]
    loaded = load_in_fresh_process(tmp_path, served, {"lines": (scored, 1)}, fields={
        name: [v[columns.index(name)] for v in values] for name in columns if name != "id"})
    assert_scores(loaded["lines"], probabilities, 1e-6, "score_lines vs predict")
    assert_scores(loaded["serving_default"], probabilities, 1e-6, "serving_default vs predict")


def test_predict_and_export_errors_are_one_paragraph(tmp_path, criteo, launched_jobs):
    """Predict without a run record and export of a synthetic-data run (no file format, so no
    trained predictions either) end with one paragraph and exit status 2."""
    labelled, _ = criteo
    missing = run_module("launch.predict", f"--checkpoint_dir={tmp_path}/nothing",
                         f"--input={labelled}")
    assert missing.returncode == 2 and "has no run.json" in missing.stderr, missing.stderr
    assert "Traceback" not in missing.stderr
    synthetic = trained(launched_jobs, "synthetic")
    assert not os.path.exists(synthetic / "trained_predictions.json")
    refused = run_module("launch.export", f"--checkpoint_dir={synthetic}",
                         f"--output={tmp_path}/served")
    assert refused.returncode == 2, refused.stderr
    assert "trained on --data=synthetic, which has no file format to export" in refused.stderr
    assert not os.path.exists(tmp_path / "served")
