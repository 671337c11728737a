"""tfscale.optimizers.factory and the launcher's settings (launch.optimization_flags): which
variables each built optimizer updates at which rate (one step of unit gradients moves every
weight by its learning rate under Adam, by the rate times the gradient under SGD), the dense
learning rate's warm-up, where L2 lives (CowClip's tables versus the model's regularizers), and
the flags that override a rule's values. Flags are parsed in this process; nothing trains."""

import dataclasses

import keras
import numpy as np
import pytest
import tensorflow as tf
from absl import flags

import models
from launch import optimization_flags, train  # noqa: F401  (train defines every flag)
from tfscale.data.synthetic import SyntheticCTR
from tfscale.embedding.strategies import is_table
from tfscale.errors import UserError
from tfscale.optimizers import CowClip, FusedAdam, RowSparseAdam, RowSparseSGD, factory
from tfscale.optimizers.row_updates import RowUpdates
from tfscale.optimizers.scaling import PRESETS, Preset, large_batch_settings

FLAGS = flags.FLAGS
SCHEMA = SyntheticCTR(seed=0, train_rows=64, test_rows=64, vocabulary_scale=0.002).schema
TOUCHED_ROWS = [1, 2]


def _model(**regularization):
    keras.backend.clear_session()
    model = models.build_model("deepfm", SCHEMA, hidden_units=[8], **regularization)
    model.build()
    return model


def _moves_after_one_unit_step(optimizer, model):
    """{variable path: largest absolute change} after one step of gradients of ones (the
    tables': rows TOUCHED_ROWS, as IndexedSlices)."""
    variables = model.trainable_variables
    gradients = []
    for variable in variables:
        if is_table(variable):
            width = variable.shape[1]
            gradients.append(tf.IndexedSlices(
                tf.ones([len(TOUCHED_ROWS), width]), tf.constant(TOUCHED_ROWS, tf.int64),
                tf.constant(variable.shape, tf.int64)))
        else:
            gradients.append(tf.ones(variable.shape))
    before = [variable.numpy() for variable in variables]
    optimizer.apply(gradients, variables)
    return {variable.path: float(np.abs(variable.numpy() - old).max())
            for variable, old in zip(variables, before)}


def _expect_rates(moves, embedding_rate, dense_rate):
    table_paths = {path for path in moves if "_embedding/embeddings" in path}
    assert len(table_paths) == 2, moves  # the deep and the wide table
    for path, moved in moves.items():
        rate = embedding_rate if path in table_paths else dense_rate
        assert moved == pytest.approx(rate, rel=1e-4), (path, moved, rate)


@pytest.mark.parametrize("name, update, expected_class", [
    ("adam", "row", RowSparseAdam), ("sgd", "row", RowSparseSGD),
    ("adam", "dense", FusedAdam), ("sgd", "dense", keras.optimizers.SGD)])
def test_one_rate_without_warmup_is_one_optimizer(name, update, expected_class):
    settings = large_batch_settings(4096, "none")
    settings = dataclasses.replace(settings, embedding_learning_rate=settings.dense_learning_rate)
    optimizer = factory.build_optimizer(settings, name, warmup_steps=0, embedding_update=update)
    assert type(optimizer) is expected_class
    _expect_rates(_moves_after_one_unit_step(optimizer, _model()), 8e-4, 8e-4)


@pytest.mark.parametrize("update", ["row", "dense"])
@pytest.mark.parametrize("name", ["adam", "sgd", "adagrad"])
def test_two_rates_map_the_tables_to_the_embedding_optimizer(name, update):
    settings = large_batch_settings(4096, "sqrt")  # s = 4: both rates doubled
    optimizer = factory.build_optimizer(settings, name, warmup_steps=0, embedding_update=update)
    assert isinstance(optimizer, keras.optimizers.MultiOptimizer)
    embedding, = [o for o in optimizer.optimizers if o.name == "embedding"]
    assert isinstance(embedding, RowUpdates) == (update == "row")
    moves = _moves_after_one_unit_step(optimizer, _model())
    if name == "adagrad":  # lr * g / sqrt(0.1 + g^2): Keras's initial accumulator 0.1
        moves = {path: moved * np.sqrt(1.1) for path, moved in moves.items()}
    _expect_rates(moves, 2e-4, 16e-4)


@pytest.mark.parametrize("update, mode, embedding_class", [("dense", "faithful", FusedAdam),
                                                           ("row", "scalable", RowSparseAdam)])
