"""An independent NumPy statement of docs/gtopk.md's butterfly gTopKAllReduce and of error-feedback
top-k, for checking tfscale.distributed.topk and sparse_exchange: plain Python lists of
(index, value, contributing ranks), no TensorFlow."""

import numpy as np


def _ranked(entries, k):
    """The k entries of largest norm, ties to the one listed first (a stable sort)."""
    return sorted(entries, key=lambda e: -float(np.linalg.norm(e[1])))[:k]


def _merge(first, second, k):
    """Sums per index, listed in order of first appearance in `first`, then `second`."""
    summed = {}
    for index, value, ranks in first + second:
        if index in summed:
            old_value, old_ranks = summed[index]
            summed[index] = (old_value + value, old_ranks | ranks)
        else:
            summed[index] = (np.array(value, np.float64), set(ranks))
    return _ranked([(i, v, r) for i, (v, r) in summed.items()], k)


def gtopk(candidates, k):
    """candidates: per rank (indices, values [n] or [n, d]). Returns (indices, summed values,
    per-rank masks: which of that rank's candidates are part of the final sums)."""
    num_ranks = len(candidates)
    lists = [_ranked([(int(i), np.array(v, np.float64), {rank}) for i, v in zip(*c)], k)
             for rank, c in enumerate(candidates)]
    power = 1
    while power * 2 <= num_ranks:
        power *= 2
    for extra in range(power, num_ranks):  # fold the ranks beyond the power of two
        lists[extra - power] = _merge(lists[extra - power], lists[extra], k)
    distance = 1
    while distance < power:
        lists = [_merge(lists[min(g, g ^ distance)], lists[max(g, g ^ distance)], k)
                 for g in range(power)]
        distance *= 2
    final = lists[0]
    for other in lists[1:power]:
        assert [e[0] for e in other] == [e[0] for e in final]
    indices = np.array([e[0] for e in final], np.int64)
    values = np.array([e[1] for e in final]) if final else np.zeros((0,))
    masks = [np.array([any(e[0] == int(i) and rank in e[2] for e in final) for i in c[0]], bool)
             for rank, c in enumerate(candidates)]
    return indices, values, masks


def error_feedback_step(residuals, gradients, density, method, by_rows):
    """One step of docs/gtopk.md's top-k exchange with error feedback for one variable on every
    rank. residuals, gradients: per rank, arrays of the variable's shape; by_rows: rank rows of
    a table by L2 norm (else elements by |value|); method: "gtopk" (the global top-k of the sum)
    or "topk" (every rank's candidates summed). Returns (the gradient every rank applies, the
    mean over ranks; the new residual of each rank)."""
    num_ranks = len(residuals)
    shape = np.shape(residuals[0])
    accumulators = [np.array(r, np.float64) + np.array(g, np.float64)
                    for r, g in zip(residuals, gradients)]
    if not by_rows:
        accumulators = [a.reshape(-1) for a in accumulators]
    count = accumulators[0].shape[0]
    k = min(max(int(np.ceil(density * count)), 1), count)
    candidates = []
    for accumulator in accumulators:
        magnitude = np.linalg.norm(accumulator, axis=1) if by_rows else np.abs(accumulator)
        top = np.argsort(-magnitude, kind="stable")[:k]
        top = top[magnitude[top] > 0]  # zero rows are never sent
        candidates.append((top, accumulator[top]))
    if method == "gtopk":
        indices, sums, masks = gtopk(candidates, k)
    else:
        summed = {}
        for top, values in candidates:
            for index, value in zip(top, values):
                summed[int(index)] = summed.get(int(index), 0.0) + value
        indices = np.array(list(summed), np.int64)
        sums = np.array(list(summed.values()))
        masks = [np.ones(len(top), bool) for top, _ in candidates]
    applied = np.zeros_like(accumulators[0])
    if len(indices):
        applied[indices] = sums / num_ranks
    new_residuals = []
    for accumulator, (top, _), mask in zip(accumulators, candidates, masks):
        residual = accumulator.copy()
        residual[top[mask]] = 0.0
        new_residuals.append(residual.reshape(shape))
    return applied.reshape(shape), new_residuals
