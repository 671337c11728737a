"""The launcher's flag matrix: every flag of `python -m launch.train` that shapes what is built,
each value of its enumerations, in small one-epoch runs, each asserting what the flag must change
(the optimizer's rates, warm-up, L2 and CowClip settings, the tables, layers, dtype policy, loss
scaling, exchange, data split and order, initial weights).

The runs share two processes side by side (tests/launcher_matrix.py, which reports what each run
built), so that TensorFlow starts only twice and both cores work; expected values come from the
flags' contract (the scaling rules of tfscale.optimizers.scaling, the files' contents), not from
earlier output."""

import importlib
import json
import math
import random
import subprocess
import sys

import pytest

from tests.horovod_launch import REPO_ROOT, python_side_by_side
from tfscale.optimizers.scaling import PRESETS

BATCH = 128
SYNTHETIC = ["--train_rows=512", "--test_rows=256", "--synthetic_vocabulary_scale=0.002",
             "--dnn_units=16", f"--batch_size={BATCH}"]
SYNTHETIC_STEPS = 512 // BATCH  # steps per epoch of SYNTHETIC
CRITEO_LINES, CRITEO_TEST_LINES, AVAZU_LINES = 1000, 300, 600
CRITEO = ["--data=criteo", "--train_path={data}/criteo.txt", "--dnn_units=16",
          f"--batch_size={BATCH}", "--vocabulary_cache_dir={data}/cache"]
CRITEO_TEST = "--test_path={data}/criteo_test.txt"
AVAZU = ["--data=avazu", "--train_path={data}/avazu.csv", "--test_path={data}/avazu_test.csv",
         "--dnn_units=16", f"--batch_size={BATCH}", "--vocabulary_cache_dir={data}/cache"]
ADAM = [*SYNTHETIC, "--optimizer=adam"]
COWCLIP = [*SYNTHETIC, "--optimizer=cowclip"]  # the default on the built-in data is Adam, sqrt

