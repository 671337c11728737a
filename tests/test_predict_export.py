"""From a trained run to predictions and a served model: `launch.predict` scores every line of a
file in order, `launch.export` writes a SavedModel whose graph holds the preprocessing, and that
SavedModel, loaded by TensorFlow alone in a fresh process where tfscale cannot be imported,
gives the probabilities of the trained model (launch.predict's) on the same lines, through both
signatures. Hashed and vocabulary models, DeepFM and DCN-v2, float32 and mixed_bfloat16, one
process and two Horovod ranks (replicated and row-sharded tables); Criteo and Avazu."""

import csv
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tests.horovod_launch import REPO_ROOT, horovodrun

TINY_RUN = ["--batch_size=64", "--dnn_units=16", "--cross_layers=1", "--epochs=1",
            "--logdir=none", "--vocabulary_min_count=2", "--hash_buckets=300",
            "--checkpoint_every_steps=0"]


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
    unlabelled.write_text("\n".join(line.split("\t", 1)[1] for line in lines) + "\n")
    return labelled, unlabelled


def avazu_files(directory, rows=500):
    rng = np.random.default_rng(0)
    header = ("id,click,hour,C1,banner_pos,site_id,site_domain,site_category,app_id,app_domain,"
              "app_category,device_id,device_ip,device_model,device_type,device_conn_type,"
              "C14,C15,C16,C17,C18,C19,C20,C21")
    labelled, unlabelled = [header], [header.replace("id,click,", "id,")]
    for row in range(rows):
        values = [f"v{rng.integers(0, 4 + 3 * column)}" for column in range(21)]
        click = str(int(values[2] in ("v0", "v1")))
        row_id = str(10**19 + row * 7919)  # larger than int64, passed through as text
        hour = f"1410{21 + row % 9:02d}{row % 24:02d}"
        labelled.append(",".join([row_id, click, hour] + values))
        unlabelled.append(",".join([row_id, hour] + values))
    paths = directory / "avazu_train.csv", directory / "avazu_test.csv"
    for path, lines in zip(paths, (labelled, unlabelled)):
        path.write_text("\n".join(lines) + "\n")
    return paths


def read_predictions(path):
    with open(path) as stream:
        rows = list(csv.reader(stream))
    return rows[0], rows[1:]


LOAD_SCRIPT = textwrap.dedent("""
    import json, sys
    # tfscale (installed in this environment) and the repository's packages cannot be imported
    # here: loading needs TensorFlow alone.
    for blocked in ("tfscale", "models", "launch"):
        sys.modules[blocked] = None
    import numpy as np
    import tensorflow as tf
    saved_model, lines_path, delimiter, header_lines, out = sys.argv[1:]
    loaded = tf.saved_model.load(saved_model)
    lines = open(lines_path).read().splitlines()[int(header_lines):]
    score_lines = loaded.signatures["score_lines"]
    serving = loaded.signatures["serving_default"]
    results = {"lines": score_lines(lines=tf.constant(lines))["probability"].numpy()}
    results["one_by_one"] = np.concatenate([
        score_lines(lines=tf.constant(lines[i:i + 1]))["probability"].numpy()
        for i in range(0, len(lines), 97)])
    names = list(serving.structured_input_signature[1])
    json.dump({"names": names}, open(out + ".json", "w"))
    np.savez(out, **results)
""")


def load_in_fresh_process(tmp_path, saved_model, lines_path, delimiter="\\t", header_lines=0):
    """Runs LOAD_SCRIPT with TensorFlow only: outside the checkout, no PYTHONPATH, isolated,
    tfscale's packages blocked."""
    script = tmp_path / "load_saved_model.py"
    script.write_text(LOAD_SCRIPT)
    out = tmp_path / "loaded"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-I", str(script), str(saved_model), str(lines_path),
                           delimiter, str(header_lines), str(out)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return dict(np.load(f"{out}.npz"))


def served_by_fields(saved_model, rows_by_name):
    """serving_default on columns by name, in this process (TensorFlow only is used)."""
    import tensorflow as tf

    loaded = tf.saved_model.load(str(saved_model))
    serving = loaded.signatures["serving_default"]
    return serving(**{name: tf.constant(values) for name, values in rows_by_name.items()})[
        "probability"].numpy()


def train(tmp_path, name, data_flags, *extra, ranks=1):
    checkpoint_dir = tmp_path / name
    flags = [*TINY_RUN, *data_flags, f"--checkpoint_dir={checkpoint_dir}", *extra]
    if ranks == 1:
        done = run_module("launch.train", *flags)
        assert done.returncode == 0, done.stdout + done.stderr
    else:
        done = horovodrun(ranks, ["-m", "launch.train", *flags], timeout=300)
        assert done.returncode == 0, done.stdout
    return checkpoint_dir


@pytest.fixture(scope="module")
def criteo(tmp_path_factory):
    return criteo_files(tmp_path_factory.mktemp("criteo"))