def test_cowclip_takes_the_rule_rates_r_zeta_and_l2(update, mode, embedding_class):
    settings = dataclasses.replace(large_batch_settings(8192, "cowclip"), r=1e6, l2=0.0)
    optimizer = factory.build_optimizer(settings, "cowclip", warmup_steps=0,
                                        embedding_update=update)
    assert isinstance(optimizer, CowClip) and optimizer.mode == mode
    assert type(optimizer.embedding_optimizer) is embedding_class
    assert (optimizer.r, optimizer.zeta, optimizer.l2) == (1e6, settings.zeta, 0.0)
    # r = 1e6 clips nothing: the touched rows move by the kept embedding rate, the rest by
    # the dense rate sqrt(8) * 8e-4.
    _expect_rates(_moves_after_one_unit_step(optimizer, _model()), 1e-4, np.sqrt(8) * 8e-4)
    built = factory.build_optimizer(large_batch_settings(8192, "cowclip"), "cowclip", 0)
    assert (built.r, built.l2) == (1.0, pytest.approx(8e-5))


def test_the_dense_rate_warms_up_linearly_and_the_embedding_rate_does_not():
    settings = large_batch_settings(4096, "sqrt")
    optimizer = factory.build_optimizer(settings, "adam", warmup_steps=10)
    dense, = [o for o in optimizer.optimizers if o.name == "dense"]
    embedding, = [o for o in optimizer.optimizers if o.name == "embedding"]
    for step, fraction in ((0, 0.0), (5, 0.5), (10, 1.0), (40, 1.0)):
        dense.iterations.assign(step)
        embedding.iterations.assign(step)
        assert float(dense.learning_rate) == pytest.approx(1e-8 + fraction * (16e-4 - 1e-8),
                                                           rel=1e-5, abs=1e-10)
        assert float(embedding.learning_rate) == pytest.approx(2e-4)


def _regularization_loss(model):
    model({"dense": tf.zeros([1, SCHEMA.num_dense]),
           "categorical": tf.zeros([1, SCHEMA.num_categorical], tf.int64)})
    return float(sum(model.losses))


@pytest.mark.parametrize("name, update", [("cowclip", "row"), ("cowclip", "dense"),
                                          ("adam", "row"), ("adam", "dense")])
def test_l2_is_the_optimizers_for_the_tables_but_with_dense_updates(name, update):
    settings = dataclasses.replace(large_batch_settings(1024, "cowclip"), l2=1e-3)
    model = _model(**factory.model_regularization(settings, name, update))
    squares = {v.path: float(np.sum(np.square(v.numpy()))) for v in model.trainable_variables}
    regularized = [path for path in squares
                   if "_embedding/embeddings" in path or path.endswith("linear/kernel")]
    if name == "cowclip" or update == "row":  # the optimizer's, on the batch's rows
        regularized = [path for path in regularized if "_embedding" not in path]
    assert regularized, squares
    assert _regularization_loss(model) == pytest.approx(
        1e-3 * sum(squares[path] for path in regularized), rel=1e-5)


# The launcher: flags over the rule.

@pytest.fixture
def parsed():
    def parse(*argv):
        FLAGS(["launch.train", *argv])
        return optimization_flags.resolve_settings()

    yield parse
    FLAGS.unparse_flags()


@pytest.mark.parametrize("argv, rule, preset, optimizer", [
    # Unset --optimizer and --scaling_rule: the preset's rule, and the optimizer it goes with.
    ([], "sqrt", "synthetic", "adam"),
    (["--data=criteo"], "cowclip", "criteo", "cowclip"),
    (["--data=avazu"], "cowclip", "avazu", "cowclip"),
    (["--scaling_preset=avazu"], "cowclip", "avazu", "cowclip"),
    (["--scaling_preset=criteo", "--data=synthetic"], "cowclip", "criteo", "cowclip"),
    # --optimizer=cowclip: CowClip's rule from any preset.
    (["--optimizer=cowclip"], "cowclip", "synthetic", "cowclip"),
    # A rule alone: the optimizer it goes with.
    (["--scaling_rule=linear", "--data=criteo"], "linear", "criteo", "adam"),
    (["--scaling_rule=cowclip"], "cowclip", "synthetic", "cowclip"),
])
def test_the_rule_and_optimizer_for_the_batch_and_the_data(parsed, argv, rule, preset,
                                                            optimizer):
    assert parsed("--batch_size=8192", *argv) == large_batch_settings(8192, rule, preset)
    assert optimization_flags.optimizer_name() == optimizer


