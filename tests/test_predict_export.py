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
Criteo (plain, and a .gz file longer than two read chunks) and Avazu. Every test's predictions,
exports and loads run together, TensorFlow starting once for each kind (the fixture `scored`)."""

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
from tests.horovod_launch import python_side_by_side

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

# name: (training flags beside TINY_RUN and the data flags, ranks); the runs named in ON_TF_ENGINE
# train on TensorFlow's collective runtime (tfscale.run), the others on Horovod
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
RUNS.update({f"{run}-tf": RUNS[run] for run in ("deepfm-2-ranks", "deepfm-2-ranks-sharded",
                                                "deepfm-2-ranks-dynamic")})
ON_TF_ENGINE = {run for run in RUNS if run.endswith("-tf")}


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


PREDICT_DIR = "{dir}/predict"
CRITEO_FILE = f"{PREDICT_DIR}/train.txt"
AVAZU_FILE = f"{PREDICT_DIR}/avazu_train.csv"


def checkpoints_of(run):
    """The checkpoint directory of training job `run`, as a job argument."""
    return f"{PREDICT_DIR}/{run}/checkpoints"


def engine_of(run):
    return "tf" if run in ON_TF_ENGINE else "horovod"


def train(run, data_flags, *flags, ranks=1):
    """Registers the training job `run` (tests/grouped_launches.py); returns its name."""
    return grouped_launches.launcher_job(f"predict-{run}", ranks, *TINY_RUN, *data_flags,
                                         *flags, f"--checkpoint_dir={checkpoints_of(run)}",
                                         engines=(engine_of(run),))


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
    job = launched_jobs[grouped_launches.on_engine(f"predict-{run}", engine_of(run))
                        if RUNS.get(run, (None, 1))[1] > 1 else f"predict-{run}"]
    assert job.returncode == 0, job.output
    return launched_jobs.path(checkpoints_of(run))


def assert_scores(actual, expected, tolerance, what):
    np.testing.assert_allclose(actual, expected, rtol=0, atol=tolerance, err_msg=what)


def precision_of(run):
    flags, _ = RUNS[run]
    return next((flag.split("=")[1] for flag in flags if flag.startswith("--precision=")),
                "float32")


LOAD_SCRIPT = textwrap.dedent("""
    import json
    import sys
    # tfscale (installed in this environment) and the repository's packages cannot be imported
    # here: loading needs TensorFlow alone.
    for blocked in ("tfscale", "models", "launch"):
        sys.modules[blocked] = None
    import numpy as np
    import tensorflow as tf
    plan_path, out_dir = sys.argv[1:]
    for case, plan in json.load(open(plan_path)).items():
        loaded = tf.saved_model.load(plan["saved_model"])
        score_lines = loaded.signatures["score_lines"]
        results = {}
        for name, path, header_lines in plan["files"]:
            lines = open(path).read().splitlines()[header_lines:]
            results[name] = score_lines(lines=tf.constant(lines))["probability"].numpy()
            results[name + "_one_by_one"] = np.concatenate([
                score_lines(lines=tf.constant(lines[i:i + 1]))["probability"].numpy()
                for i in range(0, len(lines), 97)])
        if plan["fields"] is not None:
            results["serving_default"] = loaded.signatures["serving_default"](
                **{name: tf.constant(values) for name, values in plan["fields"].items()})[
                "probability"].numpy()
        np.savez(f"{out_dir}/{case}.npz", **results)
