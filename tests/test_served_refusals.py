"""A served model refuses the lines training refuses: the SavedModel's score_lines and
launch.predict's FilePredictions stop at a line with a non-integer in an integer field, an
integer beyond int64 or an empty line, with an error naming the request line (or the file and
line), and still score good lines. A small DeepFM is exported in this process."""

import numpy as np
import pytest
import tensorflow as tf

import models
from tests.test_criteo import HAND_LINES, criteo_line, numbered_lines, write
from tfscale.data.criteo import CATEGORICAL_NAMES, DENSE_NAMES, CriteoFormat
from tfscale.data.preprocessing import Preprocessing
from tfscale.data.text_lines import INT64_RANGE, LineLayout
from tfscale.errors import user_error_from_tf
from tfscale.serving.export import RawInputs, export_saved_model
from tfscale.serving.prediction import FilePredictions

GOOD_LINES = HAND_LINES + numbered_lines(3)
BAD_LINES = {
    "not an integer": (criteo_line(1, ["abc"] + [1] * 12, ["a"] * 26),
                       "I1 must be an integer, found 'abc'"),
    "beyond int64": (criteo_line(1, ["99999999999999999999999"] + [1] * 12, ["a"] * 26),
                     f"I1 must be an integer in int64's range ({INT64_RANGE}), found "
                     "'99999999999999999999999'"),
    "below int64": (criteo_line(0, [1] * 5 + ["-9223372036854775809"] + [1] * 7, ["a"] * 26),
                    f"I6 must be an integer in int64's range ({INT64_RANGE}), found "
                    "'-9223372036854775809'"),
    "empty": ("", "the line is empty"),
}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(preprocessing, model, the loaded SavedModel's score_lines)."""
    preprocessing = Preprocessing(CriteoFormat(), hash_buckets=50)
    model = models.build_model("deepfm", preprocessing.schema, embedding_dim=4,
                               hidden_units=[8])
    layout = LineLayout(("label",) + DENSE_NAMES + CATEGORICAL_NAMES)
    path = str(tmp_path_factory.mktemp("served") / "1")
    export_saved_model(model, preprocessing, RawInputs(CriteoFormat(), layout), path)
    return preprocessing, model, tf.saved_model.load(path).signatures["score_lines"]


def refusal(call):
    """The user-facing message of the data error `call()` raises."""
    with pytest.raises(tf.errors.InvalidArgumentError) as caught:
        call()
    error = user_error_from_tf(caught.value)
    assert error is not None, caught.value
    return str(error)


def score(score_lines, lines):
    return score_lines(lines=tf.constant(lines))["probability"].numpy()


@pytest.mark.parametrize("labelled", [True, False])
@pytest.mark.parametrize("case", list(BAD_LINES))
def test_score_lines_refuses_a_bad_line_naming_it(served, case, labelled):
    _, _, score_lines = served
    bad, problem = BAD_LINES[case]
    lines = list(GOOD_LINES)
    if not labelled:
        lines = [line.split("\t", 1)[1] for line in lines]
        bad = bad.split("\t", 1)[1] if bad else bad  # the same problem without the label
    request = lines[:2] + [bad] + lines[2:]
    assert refusal(lambda: score(score_lines, request)) == f"request line 3: {problem}"
    good = score(score_lines, lines)
    assert good.shape == (len(lines),) and np.all((good > 0) & (good < 1))


@pytest.mark.parametrize("case", list(BAD_LINES))
def test_file_predictions_refuse_a_bad_line_naming_file_and_line(served, tmp_path, case):
    preprocessing, model, score_lines = served
    bad, problem = BAD_LINES[case]
    path = write(tmp_path / "score.txt", GOOD_LINES[:3] + [bad] + GOOD_LINES[3:])
    predictions = FilePredictions(model, preprocessing, path, batch_size=2)
    assert refusal(lambda: list(predictions)) == f"{path} line 4: {problem}"
    good = write(tmp_path / "good.txt", GOOD_LINES)
    scored = np.concatenate([p for p, _, _ in FilePredictions(model, preprocessing, good)])
    np.testing.assert_allclose(scored, score(score_lines, GOOD_LINES), rtol=0, atol=1e-6)
