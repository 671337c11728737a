"""The flags of online training (--progressive: day by day, each day scored by the model as it
stands, then trained on once, then checkpointed) and of the drifting synthetic stream
(--data=drifting), the checks of what cannot go with them, the days they give
(tfscale.training.train_progressively's `days`: one per --train_path file, or the drifting
stream's) and the report of such a run."""

import os

from absl import flags

from launch import common_flags, hybrid_flags

FLAGS = flags.FLAGS

flags.DEFINE_bool("progressive", False,
                  "Train online, day by day: each file of --train_path in order (or each day of "
                  "--data=drifting) is one day, scored by the model as it stands (progressive "
                  "validation: AUC and log loss of the whole day, printed and in TensorBoard under "
                  "<logdir>/progressive with the day as the step), then trained on in one pass, "
                  "then checkpointed; --resume continues with the first day not done. The "
                  "vocabulary (or the fitted hash buckets) comes from the first day. With "
                  "--epochs=1 only; an epoch of --warmup_epochs or --density_warmup_epochs is "
                  "the first day.")
flags.DEFINE_integer("days", 7, "--data=drifting: days of the stream.", lower_bound=1)
flags.DEFINE_integer("rows_per_day", 1_000_000, "--data=drifting: rows of each day.",
                     lower_bound=1)
flags.DEFINE_float("drift_half_life_days", 7.0,
                   "--data=drifting: days after which an id's chance to appear has halved; each "
                   "large field gets (1 - 2^(-1/half-life)) x its cardinality new ids a day.",
                   lower_bound=0.1)

_DRIFTING_FLAGS = ("days", "rows_per_day", "drift_half_life_days")


def check_flags():
    """Refuses, before anything is built or written, the flags that need --progressive or
    cannot go with it."""
    from tfscale.errors import UserError

    if FLAGS.data == "drifting" and not FLAGS.progressive:
        raise UserError("--data=drifting is a stream of days: train on it with --progressive "
                        "(each day scored, then trained on once)")
    for name in _DRIFTING_FLAGS:
        if FLAGS[name].present and FLAGS.data != "drifting":
            raise UserError(f"--{name} shapes the drifting stream's days: it goes with "
                            "--data=drifting")
    if FLAGS.categorical_encoding == "raw" and not hybrid_flags.strategy().takes_any_ids:
        raise UserError(f"--categorical_encoding=raw gives ids up to 2^56 in every field, which "
                        f"only tables keyed by id can hold: give --embedding_sharding="
                        f"{hybrid_flags.any_id_strategies()} (not {FLAGS.embedding_sharding})")
    if not FLAGS.progressive:
        return
    if FLAGS.data == "synthetic":
        raise UserError("--progressive trains on days: give --data=drifting (the synthetic stream "
                        "whose ids are born and fade) or Criteo/Avazu files as --train_path, one "
                        "a day; --data=synthetic has no days")
    if FLAGS.epochs != 1:
        raise UserError(f"--progressive trains one pass over each day, scored before it: "
                        f"--epochs={FLAGS.epochs} has no meaning there; leave --epochs at 1")
    if FLAGS.test_path or FLAGS["test_fraction"].present:
        given = "--test_path" if FLAGS.test_path else "--test_fraction"
        raise UserError(f"{given}: with --progressive each day is scored before it is trained on "
                        "(progressive validation), so no test split is held out; give the days "
                        "as --train_path alone")
    for name in ("train_rows", "test_rows"):
        if FLAGS[name].present:
            raise UserError(f"--{name} sizes --data=synthetic; with --progressive the days are "
                            "--data=drifting's (--days, --rows_per_day) or --train_path's files")


def build_days(resumed_run=None):
    """[(name, CTRSource)] of the days in order: the drifting stream's, or one per --train_path
    file (every line both scored and trained on). `resumed_run`: the checkpoint directory of a
    run being resumed, whose recorded file encoding is kept."""
    if FLAGS.data == "drifting":
        return _drifting_days()
    return _file_days(resumed_run)


def _drifting_days():
    from tfscale.data.drifting import DriftingCTR
    from tfscale.data.drifting_days import drifting_days

    stream = DriftingCTR(seed=FLAGS.seed, days=FLAGS.days, rows_per_day=FLAGS.rows_per_day,
                         vocabulary_scale=FLAGS.synthetic_vocabulary_scale,
                         half_life_days=FLAGS.drift_half_life_days)
    return drifting_days(stream, _drifting_encoding(stream))


