"""Exports a trained model as a TensorFlow SavedModel for TF Serving, preprocessing included:

    python -m launch.export --checkpoint_dir=runs/deepfm-.../checkpoints --output=served/1

The graph holds the whole preprocessing of the run (hashing or the vocabulary lookup, the
integer transform, missing values; the run record beside the checkpoints says which), so a
served model and launch.predict score a line alike. Signatures (tfscale/serving/export.py):
`serving_default` takes the raw fields by name as strings (Criteo I1..I13, C1..C26, empty =
missing; Avazu's columns) and `score_lines` raw lines in the training file's format, with or
without the label; both return {"probability": float32 [n]}. Loading needs TensorFlow only.
It runs in one process (not under horovodrun or tfscale.run). Bad input ends with a one-paragraph error and exit
status 2."""


from launch import quiet_tf  # noqa: F401  (first: TF's C++ log level is read when TF is imported)

from absl import app, flags, logging  # noqa: E402

from launch.user_errors import absl_main  # noqa: E402

FLAGS = flags.FLAGS

flags.DEFINE_string("checkpoint_dir", None, "The checkpoint directory of a launch.train run.")
flags.DEFINE_string("output", None, "The SavedModel directory to write (must not exist yet).")
flags.mark_flags_as_required(["checkpoint_dir", "output"])


def run():
    logging.set_verbosity(logging.WARNING)  # TF's SavedModel writer logs at INFO
    import os

    from launch import run_record
    from tfscale import distributed
    from tfscale.errors import UserError
    from tfscale.serving.export import SCORE_LINES, SERVING_DEFAULT, export_saved_model

    if distributed.announced_size() > 1:
        raise UserError("launch.export writes one SavedModel from the checkpoint in one process "
                        "(every table's rows, whatever the number of ranks that trained it): "
                        "run `python -m launch.export` without horovodrun or tfscale.run")
    if os.path.exists(FLAGS.output):
        raise UserError(f"--output={FLAGS.output} exists already; give a new directory (TF "
                        "Serving reads numbered versions: served/1, served/2, ...)")
    record = run_record.read(FLAGS.checkpoint_dir)
    record.require_file_format("export")
    preprocessing = record.preprocessing()
    raw_inputs = record.raw_inputs()
    model, progress = record.restored_model()
    export_saved_model(model, preprocessing, raw_inputs, FLAGS.output)
    print(f"exported {record.model_name} ({record.precision}, global step "
          f"{progress['global_step']}; {preprocessing.describe()}) to {FLAGS.output}: signatures "
          f"{SERVING_DEFAULT} ({', '.join(raw_inputs.field_names)}) and {SCORE_LINES} (lines)",
          flush=True)


if __name__ == "__main__":
    app.run(absl_main(run))
