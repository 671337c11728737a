"""Flags shared by the training entry points (data, model, seed) and the builders that turn them
into a CTRSource and a model. The choices come from the library's and the models' registries."""

import os
import time

from absl import flags

import models
from tfscale.data import FILE_FORMATS, PARQUET_FORMATS
from tfscale.data.preprocessing import DENSE_TRANSFORMS
from tfscale.data.text_lines import BAD_LINE_POLICIES, SHORT_LINE_POLICIES

FLAGS = flags.FLAGS

# Data.
flags.DEFINE_enum("data", "synthetic", ["synthetic", "drifting", *FILE_FORMATS],
                  "Data set: the built-in synthetic Criteo-like stream, its drifting variant (days "
                  "whose ids are born and fade; with --progressive), Criteo Kaggle TSV files or "
                  "Avazu CSV files, or Parquet files of their columns (the last two need "
                  "--train_path).")
flags.DEFINE_integer("train_rows", 4_000_000, "Synthetic data: training rows.", lower_bound=1)
flags.DEFINE_integer("test_rows", 200_000, "Synthetic data: test rows.", lower_bound=1)
flags.DEFINE_float("synthetic_vocabulary_scale", 1 / 20,
                   "Synthetic and drifting data: Criteo's large field cardinalities are "
                   "multiplied by this.",
                   lower_bound=1e-6, upper_bound=1.0)
flags.DEFINE_list("train_path", [],
                  "Criteo/Avazu: training files or globs: text (.gz read as gzip), or Parquet "
                  "files (told by their first bytes, whatever their names).")
flags.DEFINE_list("test_path", [],
                  "Criteo/Avazu: labelled test files or globs. Without it, --test_fraction of the "
                  "training lines (chosen by line number) are held out as the test split.")
flags.DEFINE_list("parquet_columns", [],
                  "Parquet files: FIELD=COLUMN pairs for the fields whose column has another "
                  "name, e.g. label=click,I1=int_1 (other fields are read from the column of "
                  "their own name).")
flags.DEFINE_float("test_fraction", 0.1, "Held-out fraction when there is no --test_path.",
                   lower_bound=0.0, upper_bound=0.9)
flags.DEFINE_enum("categorical_encoding", "vocabulary",
                  ["vocabulary", "hash", "fingerprint", "raw"],
                  "Criteo/Avazu and drifting data: look categorical values up in a vocabulary "
                  "(tables sized from the data: --vocabulary, or by default one counted from the "
                  "training lines on first use and cached beside the data; with --progressive, "
                  "from the first day), or hash them into --hash_buckets per field. For tables "
                  "whose rows are given to ids as they arrive (--embedding_sharding=dynamic, "
                  "which these two choose when --embedding_sharding is not given): fingerprint "
                  "gives every value of the files its own 56-bit id; raw passes "
                  "--data=drifting's integer ids as they are, in [0, 2^56).")
flags.DEFINE_integer("hash_buckets", 1_000_000,
                     "--categorical_encoding=hash: hash buckets per categorical field (at most; "
                     "see --fit_hash_buckets).", lower_bound=1)
flags.DEFINE_bool("fit_hash_buckets", True,
                  "--categorical_encoding=hash: give each field at most twice as many buckets as "
                  "it has distinct values in the training lines (with --progressive: in the first "
                  "day's; counted by the automatic vocabulary pass); --nofit_hash_buckets gives "
                  "every field --hash_buckets.")
flags.DEFINE_string("vocabulary", None,
                    "A vocabulary file (python -m launch.build_vocab writes one) instead of the "
                    "automatic one.")
flags.DEFINE_integer("vocabulary_min_count", 10,
                     "The automatic vocabulary keeps values seen at least this many times in the "
                     "training lines (with --progressive: in the first day's); rarer ones share "
                     "the out-of-vocabulary row.", lower_bound=1)
flags.DEFINE_string("vocabulary_cache_dir", None,
                    "Where the automatic vocabulary is cached (default: beside the first training "
                    "file).")
flags.DEFINE_enum("integer_transform", "log1p", list(DENSE_TRANSFORMS),
                  "Criteo integer features: sign(x)*log(1+|x|), or min-max scaling with the "
                  "vocabulary's recorded range.")
flags.DEFINE_enum("on_bad_line", "error", list(BAD_LINE_POLICIES),
                  "A malformed line stops with an error naming file and line, or is skipped and "
                  "counted (the count is reported at the end).")
flags.DEFINE_enum("on_short_line", "missing", list(SHORT_LINE_POLICIES),
                  "A line missing only trailing fields (a common export strips empty ones) reads "
                  "them as missing values, counted and reported at the end; or it stops with an "
                  "error naming file and line.")
flags.DEFINE_integer("shuffle_buffer", 0, "Criteo/Avazu: shuffle buffer in rows (0: file order).",
                     lower_bound=0)