# name -> flags; every case runs one epoch with --logdir=none --checkpoint_dir=none.
CASES = {
    "default": SYNTHETIC,
    "seed_0_again": SYNTHETIC,
    "seed_1": [*SYNTHETIC, "--seed=1"],
    # flags whose checks are independent share a case (a case costs a model build and a trace)
    "nondeterministic_no_dedup": [*SYNTHETIC, "--nodeterministic", "--nodedup_ids"],
    "cowclip_dense": [*COWCLIP, "--embedding_update=dense"],
    "cowclip_rule_batch_256": [*SYNTHETIC, "--batch_size=256", "--scaling_rule=cowclip",
                               # CowClip and the defaults, given
                               "--data=synthetic", "--optimizer=cowclip", "--model=deepfm",
                               "--embedding_update=row", "--embedding_comm=allgather",
                               "--scaling_preset=synthetic",
                               "--precision=float32", "--deterministic", "--dedup_ids",
                               "--table_dtype=float32"],
    "cowclip_avazu_preset": [*SYNTHETIC, "--scaling_preset=avazu"],
    "cowclip_criteo_preset": [*SYNTHETIC, "--scaling_preset=criteo"],
    "cowclip_overrides": [*COWCLIP, "--learning_rate=0.003", "--embedding_learning_rate=0.0005",
                          "--l2=0.0002", "--clip_r=0.5", "--zeta=0.002", "--warmup_steps=3"],
    "init_stddev_embedding_dim_4": [*SYNTHETIC, "--embedding_init_stddev=0.05",
                                    "--embedding_dim=4"],
    "adam": ADAM,
    "came": [*SYNTHETIC, "--optimizer=came"],
    "came_dense": [*SYNTHETIC, "--optimizer=came", "--embedding_update=dense"],
    "adagrad": [*SYNTHETIC, "--optimizer=adagrad"],
    "sgd": [*SYNTHETIC, "--optimizer=sgd"],
    "rowwise_adagrad_bfloat16": [*SYNTHETIC, "--optimizer=rowwise_adagrad",
                                 "--embedding_learning_rate=0.02", "--table_dtype=bfloat16"],
    "adam_float16_tables": [*ADAM, "--table_dtype=float16"],
    "adam_rule_none": [*ADAM, "--scaling_rule=none"],
    "adam_rule_sqrt": [*ADAM, "--scaling_rule=sqrt"],
    "adam_rule_sqrt_dense": [*ADAM, "--scaling_rule=sqrt", "--embedding_update=dense"],
    "adam_rule_linear": [*ADAM, "--scaling_rule=linear"],
    "adam_rate_and_l2": [*ADAM, "--learning_rate=0.01", "--l2=0.001"],
    "sgd_embedding_rate": [*SYNTHETIC, "--optimizer=sgd", "--embedding_learning_rate=0.05"],
    "wide_deep_no_warmup": [*SYNTHETIC, "--model=wide_deep", "--warmup_epochs=0"],
    "dcn_warmup_half_epoch": [*SYNTHETIC, "--model=dcn", "--cross_layers=2",
                              "--warmup_epochs=0.5"],
    "dcn_v2": [*SYNTHETIC, "--model=dcn_v2", "--cross_layers=1"],
    "dcn_v2_experts_comm_dense": [*SYNTHETIC, "--model=dcn_v2", "--cross_layers=2",
                                  "--cross_experts=3", "--embedding_comm=dense"],
    "comm_topk": [*ADAM, "--embedding_comm=topk", "--notopk_dense_gradients"],
    "comm_topk_full_warmup": [*ADAM, "--embedding_comm=topk", "--density_warmup=1.0"],
    "comm_gtopk": [*ADAM, "--embedding_comm=gtopk", "--density=0.01", "--density_warmup=0.05",
                   "--density_warmup_epochs=2", "--topk_dense_gradients"],
    "bfloat16": [*COWCLIP, "--precision=mixed_bfloat16"],
    "float16": [*COWCLIP, "--precision=mixed_float16"],
    "float16_fixed_scale": [*COWCLIP, "--precision=mixed_float16", "--loss_scale=1024"],
    "float16_no_scale": [*COWCLIP, "--precision=mixed_float16", "--loss_scale=none"],
    "float32_dynamic_scale": [*COWCLIP, "--loss_scale=dynamic", "--loss_scale_growth_steps=2"],
    "criteo_vocabulary": [*CRITEO, CRITEO_TEST, "--categorical_encoding=vocabulary",
                          "--integer_transform=log1p"],
    "criteo_vocabulary_file_minmax": [*CRITEO, CRITEO_TEST, "--vocabulary={data}/vocab.json",
                                      "--integer_transform=minmax"],
    "criteo_shuffled": [*CRITEO, CRITEO_TEST, "--shuffle_buffer=256"],
    "criteo_hash": [*CRITEO, CRITEO_TEST, "--categorical_encoding=hash", "--hash_buckets=50",
                    "--nofit_hash_buckets"],
    "criteo_hash_fitted": [*CRITEO, CRITEO_TEST, "--categorical_encoding=hash",
                           "--hash_buckets=50", "--fit_hash_buckets"],
    "criteo_split": CRITEO,
    "criteo_split_0.3": [*CRITEO, "--test_fraction=0.3"],
    "avazu": AVAZU,
    "avazu_hash_criteo_preset": [*AVAZU, "--categorical_encoding=hash", "--hash_buckets=20",
                                 "--nofit_hash_buckets", "--scaling_preset=criteo"],
}

COVERED_FLAGS = (
    "data", "model", "optimizer", "embedding_comm", "precision", "loss_scale",
    "categorical_encoding", "vocabulary", "integer_transform", "test_path", "test_fraction",
    "shuffle_buffer", "seed", "deterministic", "embedding_dim", "cross_layers", "cross_experts",
    "density", "density_warmup", "density_warmup_epochs", "topk_dense_gradients", "dedup_ids",
    "clip_r", "zeta", "l2", "learning_rate", "embedding_learning_rate", "embedding_init_stddev",
    "warmup_epochs", "warmup_steps", "scaling_rule", "scaling_preset", "embedding_update",
    "hash_buckets", "fit_hash_buckets", "loss_scale_growth_steps", "table_dtype",
)
# Values of covered flags run by other tests' launches: those that go with --progressive
# (training day by day, not by epochs as every case here; tests/test_progressive.py runs and
# refuses them) and the fingerprint encoding of dynamic tables (a 2-rank run of
# tests/test_predict_export.py trains with it, then predicts and exports).
ELSEWHERE_VALUES = {"--data": {"drifting"}, "--categorical_encoding": {"raw", "fingerprint"}}

AVAZU_HEADER = ("id,click,hour,C1,banner_pos,site_id,site_domain,site_category,app_id,app_domain,"
                "app_category,device_id,device_ip,device_model,device_type,device_conn_type,"
                "C14,C15,C16,C17,C18,C19,C20,C21")
AVAZU_FIELDS = AVAZU_HEADER.split(",")[3:]
AVAZU_DERIVED_SIZES = [25, 8]  # hour of day, day of week (+ missing)


