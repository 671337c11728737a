"""A script of examples/ as a job of tests/multiworker/jobs.py, run as its `__main__` runs it:
`main(example, out_dir, *argv)` loads the script (its top level, `tfscale.distributed.init()`
included, runs as in `python examples/X.py`) and calls its `train(parse_args(argv))`, or its
`export(...)` when argv holds --export.

After training, each rank writes its model variables other than its own shards to
OUT_DIR/rank<r>.npz (in the model's order), so a test can check every rank ended with the same
weights. The seed each rank gives the script is --seed plus its rank: rank 0 starts as a
one-process run with --seed does, the others from other weights, which only the broadcast
before the first step makes equal (one seed everywhere would hide a missing broadcast)."""

import os
import runpy

import numpy as np

from tfscale import distributed
from tfscale.optimizers.table_state import local_variables


def main(example, out_dir, *argv):
    script = runpy.run_path(example)  # not as __main__: its entry line stays for us to call
    args = script["parse_args"](list(argv))
    if args.export:
        script["export"](args)
        return 0
    args.seed += distributed.rank()
    model = script["train"](args)
    local = {id(v) for v in local_variables(model)}
    shared = [v for v in model.variables if id(v) not in local]
    os.makedirs(out_dir, exist_ok=True)
    np.savez(os.path.join(out_dir, f"rank{distributed.rank()}.npz"),
             **{f"{i}:{v.path}": np.asarray(v.numpy()) for i, v in enumerate(shared)})
    return 0