# Model.
flags.DEFINE_enum("model", "deepfm", list(models.MODELS), "The CTR model.")
flags.DEFINE_integer("embedding_dim", 10, "Embedding width.", lower_bound=1)
flags.DEFINE_list("dnn_units", ["400", "400", "400"], "Units of the DNN tower's layers.")
flags.DEFINE_integer("cross_layers", 3, "DCN / DCN-v2: cross layers.", lower_bound=1)
flags.DEFINE_integer("cross_experts", 1, "DCN-v2: low-rank experts per cross layer (1: keras-rs "
                     "FeatureCross; the official CowClip runs use 4).", lower_bound=1)

# Run.
flags.DEFINE_integer("batch_size", 16384, "Global batch size.", lower_bound=1)
flags.DEFINE_integer("seed", 0, "Seed for initialisation and data.", lower_bound=0,
                     upper_bound=2**32 - 1)
flags.DEFINE_bool("deterministic", True,
                  "Deterministic TF ops, so a fixed seed repeats a run exactly (on CPU).")


def seed_everything(seed, deterministic):
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(seed)
    if deterministic:
        tf.config.experimental.enable_op_determinism()


def run_directories(logdir, checkpoint_dir):
    """The run's (logdir, checkpoint_dir), None for 'none'; defaults go under a new
    runs/<model>-<time>/ so no earlier run is overwritten."""
    from tfscale.errors import UserError

    run_dir = os.path.join("runs", f"{FLAGS.model}-{time.strftime('%Y%m%d-%H%M%S')}")
    if FLAGS.resume and checkpoint_dir in (None, "", "none"):
        raise UserError("--resume needs --checkpoint_dir naming the run to continue")
    logdir = os.path.join(run_dir, "logs") if logdir is None else logdir
    checkpoint_dir = os.path.join(run_dir, "checkpoints") if checkpoint_dir is None else checkpoint_dir
    return (None if logdir in ("", "none") else logdir,
            None if checkpoint_dir in ("", "none") else checkpoint_dir)


# --categorical_encoding=fingerprint: hash buckets per field, so ids fill [1, 2**56) (0: missing),
# the ids dynamic tables key by field (tfscale.embedding.dynamic).
FINGERPRINT_BUCKETS = (1 << 56) - 1


def build_model(schema, settings, optimizer_name, dtype_policy="float32", dynamic_capacity=None):
    """The --model over `schema`, initialised and regularised as `settings` (LargeBatchSettings)
    say for the optimizer `optimizer_name`, computing in `dtype_policy`; `dynamic_capacity`:
    hybrid_flags.dynamic_capacity's answer."""
    from launch import hybrid_flags
    from tfscale.embedding.initializers import RowSeededNormal
    from tfscale.optimizers.factory import model_regularization

    return models.build_model(
        FLAGS.model, schema, embedding_dim=FLAGS.embedding_dim, hidden_units=_dnn_units(),
        embeddings_initializer=RowSeededNormal(stddev=settings.embedding_init_stddev),
        dtype=dtype_policy, deduplicate_ids=FLAGS.dedup_ids,
        embedding_sharding=hybrid_flags.table_strategy(dynamic_capacity),
        table_dtype=FLAGS.table_dtype,
        **model_regularization(settings, optimizer_name, FLAGS.embedding_update),
        **_model_specific_config())


def _dnn_units():
    from tfscale.errors import UserError

    try:
        units = [int(u) for u in FLAGS.dnn_units]
    except ValueError:
        raise UserError(f"--dnn_units={','.join(FLAGS.dnn_units)}: give comma-separated positive "
                        "integers, e.g. 400,400,400") from None
    if not units or min(units) < 1:
        raise UserError(f"--dnn_units={','.join(FLAGS.dnn_units)}: give comma-separated positive "
                        "integers, e.g. 400,400,400")
    return units


def _model_specific_config():
    if FLAGS.model == "dcn":
        return {"cross_layers": FLAGS.cross_layers}
    if FLAGS.model == "dcn_v2":
        return {"cross_layers": FLAGS.cross_layers, "num_experts": FLAGS.cross_experts}
    return {}


def build_source(resumed_run=None):
    """The CTRSource the data flags describe. `resumed_run`: the checkpoint directory of a run
    being resumed, whose recorded encoding (its own vocabulary, its hash buckets) is kept
    whatever the cache beside the data now holds."""
    from tfscale.errors import UserError

    if FLAGS.data == "synthetic":
        from tfscale.data.synthetic import SyntheticCTR

        return SyntheticCTR(seed=FLAGS.seed, train_rows=FLAGS.train_rows, test_rows=FLAGS.test_rows,
                            vocabulary_scale=FLAGS.synthetic_vocabulary_scale)
    if FLAGS.data == "drifting":
        raise UserError("--data=drifting is a stream of days: train on it with --progressive "
                        "(each day scored, then trained on once)")
    if not FLAGS.train_path:
        raise UserError(f"--data={FLAGS.data} needs --train_path (files or globs)")
    preprocessing = file_preprocessing(recorded_encoding(resumed_run), FLAGS.train_path,
                                       None if FLAGS.test_path else FLAGS.test_fraction)
    return file_source(FLAGS.train_path, FLAGS.test_path or None, preprocessing,
                       FLAGS.test_fraction)


