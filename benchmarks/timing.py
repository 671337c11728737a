"""Timing a model's training steps from inside `model.fit`, for the benchmarks."""

import time

import keras


class StepTimer(keras.callbacks.Callback):
    """Records the time at the end of every training batch."""

    def __init__(self):
        super().__init__()
        self.times = []

    def on_train_batch_end(self, batch, logs=None):
        self.times.append(time.perf_counter())


def examples_per_second(model, fit_args, batch_size, warmup, steps):
    """Examples/s of `model.fit(**fit_args)` over `steps` steps after `warmup` untimed ones."""
    timer = StepTimer()
    model.fit(**fit_args, callbacks=[timer], verbose=0, shuffle=False)
    timed = timer.times[warmup - 1:warmup + steps]
    return batch_size * (len(timed) - 1) / (timed[-1] - timed[0])
