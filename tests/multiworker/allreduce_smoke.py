"""Under horovodrun (a job of tests/multiworker/jobs.py): every rank allreduces (sums) a tensor
holding its rank and checks the result, proving the Horovod build and its Gloo transport work."""

import horovod.tensorflow as hvd
import tensorflow as tf


def main():
    hvd.init()
    values = tf.fill([4], float(hvd.rank() + 1))
    summed = hvd.allreduce(values, op=hvd.Sum, name="smoke_sum")
    expected = sum(range(1, hvd.size() + 1))
    ok = bool(tf.reduce_all(tf.equal(summed, expected)))
    print(f"rank {hvd.rank()} of {hvd.size()}: allreduce sum {summed.numpy().tolist()} "
          f"(expected {expected}) {'OK' if ok else 'WRONG'}", flush=True)
    return 0 if ok else 1