def recorded_encoding(resumed_run):
    """(Vocabulary, hash buckets) the run in checkpoint directory `resumed_run` recorded (one of
    them None), or None when there is no such run or it recorded none; rank 0 reads it and hands
    it to the others."""
    if not resumed_run:
        return None
    from tfscale import distributed

    return distributed.broadcast_from_chief(  # rank 0 alone reads the checkpoints
        lambda: _recorded_encoding(resumed_run), name="tfscale_recorded_encoding")


def _recorded_encoding(checkpoint_dir):
    """(Vocabulary, hash buckets) a resumed run recorded (launch/run_record.py), one of them
    None, or None when it recorded none (a run from before run records, or not started)."""
    from launch import run_record
    from tfscale.data.vocabulary import Vocabulary

    if not os.path.exists(os.path.join(checkpoint_dir, run_record.RECORD_FILE)):
        return None
    record = run_record.read(checkpoint_dir)
    if record.data != FLAGS.data or "preprocessing" not in record.record:
        from tfscale.errors import UserError

        raise UserError(f"`checkpoint_dir={checkpoint_dir}` holds a run on --data={record.data}; "
                        f"resume it with the data it was trained on, not --data={FLAGS.data}")
    encoding = record.record["preprocessing"]["encoding"]
    if encoding["kind"] == "vocabulary":
        path = os.path.join(checkpoint_dir, encoding["file"])
        print(f"vocabulary: the resumed run's own, {path}", flush=True)
        return Vocabulary.load(path), None
    return None, encoding["buckets"]


def file_preprocessing(recorded, counted_paths, test_fraction):
    """The Preprocessing of --data's files the encoding flags give: with `recorded` (a resumed
    run's recorded_encoding), that encoding; else --vocabulary, or the automatic vocabulary of
    the training lines of `counted_paths` (with `test_fraction`, those its split trains on),
    and with --categorical_encoding=hash the buckets fitted to it."""
    from launch import hybrid_flags
    from tfscale.data.preprocessing import Preprocessing
    from tfscale.errors import UserError

    if FLAGS.categorical_encoding == "raw":
        raise UserError(f"--categorical_encoding=raw passes the integer ids of --data=drifting "
                        f"through as they are, and --data={FLAGS.data} files hold strings: give "
                        "--categorical_encoding=vocabulary, hash or fingerprint")
    hashing = FLAGS.categorical_encoding in ("hash", "fingerprint")
    fingerprint = FLAGS.categorical_encoding == "fingerprint"
    if hashing and FLAGS.vocabulary:
        raise UserError("--vocabulary goes with --categorical_encoding=vocabulary (the default)")
    if fingerprint and not hybrid_flags.strategy().takes_any_ids:
        raise UserError("--categorical_encoding=fingerprint gives every value an id of its own "
                        "(up to 2**56): it needs tables that grow, --embedding_sharding="
                        f"{hybrid_flags.any_id_strategies()}")
    if FLAGS.integer_transform == "minmax" and hashing:
        raise UserError("--integer_transform=minmax needs the ranges a vocabulary records: use "
                        "--categorical_encoding=vocabulary")
    vocabulary = FLAGS.vocabulary
    hash_buckets = FINGERPRINT_BUCKETS if fingerprint else FLAGS.hash_buckets
    if recorded is not None:
        vocabulary, recorded_buckets = recorded
        if (vocabulary is None) != hashing:
            raise UserError("--categorical_encoding differs from the resumed run's; resume with "
                            "the encoding it was trained with")
        hash_buckets = recorded_buckets or hash_buckets
    elif vocabulary is None and (not hashing or (FLAGS.fit_hash_buckets and not fingerprint)):
        vocabulary = _automatic_vocabulary(counted_paths, test_fraction)
    text_format = FILE_FORMATS[FLAGS.data].FORMAT
    if hashing and recorded is None:
        if FLAGS.fit_hash_buckets and not fingerprint:
            from tfscale.data.vocabulary_cache import fitted_hash_buckets

            hash_buckets = fitted_hash_buckets(vocabulary, text_format.categorical_names,
                                               FLAGS.hash_buckets)
        vocabulary = None
    return Preprocessing(text_format, vocabulary=vocabulary, hash_buckets=hash_buckets,
                         dense_transform=FLAGS.integer_transform)


