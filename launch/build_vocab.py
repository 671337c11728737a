"""Builds a categorical vocabulary (and integer ranges) for Criteo or Avazu files in one pass:

    python -m launch.build_vocab --format=criteo --input=train.txt.gz --min_count=10 \\
        --output=criteo.vocab
    horovodrun -np 2 -H localhost:2 --gloo python -m launch.build_vocab ...  # each rank a share

The file (Parquet, tfscale.data.vocabulary_file) feeds `--vocabulary` of launch.train
(vocabulary encoding, min-max scaling). Under horovodrun every rank counts its share of the
lines and rank 0 writes the file. Bad input ends with a one-paragraph error and exit status 2,
never a traceback."""

import sys

from launch import quiet_tf  # noqa: F401  (first: TF's C++ log level is read when TF is imported)

from absl import app, flags  # noqa: E402

from launch.user_errors import run_reporting_user_errors  # noqa: E402
from tfscale import distributed  # noqa: E402
from tfscale.data import FILE_FORMATS  # noqa: E402
from tfscale.data.text_lines import BAD_LINE_POLICIES, SHORT_LINE_POLICIES  # noqa: E402
from tfscale.data.vocabulary_pass import DEFAULT_MEMORY_MB  # noqa: E402

FLAGS = flags.FLAGS

flags.DEFINE_enum("format", None, list(FILE_FORMATS), "Input format: Criteo TSV or Avazu CSV.")
flags.DEFINE_list("input", None, "Input files or globs, comma-separated (.gz read as gzip).")
flags.DEFINE_integer("min_count", 10, "Keep values seen at least this many times; rarer ones are "
                     "looked up as the out-of-vocabulary row (launch.train's "
                     "--vocabulary_min_count has the same default).", lower_bound=1)
flags.DEFINE_string("output", None, "Where to write the vocabulary (a Parquet file).")
flags.DEFINE_integer("memory_mb", DEFAULT_MEMORY_MB,
                     "Memory for the counts, per rank: values are counted exactly while they "
                     "fit, then the rare ones in a count-min sketch of half of it (more memory, "
                     "fewer rare values let in; docs/data.md).", lower_bound=16)
flags.DEFINE_enum("on_bad_line", "error", list(BAD_LINE_POLICIES),
                  "A malformed line stops with an error naming file and line, or is skipped and "
                  "counted.")
flags.DEFINE_enum("on_short_line", "missing", list(SHORT_LINE_POLICIES),
                  "A line missing only trailing fields reads them as missing values, or stops "
                  "with an error naming file and line.")
flags.mark_flags_as_required(["format", "input", "output"])


def build():
    """Counts the inputs (each rank its share) and writes the vocabulary from rank 0; returns a
    one-line summary."""
    vocabulary = FILE_FORMATS[FLAGS.format].build_vocabulary(
        FLAGS.input, min_count=FLAGS.min_count, on_bad_line=FLAGS.on_bad_line,
        on_short_line=FLAGS.on_short_line, memory_mb=FLAGS.memory_mb)
    if distributed.is_chief():
        vocabulary.save(FLAGS.output)
    sizes = ", ".join(f"{name} {len(entries)}" for name, entries in vocabulary.categorical.items())
    skipped = (f"; skipped {vocabulary.bad_lines_skipped} malformed lines"
               if FLAGS.on_bad_line == "skip" else "")
    counting = vocabulary.counting
    how = ("exact counts" if counting["exact"] else
           f"rare values counted in a sketch: counts over by at most {counting['error_bound']} "
           "at probability 98%")
    return (f"wrote {FLAGS.output}: {vocabulary.rows} rows counted by {counting['ranks']} "
            f"rank(s){skipped}; {how}; values with count >= {FLAGS.min_count} per field: "
            f"{sizes}")


def main(argv):
    del argv
    distributed.init()  # starts Horovod under horovodrun; nothing in one process
    status = run_reporting_user_errors(
        lambda: print(build(), flush=True) if distributed.is_chief() else build())
    sys.exit(status)


if __name__ == "__main__":
    app.run(main)