# ----------------------------------------------------------------------------- data

def _value(rng, field, pool):
    """A skewed pick from a field's pool of `pool` values (some seen often, most rarely)."""
    return f"{(field * 7919 + int(pool * rng.random() ** 2)) * 2654435761 % (1 << 32):08x}"


def _criteo_lines(rng, count):
    lines = []
    for _ in range(count):
        integers = ["" if rng.random() < 0.1 else str(int(rng.expovariate(0.05)) - 2 * (j == 1))
                    for j in range(13)]
        categorical = ["" if rng.random() < 0.05 else _value(rng, f, 3 + 9 * f)
                       for f in range(26)]
        lines.append("\t".join([str(int(rng.random() < 0.3)), *integers, *categorical]) + "\n")
    return lines


def _avazu_lines(rng, count):
    lines = [AVAZU_HEADER + "\n"]
    for i in range(count):
        hour = f"1410{21 + rng.randrange(7):02d}{rng.randrange(24):02d}"
        fields = [_value(rng, f, 2 + 11 * f) for f in range(len(AVAZU_FIELDS))]
        lines.append(",".join([str(10 ** 19 + i), str(int(rng.random() < 0.2)), hour, *fields])
                     + "\n")
    return lines


def _rows(path):
    """The fields of each line of a Criteo file, or of an Avazu file by column name."""
    with open(path) as f:
        lines = f.read().splitlines()
    if path.endswith(".csv"):
        return [dict(zip(AVAZU_HEADER.split(","), line.split(","))) for line in lines[1:]]
    return [line.split("\t") for line in lines]


def _counts(rows, column):
    counts = {}
    for row in rows:
        if row[column]:
            counts[row[column]] = counts.get(row[column], 0) + 1
    return counts