def file_reader(paths, flag="--train_path"):
    """The reader class of --data's files `paths` (given by `flag`): its Parquet reader, with
    --parquet_columns, when they are Parquet files, told by their first bytes (Spark, BigQuery
    and NVTabular name them variously); else its text reader."""
    from tfscale.data.parquet import is_parquet
    from tfscale.data.text_lines import resolve_paths
    from tfscale.errors import UserError

    kinds = {is_parquet(path) for path in resolve_paths(paths)}
    if len(kinds) > 1:
        raise UserError(f"{flag}={','.join(paths)}: some files are Parquet and some text; give "
                        "files of one kind")
    columns = parquet_columns()
    if kinds == {True}:
        return PARQUET_FORMATS[FLAGS.data].with_columns(columns)
    if columns:
        raise UserError(f"--parquet_columns names columns of Parquet files, and {flag}'s files "
                        "are text")
    return FILE_FORMATS[FLAGS.data]


def parquet_columns():
    """--parquet_columns as {field: column}."""
    from tfscale.errors import UserError

    pairs = [pair.split("=", 1) for pair in FLAGS.parquet_columns]
    if any(len(pair) != 2 or not all(part.strip() for part in pair) for pair in pairs):
        raise UserError(f"--parquet_columns={','.join(FLAGS.parquet_columns)}: give "
                        "FIELD=COLUMN pairs, e.g. label=click,I1=int_1")
    return {field.strip(): column.strip() for field, column in pairs}


def file_source(train_paths, test_paths, preprocessing, test_fraction):
    """The --data file source of `train_paths` and `test_paths` (None: `test_fraction` of the
    training lines held out, or with `test_fraction` None, none: the test split is the train
    split) encoded by `preprocessing`, read as the data flags say."""
    from tfscale.data.parquet import ParquetSource
    from tfscale.errors import UserError

    reader = file_reader(train_paths)
    parquet = issubclass(reader, ParquetSource)
    if test_paths and issubclass(file_reader(test_paths, "--test_path"), ParquetSource) != parquet:
        raise UserError(f"--test_path's files are {'text' if parquet else 'Parquet'} and "
                        f"--train_path's {'Parquet' if parquet else 'text'}: give both of one kind")
    text_options = {} if parquet else {"on_short_line": FLAGS.on_short_line}
    return reader(
        train_paths, test_paths, test_fraction=test_fraction, preprocessing=preprocessing,
        shuffle_buffer=FLAGS.shuffle_buffer, seed=FLAGS.seed, on_bad_line=FLAGS.on_bad_line,
        **text_options)


def _automatic_vocabulary(paths, test_fraction):
    """The cached vocabulary of the training lines of `paths` (counted now if the cache is
    missing or stale); under Horovod every rank counts its share and rank 0 caches it."""
    from tfscale.data.vocabulary_cache import cached_vocabulary

    return cached_vocabulary(
        file_reader(paths), paths, min_count=FLAGS.vocabulary_min_count,
        test_fraction=test_fraction, on_bad_line=FLAGS.on_bad_line,
        on_short_line=FLAGS.on_short_line, cache_dir=FLAGS.vocabulary_cache_dir,
        print_fn=lambda line: print(line, flush=True))


def report(result, source, logdir, checkpoint_dir):
    """The final lines of a run: test AUC and log loss (and the teacher's ceiling on synthetic
    data), skipped bad lines, and where the logs and checkpoints are."""
    final = result.final
    if final is not None:
        line = f"final test AUC {final['auc']:.4f}, logloss {final['logloss']:.4f}"
        teacher_auc = getattr(source, "teacher_auc", None)
        if teacher_auc is not None:
            line += f" (teacher ceiling: AUC {teacher_auc():.4f}, logloss {source.teacher_logloss():.4f})"
        print(line, flush=True)
    report_reading_and_places([source], logdir, checkpoint_dir)


def report_reading_and_places(sources, logdir, checkpoint_dir):
    """The lines after a run's result: the malformed lines skipped and the short lines read by
    `sources`, and where the logs and checkpoints are."""
    bad_lines = sum(source.bad_line_count() for source in sources)
    if bad_lines:
        print(f"skipped {bad_lines:,} malformed lines (--on_bad_line=skip)", flush=True)
    short_lines = sum(getattr(source, "short_line_count", lambda: 0)() for source in sources)
    if short_lines:
        print(f"read the missing trailing fields of {short_lines:,} short lines as missing values "
              "(--on_short_line=missing)", flush=True)
    if logdir:
        print(f"TensorBoard logs: {logdir}  (tensorboard --logdir {logdir})", flush=True)
    if checkpoint_dir:
        print(f"checkpoints: {checkpoint_dir}", flush=True)
