"""Scores a file with a trained model: one click probability per input line, in input order.

    python -m launch.predict --checkpoint_dir=runs/deepfm-.../checkpoints --input=test.txt.gz \\
        --output=predictions.csv

Reads any file the data flags of launch.train accept (Criteo TSV or Avazu CSV, labelled or not,
.gz), with the model, precision and preprocessing the run recorded beside its checkpoints
(launch/run_record.py). Writes CSV with a header: `probability`, or `id,probability` when the
file has Avazu's id column; without --output the CSV goes to stdout and the report to stderr.
Prints the AUC (when both labels occur) and log loss when the file has labels. Bad input ends
with a one-paragraph error and exit status 2. It runs in one process (not under horovodrun or
tfscale.run)."""

import os
import sys

from launch import quiet_tf  # noqa: F401  (first: TF's C++ log level is read when TF is imported)

from absl import app, flags, logging  # noqa: E402

from launch.user_errors import absl_main  # noqa: E402

FLAGS = flags.FLAGS

flags.DEFINE_string("checkpoint_dir", None, "The checkpoint directory of a launch.train run.")
flags.DEFINE_list("input", None, "Files or globs to score (.gz read as gzip).")
flags.DEFINE_string("output", None, "Where to write the CSV (default: stdout).")
flags.DEFINE_integer("batch_size", 4096, "Lines scored per model call.", lower_bound=1)
flags.mark_flags_as_required(["checkpoint_dir", "input"])


def run():
    logging.set_verbosity(logging.WARNING)  # TF's SavedModel writer logs at INFO
    from launch import run_record
    from tfscale import distributed
    from tfscale.errors import UserError
    from tfscale.serving.prediction import FilePredictions

    if distributed.announced_size() > 1:
        raise UserError("launch.predict scores a file in one process (every table's rows, "
                        "whatever the number of ranks that trained it): run `python -m "
                        "launch.predict` without horovodrun or tfscale.run")
    if FLAGS.output is not None and not os.path.isdir(
            os.path.dirname(os.path.abspath(FLAGS.output))):
        raise UserError(f"--output={FLAGS.output}: its directory does not exist")
    record = run_record.read(FLAGS.checkpoint_dir)
    preprocessing = record.preprocessing()
    model, progress = record.restored_model()
    predictions = FilePredictions(model, preprocessing, FLAGS.input,
                                  on_short_line=record.raw_inputs().on_short_line,
                                  batch_size=FLAGS.batch_size)
    report = sys.stderr if FLAGS.output is None else sys.stdout
    print(f"model {record.model_name} ({record.precision}) from {FLAGS.checkpoint_dir} at global "
          f"step {progress['global_step']}; scoring {predictions.describe()}", file=report,
          flush=True)
    if FLAGS.output is None:
        lines, labelled = write_csv(predictions, sys.stdout)
    else:  # written under a temporary name, so a stopped run leaves no partial file behind
        with open(FLAGS.output + ".tmp", "w") as stream:
            lines, labelled = write_csv(predictions, stream)
        os.replace(FLAGS.output + ".tmp", FLAGS.output)
    print(f"wrote {lines:,} predictions to {FLAGS.output or 'stdout'}", file=report, flush=True)
    if labelled is not None:
        from tfscale.metrics import exact_auc, log_loss

        labels, probabilities = labelled
        positives = int((labels > 0.5).sum())
        auc = (f"AUC {exact_auc(labels, probabilities):.4f}" if 0 < positives < labels.size
               else "AUC undefined (every label is the same)")
        print(f"{auc}, logloss {log_loss(labels, probabilities):.4f} on {lines:,} labelled lines",
              file=report, flush=True)


def write_csv(predictions, stream):
    """Writes the CSV of a FilePredictions to `stream`; returns (lines written, (labels,
    probabilities) when the file has labels, else None)."""
    import numpy as np

    stream.write(",".join(predictions.passthrough_names + ("probability",)) + "\n")
    lines, labels, probabilities = 0, [], []
    for batch_probabilities, batch_labels, passthrough in predictions:
        rows = [f"{p:.9g}" for p in batch_probabilities.tolist()]  # float32 exactly
        if predictions.passthrough_names:
            rows = [",".join([*(value.decode() for value in values), row])
                    for values, row in zip(passthrough, rows)]
        stream.write("".join(row + "\n" for row in rows))
        lines += len(rows)
        if batch_labels is not None:
            labels.append(batch_labels)
            probabilities.append(batch_probabilities)
    if not predictions.has_labels:
        return lines, None
    return lines, (np.concatenate(labels), np.concatenate(probabilities))


if __name__ == "__main__":
    app.run(absl_main(run))