@pytest.mark.parametrize("encoding, model, precision, ranks, sharding", [
    ("hash", "deepfm", "float32", 1, "replicated"),
    ("vocabulary", "dcn_v2", "mixed_bfloat16", 1, "replicated"),
    ("hash", "dcn_v2", "float32", 1, "replicated"),
    ("vocabulary", "deepfm", "mixed_bfloat16", 1, "replicated"),
    ("vocabulary", "deepfm", "float32", 2, "replicated"),
    # each rank wrote its own rows; predict and export read them all in one process
    ("vocabulary", "deepfm", "float32", 2, "row"),
])
def test_saved_model_scores_as_the_trained_model(tmp_path, criteo, encoding, model, precision,
                                                  ranks, sharding):
    labelled, unlabelled = criteo
    checkpoint_dir = train(tmp_path, "run", ["--data=criteo", f"--train_path={labelled}"],
                           f"--categorical_encoding={encoding}", f"--model={model}",
                           f"--precision={precision}", f"--embedding_sharding={sharding}",
                           ranks=ranks)
    # The trained model, restored by launch.predict, on the unlabelled file.
    predicted = run_module("launch.predict", f"--checkpoint_dir={checkpoint_dir}",
                           f"--input={unlabelled}", f"--output={tmp_path}/p.csv",
                           "--batch_size=100")
    assert predicted.returncode == 0, predicted.stderr
    header, rows = read_predictions(tmp_path / "p.csv")
    assert header == ["probability"]
    lines = unlabelled.read_text().splitlines()
    assert len(rows) == len(lines)
    probabilities = np.array([row[0] for row in rows], np.float32)
    # The labelled file gives the same probabilities and the metrics.
    scored = run_module("launch.predict", f"--checkpoint_dir={checkpoint_dir}",
                        f"--input={labelled}", f"--output={tmp_path}/q.csv")
    assert scored.returncode == 0, scored.stderr
    assert "AUC " in scored.stdout and "logloss" in scored.stdout, scored.stdout
    _, labelled_rows = read_predictions(tmp_path / "q.csv")
    np.testing.assert_allclose(np.array([r[0] for r in labelled_rows], np.float32),
                               probabilities, rtol=0, atol=1e-6)  # other batches: 1 ulp apart

    exported = run_module("launch.export", f"--checkpoint_dir={checkpoint_dir}",
                          f"--output={tmp_path}/served")
    assert exported.returncode == 0, exported.stderr
    with_labels = load_in_fresh_process(tmp_path, tmp_path / "served", labelled)
    without_labels = load_in_fresh_process(tmp_path, tmp_path / "served", unlabelled)
    np.testing.assert_allclose(with_labels["lines"], probabilities, rtol=0, atol=1e-6)
    np.testing.assert_allclose(without_labels["lines"], probabilities, rtol=0, atol=1e-6)
    np.testing.assert_allclose(without_labels["one_by_one"], probabilities[::97], rtol=0,
                               atol=1e-6)

    from tfscale.data.criteo import CATEGORICAL_NAMES, DENSE_NAMES

    names = DENSE_NAMES + CATEGORICAL_NAMES
    columns = [line.split("\t") + [""] * (len(names) - len(line.split("\t"))) for line in lines]
    by_fields = served_by_fields(tmp_path / "served", {
        name: [column[i] for column in columns] for i, name in enumerate(names)})
    np.testing.assert_allclose(by_fields, probabilities, rtol=0, atol=1e-6)


def test_avazu_predictions_keep_order_and_ids(tmp_path):
    labelled, unlabelled = avazu_files(tmp_path)
    checkpoint_dir = train(tmp_path, "run", ["--data=avazu", f"--train_path={labelled}"])
    predicted = run_module("launch.predict", f"--checkpoint_dir={checkpoint_dir}",
                           f"--input={unlabelled}", f"--output={tmp_path}/p.csv")
    assert predicted.returncode == 0, predicted.stderr
    header, rows = read_predictions(tmp_path / "p.csv")
    assert header == ["id", "probability"]
    lines = unlabelled.read_text().splitlines()[1:]
    assert [row[0] for row in rows] == [line.split(",")[0] for line in lines]
    probabilities = np.array([row[1] for row in rows], np.float32)

    exported = run_module("launch.export", f"--checkpoint_dir={checkpoint_dir}",
                          f"--output={tmp_path}/served")
    assert exported.returncode == 0, exported.stderr
    loaded = load_in_fresh_process(tmp_path, tmp_path / "served", labelled, ",", 1)
    np.testing.assert_allclose(loaded["lines"], probabilities, rtol=0, atol=1e-6)

    columns = unlabelled.read_text().splitlines()[0].split(",")
    values = [line.split(",") for line in lines]
    by_fields = served_by_fields(tmp_path / "served", {
        name: [v[columns.index(name)] for v in values] for name in columns if name != "id"})
    np.testing.assert_allclose(by_fields, probabilities, rtol=0, atol=1e-6)


def test_predict_and_export_errors_are_one_paragraph(tmp_path, criteo):
    labelled, _ = criteo
    missing = run_module("launch.predict", f"--checkpoint_dir={tmp_path}/nothing",
                         f"--input={labelled}")
    assert missing.returncode == 2 and "has no run.json" in missing.stderr, missing.stderr
    assert "Traceback" not in missing.stderr
    synthetic = train(tmp_path, "synthetic", ["--train_rows=2000", "--test_rows=200",
                                              "--synthetic_vocabulary_scale=0.001"])
    refused = run_module("launch.export", f"--checkpoint_dir={synthetic}",
                         f"--output={tmp_path}/served")
    assert refused.returncode == 2, refused.stderr
    assert "trained on --data=synthetic, which has no file format to export" in refused.stderr
    assert not os.path.exists(tmp_path / "served")
