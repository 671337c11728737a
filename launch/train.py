"""Trains a CTR model: `python -m launch.train [--flags]` (`--helpfull` lists them all).

With no flags it trains DeepFM on the built-in synthetic Criteo-like data set and prints the
test AUC and log loss next to the teacher's AUC ceiling. Under `python -m tfscale.run -np P -m
launch.train` (TensorFlow's engine) or `horovodrun -np P ... python -m launch.train` it trains
data-parallel on P ranks (--batch_size stays the global batch); rank 0 prints, logs and
checkpoints. Bad input (a file, a line in it, a flag) ends with a one-paragraph
error and a non-zero exit status, never a traceback."""


from launch import quiet_tf  # noqa: F401  (first: TF's C++ log level is read when TF is imported)

from absl import app, flags, logging  # noqa: E402

from launch import (common_flags, distributed_flags, hybrid_flags,  # noqa: E402
                    optimization_flags, precision_flags, progressive_flags, run_record)
from launch.user_errors import absl_main  # noqa: E402

FLAGS = flags.FLAGS

flags.DEFINE_integer("epochs", 1, "Training epochs.", lower_bound=1)
flags.DEFINE_string("logdir", None,
                    "TensorBoard log directory (default: runs/<model>-<time>/logs; 'none' for none).")
flags.DEFINE_string("checkpoint_dir", None,
                    "Checkpoint directory (default: runs/<model>-<time>/checkpoints; 'none' for "
                    "none). It must hold no checkpoint unless --resume.")
flags.DEFINE_integer("checkpoint_every_steps", 200,
                     "Also checkpoint every N global steps (0: only at epoch ends).", lower_bound=0)
flags.DEFINE_bool("resume", False, "Continue from the last checkpoint in --checkpoint_dir.")
flags.DEFINE_integer("log_every_steps", 20, "Progress line and TensorBoard scalars every N steps.",
                     lower_bound=1)
flags.DEFINE_integer("stop_after_steps", None,
                     "Stop (as if interrupted) after this many global steps; resume with --resume.",
                     lower_bound=1)
flags.DEFINE_list("profile_steps", [],
                  "FIRST,LAST: write TensorFlow's profile of these global steps (rank 0's) to "
                  "<logdir>/train for TensorBoard's Profile tab: the trace viewer and op "
                  "statistics (docs/tuning.md). Skip the first steps, which trace the train "
                  "step: e.g. 20,25. Not with --progressive.")
flags.DEFINE_integer("retain_freed_memory_mib", 64,
                     "MiB of freed memory each of the process's malloc heaps keeps instead of "
                     "giving it back to the system (glibc's M_TOP_PAD), so that the file readers' "
                     "blocks reuse it instead of faulting pages in again (docs/data.md); 0 "
                     "leaves the C allocator as it is.", lower_bound=0, upper_bound=2047)
flags.register_validator(
    "profile_steps", lambda steps: not steps or (
        len(steps) == 2 and all(s.strip().isdigit() for s in steps)
        and 1 <= int(steps[0]) <= int(steps[1])),
    message="--profile_steps takes FIRST,LAST: two global steps, 1 <= FIRST <= LAST")
flags.register_multi_flags_validator(
    ["profile_steps", "progressive"], lambda values: not (values["profile_steps"]
                                                          and values["progressive"]),
    message="--profile_steps profiles a run of epochs, not --progressive")


