"""Child of tests/test_synthetic.py: under op determinism, how much the first iterator of a
dataset whose map reads a 200 MB tensor adds to the peak resident memory, with the tensor held by
reference (tfscale.data.pipeline.held_by_reference) and, after it, captured plainly. Prints one
JSON line {"held_mb": ..., "captured_mb": ...}."""

import json

import tensorflow as tf

from tfscale.data.pipeline import held_by_reference

SIZE = 50_000_000  # float32: 200 MB


def _peak_mb():
    """This process's peak resident memory (VmHWM: rusage's maxrss would start at the parent's,
    which Linux carries over a fork and exec)."""
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) / 1024 for line in status if line.startswith("VmHWM"))


def _first_element_growth(table_of):
    """The peak's growth (MB) from making a deterministic pipeline's iterator and reading once."""
    def gather(index):
        return tf.reduce_sum(tf.gather(table_of(), tf.range(index, index + 1000)))

    dataset = tf.data.Dataset.range(4).map(gather, num_parallel_calls=2, deterministic=True)
    before = _peak_mb()
    next(iter(dataset.prefetch(1)))
    return _peak_mb() - before


def main():
    tf.config.experimental.enable_op_determinism()
    key, counter = tf.raw_ops.StatelessRandomGetKeyCounter(seed=tf.constant([1, 2], tf.int64))
    table = tf.raw_ops.StatelessRandomNormalV2(shape=[SIZE], key=key, counter=counter, alg=1)
    held = held_by_reference(table)
    print(json.dumps({"held_mb": _first_element_growth(held),
                      "captured_mb": _first_element_growth(lambda: table)}))


if __name__ == "__main__":
    main()
