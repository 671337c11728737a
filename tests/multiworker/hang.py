"""Run under horovodrun: every rank says it is up, then hangs (a job that never ends, for the
launch harness's timeout test; no TensorFlow, so the ranks start at once)."""

import os
import sys
import time

print(f"rank {os.environ['HOROVOD_RANK']} up, marker {sys.argv[1]}", flush=True)
time.sleep(3600)