def run():
    """Builds everything from the flags, trains, and prints the final report."""
    logging.set_verbosity(logging.WARNING)  # TF's checkpoint saver logs every save at INFO
    import keras
    import tensorflow as tf

    from tfscale import distributed
    from tfscale.training.progressive import ProgressiveConfig, check_days, train_progressively
    from tfscale.training.run import TrainingConfig, check_test_split_is_labelled, train

    distributed_flags.init_engine()
    retain_freed_memory()
    hybrid_flags.choose_tables_for_encoding()
    progressive_flags.check_flags()
    common_flags.seed_everything(FLAGS.seed, FLAGS.deterministic)
    logdir, checkpoint_dir = common_flags.run_directories(FLAGS.logdir, FLAGS.checkpoint_dir)
    settings = optimization_flags.resolve_settings()
    optimizer_name = optimization_flags.optimizer_name()
    optimization_flags.check_table_l2(settings, hybrid_flags.row_gradient_flags())
    resumed_run = checkpoint_dir if FLAGS.resume else None
    if FLAGS.progressive:
        days, _ = check_days(progressive_flags.build_days(resumed_run), FLAGS.batch_size)
        source = days[0][1]  # the first day: the schema, the run record, what an epoch means
    else:
        days, source = None, common_flags.build_source(resumed_run)
    check_test_split_is_labelled(source)  # before anything is written
    capacity = hybrid_flags.dynamic_capacity(
        source, distributed.local_batch_size(FLAGS.batch_size), whole_files=not FLAGS.progressive)
    model = common_flags.build_model(source.schema, settings, optimizer_name,
                                     precision_flags.dtype_policy(), capacity)
    steps_per_epoch = source.train_steps_per_epoch(
        distributed.local_batch_size(FLAGS.batch_size), distributed.size())
    optimizer = precision_flags.with_loss_scaling(
        optimization_flags.build_optimizer(settings, steps_per_epoch))
    exchange = distributed_flags.embedding_exchange(steps_per_epoch)
    # Under Horovod the model's compile turns XLA off
    # (tfscale.training.train_step.TrainStep.compile). The loss scaling is --loss_scale's alone:
    # Keras would wrap a mixed_float16 model's optimizer in its own dynamic scaler even with
    # --loss_scale=none.
    model.compile(optimizer=optimizer, loss=keras.losses.BinaryCrossentropy(),
                  metrics=[keras.metrics.AUC(name="auc")], embedding_exchange=exchange,
                  embedding_staleness=FLAGS.embedding_staleness, auto_scale_loss=False)
    if distributed.is_chief():
        passes = f"{len(days)} days once each" if FLAGS.progressive else f"{FLAGS.epochs} epochs"
        data = progressive_flags.describe(days) if FLAGS.progressive else source.describe()
        print(f"model {FLAGS.model} ({model.count_params():,} parameters) on "
              f"{data}; batch {FLAGS.batch_size}, {passes}, optimizer "
              f"{optimizer_name}, {optimization_flags.describe(settings)}; "
              f"{precision_flags.describe()}; {distributed_flags.describe(exchange)}; TensorFlow "
              f"{tf.__version__}", flush=True)
        print(hybrid_flags.describe(model), flush=True)
        residuals = distributed_flags.describe_residuals(exchange, model)
        if residuals:
            print(residuals, flush=True)
        warning = precision_flags.cpu_float16_warning()
        if warning:
            print(warning, flush=True)
        if checkpoint_dir and not run_record.exists(checkpoint_dir):  # a resumed run keeps its
            # own; it is what launch.predict and launch.export rebuild the model from
            run_record.write(checkpoint_dir, FLAGS.model, model, source, FLAGS.data,
                             FLAGS.precision)
    run_settings = dict(
        batch_size=FLAGS.batch_size, log_every_steps=FLAGS.log_every_steps, logdir=logdir,
        checkpoint_dir=checkpoint_dir, checkpoint_every_steps=FLAGS.checkpoint_every_steps,
        resume=FLAGS.resume, stop_after_steps=FLAGS.stop_after_steps)

    def print_line(line):
        print(line, flush=True)

    if FLAGS.progressive:
        result = train_progressively(model, days, ProgressiveConfig(**run_settings), print_line)
        scored = days[-1][1]  # the trained model's scores of the last day's first lines
    else:
        profile_steps = tuple(int(step) for step in FLAGS.profile_steps) or None
        result = train(model, source, TrainingConfig(epochs=FLAGS.epochs,
                                                     profile_steps=profile_steps, **run_settings),
                       print_line)
        scored = source
    if checkpoint_dir and not result.stopped_early and not result.finished_before:
        # On every rank (row-sharded lookups need them all): the trained model's own scores of
        # a few test lines, what launch.predict and launch.export can be checked against.
        run_record.write_trained_predictions(checkpoint_dir, model, scored, result.global_step)
    if distributed.is_chief():
        if FLAGS.progressive:
            progressive_flags.report(result, days, logdir, checkpoint_dir)
        else:
            common_flags.report(result, source, logdir, checkpoint_dir)


def retain_freed_memory():
    """--retain_freed_memory_mib, said on rank 0 where it cannot be set."""
    from tfscale import distributed
    from tfscale.data import allocator

    mib = FLAGS.retain_freed_memory_mib
    if mib and not allocator.retain_freed_memory(mib << 20) and distributed.is_chief():
        print("--retain_freed_memory_mib: the C library is not glibc; its allocator is left as "
              "it is", flush=True)


if __name__ == "__main__":
    app.run(absl_main(run))