def test_your_own_base_is_scaled_from_its_batch(parsed):
    """The --base_* flags replace the preset's base; the rest of the preset stays."""
    settings = parsed("--batch_size=65536", "--base_batch_size=4096", "--base_learning_rate=1e-3",
                      "--base_embedding_learning_rate=2e-3")
    assert settings == large_batch_settings(65536, "sqrt", dataclasses.replace(
        PRESETS["synthetic"], batch_size=4096, dense_learning_rate=1e-3,
        embedding_learning_rate=2e-3))
    assert (settings.dense_learning_rate, settings.embedding_learning_rate) == (
        pytest.approx(4e-3), pytest.approx(8e-3))
    FLAGS.unparse_flags()
    with pytest.raises(UserError, match="--base_learning_rate gives a base for a rule to scale, "
                       "and --optimizer=adam runs without one: add --scaling_rule"):
        parsed("--optimizer=adam", "--base_learning_rate=1e-3")


def test_the_presets_rule_is_what_won_on_its_data():
    """criteo and avazu: CowClip's (the paper's result on those data sets); synthetic: sqrt
    (benchmarks.cowclip_tuned on the built-in data)."""
    assert {name: preset.rule for name, preset in PRESETS.items()} == {
        "criteo": "cowclip", "avazu": "cowclip", "synthetic": "sqrt"}
    assert large_batch_settings(8192, preset="synthetic") == large_batch_settings(
        8192, "sqrt", "synthetic")
    assert large_batch_settings(8192) == large_batch_settings(8192, "cowclip", "criteo")
    with pytest.raises(ValueError, match="Preset rule must be one of"):
        Preset(dense_learning_rate=1e-3, rule="cubic")


@pytest.mark.parametrize("flag, value, field", [
    ("learning_rate", 0.01, "dense_learning_rate"),
    ("embedding_learning_rate", 0.02, "embedding_learning_rate"),
    ("l2", 3e-5, "l2"),
    ("zeta", 0.5, "zeta"),
    ("clip_r", 2.0, "r"),
    ("warmup_epochs", 0.25, "warmup_epochs"),
    ("embedding_init_stddev", 0.05, "embedding_init_stddev"),
])
def test_each_flag_overrides_its_value_only(parsed, flag, value, field):
    rule = large_batch_settings(8192, "cowclip", "synthetic")  # the default --data
    assert parsed("--batch_size=8192", "--optimizer=cowclip", f"--{flag}={value}") == \
        dataclasses.replace(rule, **{field: value})


@pytest.mark.parametrize("optimizer, dense_rate", [("adam", 1e-3), ("came", 1e-3),
                                                   ("sgd", 1e-3)])
def test_without_a_rule_one_rate_no_warmup_no_l2(parsed, optimizer, dense_rate):
    settings = parsed(f"--optimizer={optimizer}", "--batch_size=8192")
    assert (settings.rule, settings.dense_learning_rate, settings.embedding_learning_rate,
            settings.warmup_epochs, settings.l2, settings.clip) == (
        "flags", dense_rate, dense_rate, 0.0, 0.0, False)


def test_a_baseline_rule_for_another_optimizer(parsed):
    assert parsed("--optimizer=adam", "--scaling_rule=linear", "--batch_size=2048") == \
        large_batch_settings(2048, "linear", "synthetic")


@pytest.mark.parametrize("argv", [["--optimizer=adam", "--scaling_rule=cowclip"],
                                  ["--optimizer=cowclip", "--scaling_rule=sqrt"]])
def test_the_cowclip_rule_goes_with_cowclip_only(parsed, argv):
    with pytest.raises(UserError, match="--optimizer=cowclip and --scaling_rule=cowclip go "
                                        "together"):
        parsed(*argv)


def test_warmup_steps_override_and_unknown_epoch_length(parsed):
    settings = parsed("--optimizer=adam", "--scaling_rule=sqrt", "--warmup_steps=7")
    optimizer = optimization_flags.build_optimizer(settings, steps_per_epoch=None)
    dense, = [o for o in optimizer.optimizers if o.name == "dense"]
    dense.iterations.assign(7)
    assert float(dense.learning_rate) == pytest.approx(settings.dense_learning_rate)
    FLAGS.unparse_flags()
    settings = parsed("--optimizer=adam", "--scaling_rule=sqrt")
    with pytest.raises(UserError, match="give --warmup_steps"):
        optimization_flags.build_optimizer(settings, steps_per_epoch=None)