def _criteo_counts(data):
    """Per categorical field C1..C26: {value: count} in the Criteo training file."""
    rows = _rows(f"{data}/criteo.txt")
    return [_counts(rows, 14 + f) for f in range(26)]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """The directory of the small Criteo and Avazu files and a vocabulary file of the Criteo
    training file (by `python -m launch.build_vocab`)."""
    directory = tmp_path_factory.mktemp("matrix")
    rng = random.Random(5)
    for name, lines in (("criteo.txt", _criteo_lines(rng, CRITEO_LINES)),
                        ("criteo_test.txt", _criteo_lines(rng, CRITEO_TEST_LINES)),
                        ("avazu.csv", _avazu_lines(rng, AVAZU_LINES)),
                        ("avazu_test.csv", _avazu_lines(rng, 200))):
        (directory / name).write_text("".join(lines))
    built = subprocess.run(
        [sys.executable, "-m", "launch.build_vocab", "--format=criteo",
         f"--input={directory}/criteo.txt", "--min_count=1", f"--output={directory}/vocab.json"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    return str(directory)


@pytest.fixture(scope="module")
def facts(data, tmp_path_factory):
    """{case: what its run built} from two runs of tests/launcher_matrix.py side by side, one
    over each half of CASES (the seed and determinism cases, first, share a process)."""
    names = list(CASES)
    directory = tmp_path_factory.mktemp("cases")
    halves = []
    for half, part in enumerate((names[:len(names) // 2], names[len(names) // 2:])):
        cases = {name: [flag.format(data=data) for flag in CASES[name]] for name in part}
        halves.append(directory / f"cases{half}.json")
        halves[-1].write_text(json.dumps(cases))
    reported = []
    for result in python_side_by_side([["tests/launcher_matrix.py", str(cases)]
                                       for cases in halves], timeout=900):
        assert result.returncode == 0, result.stdout[-5000:]
        reported += [json.loads(line[len("MATRIX "):]) for line in result.stdout.splitlines()
                     if line.startswith("MATRIX ")]
    return {case.pop("case"): case for case in reported}


def run(facts, name):
    """The facts of case `name`, which must have run to the end."""
    case = facts[name]
    assert "error" not in case, case["traceback"]
    assert case["global_step"] >= 1 and 0.0 <= case["test_auc"] <= 1.0
    return case


def warmup(target, steps):
    """The dense rate's schedule: linear from 1e-8 to `target` over `steps`, then flat."""
    return {"warmup_steps": steps, "target": pytest.approx(target, rel=1e-6),
            "values": pytest.approx([1e-8 + (target - 1e-8) * min(step, steps) / steps
                                     for step in range(steps + 2)], rel=1e-5, abs=target * 1e-6)}


def inner(case, role):
    """The facts of the inner optimizer named `role` ("embedding" or "dense")."""
    return case["optimizer"]["inner"][role]


# ----------------------------------------------------------------------------- the optimizer

def test_every_case_reported(facts):
    assert sorted(facts) == sorted(CASES)


def test_every_flag_and_value_is_given_in_some_case():
    """Each covered flag appears in a case; each value of an enumerated one (models, optimizers,
    exchanges, ... from their registries) and both forms of a boolean one."""
    from absl import flags

    importlib.import_module("launch.train")  # defines the flags
    given = {}
    for flag in (flag for case_flags in CASES.values() for flag in case_flags):
        name, _, value = flag.partition("=")
        given.setdefault(name, set()).add(value)
    for name in COVERED_FLAGS:
        definition = flags.FLAGS[name]
        if isinstance(definition, flags.BooleanFlag):
            assert f"--{name}" in given and f"--no{name}" in given, name
        elif isinstance(definition, flags.EnumFlag):
            values = set(definition.parser.enum_values) - ELSEWHERE_VALUES.get(f"--{name}", set())
            assert given.get(f"--{name}") == values, name
        else:
            assert f"--{name}" in given, name
    assert {"dynamic", "none"} < given["--loss_scale"] and len(given["--loss_scale"]) == 3


@pytest.mark.parametrize("name, batch, preset", [
    ("cowclip_rule_batch_256", 256, "synthetic"),
    ("cowclip_avazu_preset", BATCH, "avazu"),
    ("cowclip_criteo_preset", BATCH, "criteo"),
])
def test_cowclip_rule(facts, name, batch, preset):
    """s = batch/1024: the preset's embedding lr kept, its dense lr x sqrt(s) warmed up over one
    epoch, its L2 x s on CowClip (the model keeps only the dense features' share), r 1, its zeta
    below batch 4096. The synthetic data's own preset unless another is named."""
    case = run(facts, name)
    s = batch / 1024
    base = PRESETS[preset]
    optimizer = case["optimizer"]
    assert optimizer["class"] == "CowClip" and optimizer["mode"] == "scalable"
    assert optimizer["by_variable"] == {"deep_table": "embedding", "wide_table": "embedding",
                                        "dense": "dense"}
    assert inner(case, "embedding") == {
        "class": "RowSparseAdam", "name": "embedding", "table_l2": 0.0,
        "learning_rate": pytest.approx(base.embedding_learning_rate, rel=1e-6)}
    assert inner(case, "dense")["learning_rate"] == warmup(
        base.dense_learning_rate * math.sqrt(s), 512 // batch)
    assert optimizer["l2"] == pytest.approx(base.l2 * s)
    assert optimizer["r"] == 1.0
    assert optimizer["zeta"] == base.zeta_small_batch
    assert case["model"]["l2"] == {"embedding": 0.0, "wide": 0.0,
                                   "linear": pytest.approx(base.l2 * s)}
    assert not case["model"]["deep_table_regularized"]


def test_the_default_on_the_built_in_data_is_adam_with_sqrt_scaling(facts):
    """No --optimizer or --scaling_rule: the synthetic preset's rule, the one that kept AUC at
    large batch on this data (docs/results/cowclip_tuned.md)."""
    default = run(facts, "default")
    assert default["optimizer"] == run(facts, "adam_rule_sqrt")["optimizer"]
    assert default["model"]["l2"] == run(facts, "adam_rule_sqrt")["model"]["l2"]


def test_criteo_and_avazu_presets_are_cowclips_published_bases():
    """The official commands' bases (README of the CowClip code): Criteo embedding lr 1e-4,
    dense 8e-4, L2 1e-5, zeta 1e-5; Avazu dense 1e-4, zeta 1e-3 below batch 4096, 1e-4 above."""
    criteo, avazu = PRESETS["criteo"], PRESETS["avazu"]
    assert (criteo.embedding_learning_rate, criteo.dense_learning_rate, criteo.l2) == (
        1e-4, 8e-4, 1e-5)
    assert (criteo.zeta(1024), criteo.zeta(65536)) == (1e-5, 1e-5)
    assert (avazu.embedding_learning_rate, avazu.dense_learning_rate, avazu.l2) == (
        1e-4, 1e-4, 1e-5)
    assert (avazu.zeta(2048), avazu.zeta(4096)) == (1e-3, 1e-4)


def test_cowclip_updates_the_tables_by_row_unless_dense_updates_are_asked_for(facts):
    case = run(facts, "cowclip_dense")
    assert case["optimizer"]["mode"] == "faithful"
    assert inner(case, "embedding")["class"] == "FusedAdam"
    assert not case["model"]["deep_table_regularized"]  # CowClip's L2 either way


def test_optimizer_flags_override_the_rule(facts):
    case = run(facts, "cowclip_overrides")
    optimizer = case["optimizer"]
    assert inner(case, "embedding")["learning_rate"] == pytest.approx(5e-4, rel=1e-6)
    assert inner(case, "dense")["learning_rate"] == warmup(3e-3, 3)  # --warmup_steps=3
    assert (optimizer["l2"], optimizer["r"], optimizer["zeta"]) == (2e-4, 0.5, 2e-3)
    assert case["model"]["l2"]["linear"] == 2e-4


@pytest.mark.parametrize("name, steps", [("dcn_warmup_half_epoch", SYNTHETIC_STEPS // 2),
                                         ("default", SYNTHETIC_STEPS)])
def test_warmup_epochs_set_the_schedule_length(facts, name, steps):
    dense = inner(run(facts, name), "dense")["learning_rate"]
    assert dense == warmup(PRESETS["synthetic"].dense_learning_rate * math.sqrt(BATCH / 1024),
                           steps)


def test_no_warmup_gives_a_constant_dense_rate(facts):
    dense = inner(run(facts, "wide_deep_no_warmup"), "dense")["learning_rate"]
    assert dense == pytest.approx(
        PRESETS["synthetic"].dense_learning_rate * math.sqrt(BATCH / 1024), rel=1e-6)


@pytest.mark.parametrize("name, optimizer_class, rate", [
    ("adam", "RowSparseAdam", 1e-3),
    ("adagrad", "RowSparseAdagrad", 1e-3),
    ("sgd", "RowSparseSGD", 1e-3),
    ("adam_rate_and_l2", "RowSparseAdam", 1e-2),
    ("came", "RowSparseCAME", 1e-3),
])
def test_optimizer_without_rule_is_one_row_sparse_optimizer_at_its_default_rate(
        facts, name, optimizer_class, rate):
    """No rule: one rate for every variable, no warm-up, so no map of optimizers; the tables'
    L2 (--l2, default 0) is the optimizer's, on the batch's rows, the linear kernel's the
    model's."""
    case = run(facts, name)
    l2 = 1e-3 if "--l2=0.001" in CASES[name] else 0.0
    assert case["optimizer"] == {"class": optimizer_class, "name": case["optimizer"]["name"],
                                 "learning_rate": pytest.approx(rate, rel=1e-6), "table_l2": l2}
    assert case["model"]["l2"] == {"embedding": 0.0, "wide": 0.0, "linear": l2}
    assert not case["model"]["deep_table_regularized"]


@pytest.mark.parametrize("name, table_optimizer, dtype", [
    ("rowwise_adagrad_bfloat16", "RowWiseAdagrad", "bfloat16"),
    ("adam_float16_tables", "RowSparseAdam", "float16"),
    ("adam", "RowSparseAdam", "float32"),
])
def test_table_optimizer_and_dtype(facts, name, table_optimizer, dtype):
    """--optimizer=rowwise_adagrad: RowWiseAdagrad for the tables at --embedding_learning_rate,
    Adam for the dense weights; --table_dtype stores the tables' rows."""
    case = run(facts, name)
    assert case["model"]["table_dtype"] == dtype
    if name == "rowwise_adagrad_bfloat16":
        assert inner(case, "embedding")["class"] == table_optimizer
        assert inner(case, "embedding")["learning_rate"] == pytest.approx(0.02, rel=1e-6)
        assert inner(case, "dense")["class"] == "FusedAdam"
    else:
        assert case["optimizer"]["class"] == table_optimizer


def test_came_on_every_row_is_the_papers_came(facts):
    """--embedding_update=dense: CAME on every row of the tables (the by-row CAME is the
    default, above)."""
    dense = run(facts, "came_dense")["optimizer"]
    assert dense == {"class": "CAME", "name": "dense",
                     "learning_rate": pytest.approx(1e-3, rel=1e-6)}


@pytest.mark.parametrize("name, factor", [
    ("adam_rule_none", 1.0),
    ("adam_rule_sqrt", math.sqrt(BATCH / 1024)),
    ("adam_rule_linear", BATCH / 1024),
])
def test_baseline_rules_give_an_optimizer_map(facts, name, factor):
    """none/sqrt/linear scale both base rates of the synthetic preset by 1, sqrt(s) or s, the
    dense one warmed up over an epoch: a MultiOptimizer over an OptimizerMap sends the tables to
    the embedding's row-sparse Adam, which applies the base L2 to their rows; the model keeps
    the linear kernel's."""
    case = run(facts, name)
    base = PRESETS["synthetic"]
    optimizer = case["optimizer"]
    assert optimizer["class"] == "MultiOptimizer"
    assert optimizer["by_variable"] == {"deep_table": "embedding", "wide_table": "embedding",
                                        "dense": "dense"}
    assert inner(case, "embedding") == {"class": "RowSparseAdam", "name": "embedding",
                                        "learning_rate": pytest.approx(
                                            base.embedding_learning_rate * factor, rel=1e-6),
                                        "table_l2": base.l2}
    assert inner(case, "dense")["class"] == "FusedAdam"
    assert inner(case, "dense")["learning_rate"] == warmup(
        base.dense_learning_rate * factor, SYNTHETIC_STEPS)
    assert case["model"]["l2"] == {"embedding": 0.0, "wide": 0.0, "linear": base.l2}
    assert not case["model"]["deep_table_regularized"]


def test_dense_embedding_updates_put_the_l2_on_the_model(facts):
    case = run(facts, "adam_rule_sqrt_dense")
    base = PRESETS["synthetic"]
    assert inner(case, "embedding")["class"] == "FusedAdam"
    assert case["model"]["l2"] == {"embedding": base.l2, "wide": base.l2, "linear": base.l2}
    assert case["model"]["deep_table_regularized"]


def test_embedding_learning_rate_alone_splits_the_optimizer(facts):
    case = run(facts, "sgd_embedding_rate")
    assert case["optimizer"]["class"] == "MultiOptimizer"
    assert inner(case, "embedding") == {"class": "RowSparseSGD", "name": "embedding",
                                        "learning_rate": pytest.approx(0.05, rel=1e-6),
                                        "table_l2": 0.0}
    assert inner(case, "dense") == {"class": "SGD", "name": "dense",
                                    "learning_rate": pytest.approx(1e-3, rel=1e-6)}


# ----------------------------------------------------------------------------- the model

@pytest.mark.parametrize("name, model_class", [
    ("default", "DeepFM"), ("cowclip_rule_batch_256", "DeepFM"), ("wide_deep_no_warmup", "WideDeep"),
    ("dcn_warmup_half_epoch", "DCN"), ("dcn_v2", "DCNv2")])
def test_model_flag_picks_the_model(facts, name, model_class):
    assert run(facts, name)["model"]["class"] == model_class




def test_cross_layers_and_experts(facts):
    dcn = run(facts, "dcn_warmup_half_epoch")["model"]["cross"]
    width = 26 * 10 + 13  # flattened embeddings and dense features
    assert dcn == [{"class": "CrossNetwork", "kernel": [width, 1]}] * 2
    assert run(facts, "dcn_v2")["model"]["cross"] == [{"class": "FeatureCross", "experts": 1}]
    assert run(facts, "dcn_v2_experts_comm_dense")["model"]["cross"] == [
        {"class": "MixtureCross", "experts": 3}] * 2


def test_embedding_dim_sets_the_table_width(facts):
    default = run(facts, "default")["model"]
    narrow = run(facts, "init_stddev_embedding_dim_4")["model"]
    assert default["deep_table"][1] == 10 and narrow["deep_table"][1] == 4
    assert narrow["deep_table"][0] == default["deep_table"][0] == sum(default["vocabulary_sizes"])
    assert narrow["wide_table_rows"] == default["wide_table_rows"] == default["deep_table"][0]


def test_embedding_init_stddev_sets_the_initial_table_spread(facts):
    assert run(facts, "default")["initial_table_std"] == pytest.approx(
        PRESETS["synthetic"].embedding_init_stddev, rel=0.02)
    assert run(facts, "init_stddev_embedding_dim_4")["initial_table_std"] == pytest.approx(
        5e-2, rel=0.02)


def test_dedup_ids(facts):
    """De-duplicated lookups report the batch's unique-id rate; plain ones do not."""
    for name in ("default", "cowclip_rule_batch_256"):
        dedup = run(facts, name)
        assert dedup["model"]["deduplicate"] and 0.0 < dedup["unique_id_rate"] < 1.0
    plain = run(facts, "nondeterministic_no_dedup")
    assert not plain["model"]["deduplicate"] and plain["unique_id_rate"] is None


# ----------------------------------------------------------------------------- seeds

def test_seed_sets_the_initial_weights_and_deterministic_repeats_the_run(facts):
    first, again, other = (run(facts, n) for n in ("default", "seed_0_again", "seed_1"))
    assert first["initial"] == again["initial"] and first["final"] == again["final"]
    assert other["initial"] != first["initial"]
    assert other["initial_table_head"] != first["initial_table_head"]


def test_deterministic_flag_turns_op_determinism_on(facts):
    assert run(facts, "default")["op_determinism"] is True
    assert run(facts, "cowclip_rule_batch_256")["op_determinism"] is True
    assert run(facts, "nondeterministic_no_dedup")["op_determinism"] is False


# ----------------------------------------------------------------------------- precision

@pytest.mark.parametrize("name, policy, compute", [
    ("default", "float32", "float32"),
    ("cowclip_rule_batch_256", "float32", "float32"),
    ("bfloat16", "mixed_bfloat16", "bfloat16"),
    ("float16", "mixed_float16", "float16"),
])
def test_precision_sets_the_dtype_policy(facts, name, policy, compute):
    model = run(facts, name)["model"]
    assert (model["policy"], model["compute_dtype"], model["variable_dtype"]) == (
        policy, compute, "float32")


@pytest.mark.parametrize("name, scale", [
    ("cowclip_rule_batch_256", None),
    ("bfloat16", None),
    ("float16", {"initial": 2.0 ** 15, "dynamic": True, "growth_steps": 2000}),
    ("float16_fixed_scale", {"initial": 1024.0, "dynamic": False, "growth_steps": 2000,
                             "final": 1024.0}),
    ("float16_no_scale", None),
    ("float32_dynamic_scale", {"initial": 2.0 ** 15, "dynamic": True, "growth_steps": 2}),
])
def test_loss_scale(facts, name, scale):
    """--loss_scale's scaler or none (float16 defaults to dynamic; with --loss_scale=none Keras
    must not add its own)."""
    optimizer = run(facts, name)["optimizer"]
    if scale is None:
        assert optimizer["class"] == "CowClip"
        return
    assert optimizer["class"] == "LossScaleOptimizer"
    assert {key: optimizer["loss_scale"][key] for key in scale} == scale
    assert optimizer["inner"]["class"] == "CowClip"


# ----------------------------------------------------------------------------- exchanges

@pytest.mark.parametrize("name, exchange_class", [
    ("default", "AllgatherExchange"),
    ("cowclip_rule_batch_256", "AllgatherExchange"),
    ("dcn_v2_experts_comm_dense", "DenseExchange"),
    ("comm_topk", "TopKAllgatherExchange"),
    ("comm_gtopk", "GTopKExchange"),
])
def test_embedding_comm_picks_the_exchange(facts, name, exchange_class):
    assert run(facts, name)["exchange"]["class"] == exchange_class


def test_topk_sparsifies_in_one_process(facts):
    """Density 0.001 (188 of 187k rows a step) leaves rows in the error-feedback residual; a
    warm-up density of 1 over the whole epoch sends every row, leaving none; only tables are
    sparsified without --topk_dense_gradients."""
    sparse = run(facts, "comm_topk")["exchange"]
    assert (sparse["density"], sparse["warmup_density"], sparse["warmup_steps"]) == (
        0.001, None, 0)
    assert sparse["density_at"] == {"0": 0.001}
    assert not sparse["dense_gradients"]
    assert set(sparse["residual_rows"]) == {"deep_table", "wide_table"}
    assert sparse["residual_rows"]["deep_table"] > 0
    full = run(facts, "comm_topk_full_warmup")["exchange"]
    assert full["warmup_steps"] == SYNTHETIC_STEPS  # --density_warmup_epochs defaults to 1
    assert full["density_at"] == {"0": 1.0, str(SYNTHETIC_STEPS): 0.001}
    assert full["residual_rows"] == {"deep_table": 0, "wide_table": 0}


def test_gtopk_density_warmup_and_dense_gradients(facts):
    exchange = run(facts, "comm_gtopk")["exchange"]
    steps = 2 * SYNTHETIC_STEPS  # --density_warmup_epochs=2
    assert exchange["warmup_steps"] == steps
    assert exchange["density_at"] == {"0": 0.05, str(steps): 0.01}
    assert exchange["dense_gradients"]
    assert exchange["residual_rows"]["dense"] > 0  # dense gradients sparsified too


# ----------------------------------------------------------------------------- data

def _log1p(text):
    return 0.0 if text == "" else math.copysign(math.log1p(abs(int(text))), int(text))


def test_criteo_automatic_vocabulary_and_test_path(facts, data):
    """Tables: missing + OOV + the values seen at least 10 times (--vocabulary_min_count) in the
    training file; the test split is the --test_path file, training every training line, read
    in file order, integers log1p."""
    case = run(facts, "criteo_vocabulary")
    expected = [2 + sum(count >= 10 for count in counts.values())
                for counts in _criteo_counts(data)]
    assert case["model"]["vocabulary_sizes"] == expected
    assert case["model"]["deep_table"] == [sum(expected), 10]
    assert case["source"]["class"] == "CriteoTSV"
    assert case["source"]["train_rows"] == CRITEO_LINES
    assert case["source"]["test_rows"] == CRITEO_TEST_LINES
    first = _rows(f"{data}/criteo.txt")[0]
    assert case["source"]["first_dense"][0] == pytest.approx(
        [_log1p(text) for text in first[1:14]], abs=1e-5)
    assert case["source"]["first_labels"][0] == int(first[0])


def test_criteo_vocabulary_file_and_minmax(facts, data):
    """The build_vocab file (min count 1) keeps every value; minmax scales line 1's integers by
    the training file's ranges."""
    case = run(facts, "criteo_vocabulary_file_minmax")
    assert case["model"]["vocabulary_sizes"] == [2 + len(c) for c in _criteo_counts(data)]
    rows = _rows(f"{data}/criteo.txt")
    expected = []
    for j in range(1, 14):
        present = [int(row[j]) for row in rows if row[j]]
        low, high = min(present), max(present)
        expected.append(0.0 if rows[0][j] == "" else (int(rows[0][j]) - low) / (high - low))
    assert case["source"]["first_dense"][0] == pytest.approx(expected, abs=1e-5)
    low, high = case["source"]["dense_range"]
    assert 0.0 <= low and high <= 1.0
    assert run(facts, "criteo_vocabulary")["source"]["dense_range"][1] > 1.0  # log1p


def test_criteo_hash_encoding(facts, data):
    """--nofit_hash_buckets: --hash_buckets + the missing row per field; fitted: at most twice
    the field's distinct training values."""
    assert run(facts, "criteo_hash")["model"]["vocabulary_sizes"] == [51] * 26
    fitted = run(facts, "criteo_hash_fitted")["model"]["vocabulary_sizes"]
    assert fitted == [1 + max(1, min(50, 2 * len(c))) for c in _criteo_counts(data)]


@pytest.mark.parametrize("name, fraction", [("criteo_split", 0.1), ("criteo_split_0.3", 0.3)])
def test_test_fraction_sets_the_held_out_share(facts, name, fraction):
    source = run(facts, name)["source"]
    assert source["train_rows"] + source["test_rows"] == CRITEO_LINES
    spread = 4 * math.sqrt(CRITEO_LINES * fraction * (1 - fraction))
    assert abs(source["test_rows"] - fraction * CRITEO_LINES) < spread, source


def test_shuffle_buffer_changes_the_batch_order_not_the_rows(facts):
    in_order, shuffled = (run(facts, n)["source"] for n in ("criteo_vocabulary",
                                                            "criteo_shuffled"))
    assert shuffled["first_dense"] != in_order["first_dense"]
    assert shuffled["first_labels"] != in_order["first_labels"]
    assert shuffled["epoch_digest"] == in_order["epoch_digest"]


def test_avazu(facts, data):
    """Avazu: no integer features, two hour fields; the avazu preset by default (CowClip
    dense rate 1e-4 x sqrt(s), zeta 1e-3 below batch 4096); vocabulary or hash tables."""
    case = run(facts, "avazu")
    rows = _rows(f"{data}/avazu.csv")
    expected = [2 + sum(n >= 10 for n in _counts(rows, f).values()) for f in AVAZU_FIELDS]
    assert case["model"]["vocabulary_sizes"] == expected + AVAZU_DERIVED_SIZES
    assert case["model"]["num_dense"] == 0
    assert case["optimizer"]["zeta"] == 1e-3
    assert inner(case, "dense")["learning_rate"] == warmup(
        1e-4 * math.sqrt(BATCH / 1024), AVAZU_LINES // BATCH)
    assert case["source"]["class"] == "AvazuCSV"
    hashed = run(facts, "avazu_hash_criteo_preset")
    assert hashed["model"]["vocabulary_sizes"] == [21] * len(AVAZU_FIELDS) + AVAZU_DERIVED_SIZES
    assert hashed["optimizer"]["zeta"] == 1e-5  # --scaling_preset=criteo
    assert inner(hashed, "dense")["learning_rate"] == warmup(
        8e-4 * math.sqrt(BATCH / 1024), AVAZU_LINES // BATCH)