""")


def gz_lines(reference_lines, unlabelled_lines, chunk_lines):
    """(lines, first, last) of an unlabelled file longer than two read chunks: the trained
    model's test lines without labels at `first`, straddling the end of the first chunk, and
    again at `last`, the end; filler lines elsewhere."""
    n = len(reference_lines)
    filler = unlabelled_lines * (2 * chunk_lines // len(unlabelled_lines) + 2)
    first = chunk_lines - n // 2
    lines = (filler[:first] + criteo_without_label(reference_lines)
             + filler[first:2 * chunk_lines + 50] + criteo_without_label(reference_lines))
    return lines, first, len(lines) - n


class Scored:
    """What the module's launch.predict and launch.export jobs and the SavedModels' loading gave:
    `directory/<case>` holds each case's inputs and outputs."""

    def __init__(self, directory):
        self.directory = directory
        self.predicts, self.exports, self.loads = {}, {}, {}

    def path(self, case, name):
        (self.directory / case).mkdir(exist_ok=True)
        return self.directory / case / name

    def predict(self, case, checkpoint_dir, input_path):
        """Adds launch.predict of `input_path` (to <case>/p.csv) as a job."""
        self.predicts[case] = [f"--checkpoint_dir={checkpoint_dir}", f"--input={input_path}",
                               f"--output={self.path(case, 'p.csv')}", "--batch_size=100"]

    def export(self, case, checkpoint_dir):
        """Adds launch.export (to <case>/served) as a job."""
        self.exports[case] = [f"--checkpoint_dir={checkpoint_dir}",
                              f"--output={self.path(case, 'served')}"]

    def load(self, case, served_case, files, fields=None):
        """Adds loading <served_case>/served: score_lines of each {name: (path, header lines)},
        whole and every 97th line alone (`<name>_one_by_one`), and serving_default on `fields`
        ({name: column of values}), if given ("serving_default")."""
        self.loads[case] = {"saved_model": str(self.path(served_case, "served")),
                            "files": [[name, str(path), header]
                                      for name, (path, header) in files.items()],
                            "fields": fields}

    def run(self):
        """The predict jobs in one process and the export jobs in another, side by side (the
        launchers define flags of the same names), then the loads in one fresh process run by
        TensorFlow only: outside the checkout, no PYTHONPATH, isolated, tfscale's packages
        blocked."""
        commands = []
        for kind, jobs in (("predict", self.predicts), ("export", self.exports)):
            plan = [{"name": f"{kind}-{case}", "log_dir": str(self.path(case, kind)),
                     "module": "tests.multiworker.command_run",
                     "args": [f"launch.{kind}", *flags]} for case, flags in jobs.items()]
            plan_path = self.directory / f"{kind}.json"
            plan_path.write_text(json.dumps(plan, indent=1))
            commands.append(["tests/multiworker/jobs.py", str(plan_path)])
        for done in python_side_by_side(commands, timeout=600):
            assert done.returncode == 0, done.stdout[-5000:]
        script = self.directory / "load_saved_models.py"
        script.write_text(LOAD_SCRIPT)
        plan_path = self.directory / "loads.json"
        plan_path.write_text(json.dumps(self.loads))
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        done = subprocess.run([sys.executable, "-I", str(script), str(plan_path),
                               str(self.directory)], cwd=self.directory, env=env,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout + done.stderr

    def outcome(self, case, kind):
        """(exit status, stdout, stderr) of the case's "predict" or "export" job."""
        log = self.path(case, kind)
        status = (log / "rank0.status").read_text()
        return int(status), (log / "rank0.stdout").read_text(), (log / "rank0.stderr").read_text()

    def predictions(self, case):
        """(CSV header, rows, the report on stdout) of the case's launch.predict, which (as its
        launch.export, if any) must have succeeded."""
        for kind in ("predict", "export") if case in self.exports else ("predict",):
            status, stdout, stderr = self.outcome(case, kind)
            assert status == 0, f"{kind}: {stdout}{stderr}"
        header, rows = read_predictions(self.path(case, "p.csv"))
        return header, rows, self.outcome(case, "predict")[1]

    def loaded(self, case):
        return dict(np.load(self.directory / f"{case}.npz"))


@pytest.fixture(scope="module")
def criteo(launched_jobs):
    """The labelled Criteo file the runs trained on and its lines without labels."""
    labelled = launched_jobs.path(CRITEO_FILE)
    return labelled, labelled.parent / "test.txt"


@pytest.fixture(scope="module")
def scored(launched_jobs, criteo, tmp_path_factory):
    """Every test's launch.predict and launch.export runs and SavedModel loads, run together
    (Scored.run) so that TensorFlow starts three times instead of about thirty."""
    from tfscale.data.criteo import CATEGORICAL_NAMES, DENSE_NAMES
    from tfscale.data.text_lines import CHUNK_LINES

    labelled, unlabelled = criteo
    scored = Scored(tmp_path_factory.mktemp("scored"))
    names = DENSE_NAMES + CATEGORICAL_NAMES
    for run in RUNS:
        checkpoint_dir = trained(launched_jobs, run)
        lines = trained_predictions(checkpoint_dir)[0] + labelled.read_text().splitlines()
        lines_path = scored.path(run, "lines.txt")
        lines_path.write_text("\n".join(lines) + "\n")
        unlabelled_path = scored.path(run, "unlabelled.txt")
        unlabelled_path.write_text("\n".join(criteo_without_label(lines)) + "\n")
        scored.predict(run, checkpoint_dir, lines_path)
        scored.export(run, checkpoint_dir)
        columns = [line.split("\t") + [""] * (len(names) - len(line.split("\t")))
                   for line in criteo_without_label(lines)]
        scored.load(run, run, {"labelled": (lines_path, 0), "unlabelled": (unlabelled_path, 0)},
                    fields={name: [column[i] for column in columns]
                            for i, name in enumerate(names)})

    checkpoint_dir = trained(launched_jobs, "deepfm-hash")
    lines, _, _ = gz_lines(trained_predictions(checkpoint_dir)[0],
                           unlabelled.read_text().splitlines(), CHUNK_LINES)
    with gzip.open(scored.path("gz", "many.txt.gz"), "wt") as stream:
        stream.write("\n".join(lines) + "\n")
    scored.path("gz", "many.txt").write_text("\n".join(lines) + "\n")
    scored.predict("gz", checkpoint_dir, scored.path("gz", "many.txt.gz"))
    scored.load("gz", "deepfm-hash", {"lines": (scored.path("gz", "many.txt"), 0)})

    negatives = [line for line in labelled.read_text().splitlines() if line.startswith("0\t")]
    scored.path("negatives", "lines.txt").write_text("\n".join(negatives[:20]) + "\n")
    scored.predict("negatives", checkpoint_dir, scored.path("negatives", "lines.txt"))

    checkpoint_dir = trained(launched_jobs, "avazu")
    lines = (trained_predictions(checkpoint_dir)[0]
             + launched_jobs.path(AVAZU_FILE).read_text().splitlines()[1:])
    unlabelled_path = scored.path("avazu", "unlabelled.csv")
    unlabelled_path.write_text("\n".join(avazu_without_label([AVAZU_HEADER] + lines)) + "\n")
    lines_path = scored.path("avazu", "lines.csv")
    lines_path.write_text("\n".join([AVAZU_HEADER] + lines) + "\n")
    scored.predict("avazu", checkpoint_dir, unlabelled_path)
    scored.export("avazu", checkpoint_dir)
    columns = avazu_without_label([AVAZU_HEADER])[0].split(",")
    values = [line.split(",") for line in avazu_without_label(lines)]
    scored.load("avazu", "avazu", {"lines": (lines_path, 1)}, fields={
        name: [v[columns.index(name)] for v in values] for name in columns if name != "id"})

    scored.predict("no-run-record", scored.path("no-run-record", "nothing"), labelled)
    scored.export("synthetic", trained(launched_jobs, "synthetic"))
    scored.run()
    return scored


@pytest.mark.parametrize("run", list(RUNS))
def test_predict_and_saved_model_score_as_the_trained_model(scored, launched_jobs, run):
    """launch.predict on a labelled file and the SavedModel's score_lines (lines with and without
    labels, whole and one by one) and serving_default (fields by name) give the trained model's
    own scores of its test lines, and agree with each other on every line of the file."""
    _, reference, global_step = trained_predictions(trained(launched_jobs, run))
    tolerance = TOLERANCE[precision_of(run)]
    n = len(reference)
    header, rows, report = scored.predictions(run)
    assert f"at global step {global_step};" in report, report
    assert "AUC " in report and "logloss" in report, report
    lines = scored.path(run, "lines.txt").read_text().splitlines()
    assert header == ["probability"] and len(rows) == len(lines)
    probabilities = np.array([row[0] for row in rows], np.float32)
    assert_scores(probabilities[:n], reference, tolerance, "launch.predict")

    loaded = scored.loaded(run)
    for name in ("labelled", "unlabelled"):
        assert_scores(loaded[name][:n], reference, tolerance, f"score_lines, {name}")
        assert_scores(loaded[name], probabilities, 1e-6, f"score_lines, {name}, vs predict")
        assert_scores(loaded[f"{name}_one_by_one"], probabilities[::97], 1e-6,
                      f"score_lines one line at a time, {name}")

    by_fields = loaded["serving_default"]
    assert_scores(by_fields[:n], reference, tolerance, "serving_default")
    assert_scores(by_fields, probabilities, 1e-6, "serving_default vs predict")


def test_predict_reads_a_gz_file_of_several_chunks_in_order(scored, criteo, launched_jobs):
    """An unlabelled .gz file longer than two read chunks (CHUNK_LINES lines each) is scored line
    for line: the trained model's test lines, placed across the first chunk boundary and at the
    end, get the trained model's scores, and every line gets score_lines' score."""
    from tfscale.data.text_lines import CHUNK_LINES

    reference_lines, reference, _ = trained_predictions(trained(launched_jobs, "deepfm-hash"))
    n = len(reference)
    lines, first, last = gz_lines(reference_lines, criteo[1].read_text().splitlines(),
                                  CHUNK_LINES)
    assert len(lines) > 2 * CHUNK_LINES
    header, rows, _ = scored.predictions("gz")
    assert header == ["probability"] and len(rows) == len(lines)
    probabilities = np.array([row[0] for row in rows], np.float32)
    assert_scores(probabilities[first:first + n], reference, TOLERANCE["float32"],
                  "across the chunk boundary")
    assert_scores(probabilities[last:], reference, TOLERANCE["float32"], "at the end")
    assert_scores(scored.loaded("gz")["lines"], probabilities, 1e-6,
                  "every line, score_lines vs predict")


def test_predict_scores_a_labelled_file_of_one_class(scored):
    """A labelled file whose labels are all 0 is scored, with its log loss and an undefined AUC
    in the report (it used to end in a traceback from the AUC)."""
    header, rows, report = scored.predictions("negatives")
    assert header == ["probability"] and len(rows) == 20
    assert "AUC undefined" in report and "logloss" in report, report


def test_avazu_predictions_keep_order_and_ids(scored, launched_jobs):
    """Avazu: launch.predict hands the id column through in order and gives the trained model's
    scores of its test lines; score_lines (labelled, with the header skipped) and
    serving_default agree."""
    _, reference, _ = trained_predictions(trained(launched_jobs, "avazu"))
    n = len(reference)
    lines = scored.path("avazu", "lines.csv").read_text().splitlines()[1:]
    header, rows, _ = scored.predictions("avazu")
    assert header == ["id", "probability"]
    assert [row[0] for row in rows] == [line.split(",")[0] for line in lines]
    probabilities = np.array([row[1] for row in rows], np.float32)
    assert_scores(probabilities[:n], reference, TOLERANCE["float32"], "launch.predict")
    loaded = scored.loaded("avazu")
    assert_scores(loaded["lines"], probabilities, 1e-6, "score_lines vs predict")
    assert_scores(loaded["serving_default"], probabilities, 1e-6, "serving_default vs predict")


def test_predict_and_export_errors_are_one_paragraph(scored, launched_jobs):
    """Predict without a run record and export of a synthetic-data run (no file format, so no
    trained predictions either) end with one paragraph and exit status 2."""
    status, _, stderr = scored.outcome("no-run-record", "predict")
    assert status == 2 and "has no run.json" in stderr, stderr
    assert "Traceback" not in stderr
    assert not os.path.exists(trained(launched_jobs, "synthetic") / "trained_predictions.json")
    status, _, stderr = scored.outcome("synthetic", "export")
    assert status == 2, stderr
    assert "trained on --data=synthetic, which has no file format to export" in stderr
    assert not os.path.exists(scored.path("synthetic", "served"))