def _drifting_encoding(stream):
    """The encoding of the drifting stream's ids --categorical_encoding asks for: raw, hashed
    (into buckets fitted to the first day's distinct ids unless --nofit_hash_buckets), or the
    vocabulary of the first day (ids seen at least --vocabulary_min_count times)."""
    from tfscale import distributed
    from tfscale.data import drifting_days
    from tfscale.data.drifting import CATEGORICAL_NAMES
    from tfscale.data.vocabulary_cache import fitted_hash_buckets
    from tfscale.errors import UserError

    if FLAGS.vocabulary:
        raise UserError("--vocabulary is a vocabulary of Criteo or Avazu files; --data=drifting "
                        "counts its own on the first day")
    if FLAGS.integer_transform != "log1p":
        raise UserError(f"--integer_transform={FLAGS.integer_transform} is for Criteo files; "
                        "--data=drifting's integers are log1p-transformed as --data=synthetic's")
    if FLAGS.categorical_encoding == "raw":
        return drifting_days.RAW_IDS
    if FLAGS.categorical_encoding == "hash" and not FLAGS.fit_hash_buckets:
        return drifting_days.hashed_ids(FLAGS.hash_buckets)

    def count():
        vocabulary = drifting_days.count_day_vocabulary(stream, 0, FLAGS.vocabulary_min_count)
        kept = sum(len(entries) for entries in vocabulary.categorical.values())
        print(f"vocabulary: {kept:,} ids seen at least {FLAGS.vocabulary_min_count} times on day "
              f"1, of {sum(vocabulary.distinct.values()):,} distinct", flush=True)
        return vocabulary

    vocabulary = distributed.broadcast_from_chief(count, name="tfscale_drifting_vocabulary")
    if FLAGS.categorical_encoding == "hash":
        return drifting_days.hashed_ids(
            fitted_hash_buckets(vocabulary, CATEGORICAL_NAMES, FLAGS.hash_buckets))
    return drifting_days.vocabulary_ids(vocabulary)


def _file_days(resumed_run):
    from tfscale.data.text_lines import resolve_paths
    from tfscale.errors import UserError

    if not FLAGS.train_path:
        raise UserError(f"--data={FLAGS.data} needs --train_path: with --progressive, one file a "
                        "day, in order")
    paths = [os.path.abspath(path) for path in resolve_paths(FLAGS.train_path)]
    repeated = sorted({path for path in paths if paths.count(path) > 1})
    if repeated:
        raise UserError(f"--train_path lists {repeated[0]} more than once: with --progressive "
                        "each file is one day, trained on once")
    # The first day's lines alone are counted: an online run cannot know the later days yet.
    preprocessing = common_flags.file_preprocessing(
        common_flags.recorded_encoding(resumed_run), paths[:1], None)
    # Each day's test split is the day itself: scored, then trained on.
    return [(path, common_flags.file_source([path], None, preprocessing, test_fraction=None))
            for path in paths]


def describe(days):
    """The days in a few words, for the launcher's first line."""
    first = days[0][1]
    if len(days) == 1:
        return first.describe()
    return f"{len(days)} days, from {first.describe()}"


def report(result, days, logdir, checkpoint_dir):
    """The final lines of a run day by day: the mean progressive validation over the days done,
    the last day's with the teacher's ceiling on it (drifting data), skipped bad lines, and
    where the logs and checkpoints are."""
    done = result.days
    if done:
        mean_auc = sum(day["auc"] for day in done) / len(done)
        mean_logloss = sum(day["logloss"] for day in done) / len(done)
        last = done[-1]
        line = (f"progressive validation over {len(done)} day{'s' if len(done) > 1 else ''}: "
                f"mean AUC {mean_auc:.4f}, mean "
                f"logloss {mean_logloss:.4f}; day {last['day']}: AUC {last['auc']:.4f}, logloss "
                f"{last['logloss']:.4f}")
        last_source = days[last["day"] - 1][1]
        if hasattr(last_source, "teacher_auc"):
            line += (f" (teacher ceiling: AUC {last_source.teacher_auc():.4f}, logloss "
                     f"{last_source.teacher_logloss():.4f})")
        print(line, flush=True)
    common_flags.report_reading_and_places([source for _, source in days], logdir,
                                           checkpoint_dir)
