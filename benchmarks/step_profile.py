"""Where a training step's time goes: tfscale's DeepFM step under one embedding update path,
traced with TensorFlow's profiler and summed by op, grouped into the step's parts.

    python -m benchmarks.step_profile --mode=row_sparse_adam [--batch_size=1024] [--steps=30] [--warmup_steps=5]

Runs `model.fit` on the synthetic data's batches (the small-batch benchmark's), traces
`--steps` steps after warm-up, and prints, per step (from one step function's start to the
next's, on the trace's clock): the wall time; per part of the step the summed op time (ops can
run side by side on the two cores, so the parts may add up to more than the step); and the time
in which no op ran (the fit loop, the step function's call, waits between ops). The parts are
told by the Keras name scopes in the op's name (`_part`).
"""

import collections
import glob
import os
import re
import tempfile

import numpy as np
from absl import app, flags

from benchmarks import small_batch  # its flags too: --steps, --warmup_steps, --vocabulary_scale

FLAGS = flags.FLAGS
flags.DEFINE_string("mode", "row_sparse_adam", "An update path of benchmarks.small_batch.")
flags.DEFINE_integer("batch_size", 1024, "Examples per step.")
flags.DEFINE_integer("top", 25, "Op types listed.")
flags.DEFINE_integer("top_ops", 0, "Also list the N costliest ops by name.")

TABLE_IO = re.compile(r"ResourceGather|ResourceScatter\w*")
SUMS = re.compile(r"UnsortedSegmentSum|Unique\w*")


def _part(name):
    """The part of the step the op event `name` ("scope/.../op_name:OpType") belongs to, told by
    the Keras name scopes in its name (the model's layers, the loss, the tape's gradients)."""
    op_type = name.rsplit(":", 1)[1]
    backward = "gradient_tape/" in name
    if op_type == "ResourceApplyAdam":
        return "optimizer: fused Adam (dense weights; whole tables)"
    if "field_embedding" in name:
        return ("embedding backward (rows summed per unique id)" if backward else
                "embedding lookup (id check, unique ids, row gathers, gather back)")
    if "compile_loss" in name:
        return "loss"
    if backward:
        return "DNN, FM and linear part: backward"
    if "deepfm" in name:
        return "DNN, FM and linear part: forward"
    if TABLE_IO.fullmatch(op_type):
        return "optimizer: table and moment rows read and written"
    if SUMS.fullmatch(op_type):
        return "row gradients summed into dense tables (dense path) or per repeated id"
    return "optimizer: other ops (Adam on rows, CowClip's norms, clip and L2, step counters)"


STEP = "step"  # the event name _xplane_events gives the start of each step's function


def _xplane_events(logdir):
    """(name, start_ps, duration_ps) of every TensorFlow op event in the trace under
    `logdir`, and (STEP, start_ps, 0) at the start of each step."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    path = sorted(glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True))[-1]
    space = xplane_pb2.XSpace()
    with open(path, "rb") as stream:
        space.ParseFromString(stream.read())
    for plane in space.planes:
        if not plane.name.startswith("/host:CPU"):
            continue
        metadata = plane.event_metadata
        for line in plane.lines:
            for event in line.events:
                name = metadata[event.metadata_id].name
                # TensorFlow op events are named "op_name:OpType"; the step function's and the
                # executor's own events ("Process", "Run", "__inference_...") contain them.
                if ":" not in name or name.startswith(("$", "tf_data", "Iterator")):
                    continue
                if re.fullmatch(r"\s*(Process|Run|__inference\w*|MakeIterator|"
                                r"OptionalHasValue|OptionalGetValue|IteratorGetNext\w*)",
                                name.rsplit(":", 1)[1]):
                    if "__inference_multi_step_on_iterator" in name:
                        yield STEP, line.timestamp_ns * 1000 + event.offset_ps, 0
                    continue
                yield name, line.timestamp_ns * 1000 + event.offset_ps, event.duration_ps


def _busy_ps(intervals):
    """Picoseconds covered by at least one of `intervals` ((start, duration) pairs)."""
    busy, reached = 0, None
    for start, duration in sorted(intervals):
        end = start + duration
        if reached is None or start > reached:
            busy += duration
            reached = end
        elif end > reached:
            busy += end - reached
            reached = end
    return busy


def main(argv):
    del argv
    import tensorflow as tf

    from benchmarks.timing import machine_description

    batch_size, steps, warmup = FLAGS.batch_size, FLAGS.steps or 30, FLAGS.warmup_steps
    with tempfile.TemporaryDirectory() as directory:
        batch_file = os.path.join(directory, "batches.npz")
        small_batch.write_batches(batch_file, batch_size, min(warmup + steps, 64))
        with np.load(batch_file) as stored:
            batches = {name: stored[name] for name in stored.files}
        model = small_batch.build_compiled(FLAGS.mode)
        dataset = tf.data.Dataset.from_tensor_slices(
            ({"dense": batches["dense"], "categorical": batches["categorical"]},
             batches["labels"])).repeat()
        model.fit(dataset.take(warmup), verbose=0)
        logdir = os.path.join(directory, "trace")
        tf.profiler.experimental.start(logdir)
        model.fit(dataset.take(steps), verbose=0)
        tf.profiler.experimental.stop()
        events = list(_xplane_events(logdir))
    # Steps between the first and the last step's start, on the trace's clock.
    starts = sorted(start for name, start, _ in events if name == STEP)
    first, last, timed = starts[0], starts[-1], len(starts) - 1
    by_type = collections.Counter()
    by_name = collections.Counter()
    by_part = collections.Counter()
    intervals = []
    for name, start_ps, duration_ps in events:
        if name == STEP or not first <= start_ps < last:
            continue
        by_type[name.rsplit(":", 1)[1]] += duration_ps
        by_name[name] += duration_ps
        by_part[_part(name)] += duration_ps
        intervals.append((start_ps, min(duration_ps, last - start_ps)))
    wall = (last - first) / 1e12 / timed
    per_step_ms = lambda ps: ps / 1e9 / timed  # noqa: E731
    print(f"machine: {machine_description()}")
    print(f"{FLAGS.mode}, batch {batch_size:,}: {wall * 1e3:.1f} ms per step (traced, from one "
          f"step's start to the next's), {batch_size / wall:,.0f} examples/s")
    total = sum(by_part.values())
    print("\n| part | op time per step (ms) | share |\n|---|---|---|")
    for part, duration in by_part.most_common():
        print(f"| {part} | {per_step_ms(duration):.2f} | {duration / total:.0%} |")
    print(f"| all ops | {per_step_ms(total):.2f} | |")
    busy = per_step_ms(_busy_ps(intervals))
    print(f"\nsome op running: {busy:.2f} ms per step; no op running: {wall * 1e3 - busy:.2f} ms "
          "(the fit loop, the step function's call, waits between ops)")
    print(f"\nop types (top {FLAGS.top}): " + ", ".join(
        f"{op} {per_step_ms(d):.2f}" for op, d in by_type.most_common(FLAGS.top)))
    if FLAGS.top_ops:
        print(f"\nops by name (top {FLAGS.top_ops}), ms per step:")
        for name, duration in by_name.most_common(FLAGS.top_ops):
            print(f"  {per_step_ms(duration):7.2f}  {name}")


if __name__ == "__main__":
    app.run(main)
