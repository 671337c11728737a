"""Run under horovodrun -np 2 with an output directory: the data-parallel runs
(data_parallel_steps.py), the run with an inf on one rank (loss_scale_skip.py), then online
training day by day (progressive_days.py), in one launch."""

import sys

from tests.multiworker import data_parallel_steps, loss_scale_skip, progressive_days

if __name__ == "__main__":
    data_parallel_steps.main(sys.argv[1])
    loss_scale_skip.main(sys.argv[1])
    progressive_days.main(sys.argv[1])
