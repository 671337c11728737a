"""`launch.train` on a file with no vocabulary pass, one flag away from the default: every value
keyed by its fingerprint (--categorical_encoding=fingerprint, which chooses dynamic tables when
--embedding_sharding is not given), the tables' capacity, with no --dynamic_capacity, one row per
categorical value the training rows could hold. The run is a job of the grouped launches
(tests/grouped_launches.py)."""

import pathlib
import re

from tests import grouped_launches

RUN_DIR = "{dir}/fingerprint"
TRAIN = f"{RUN_DIR}/train.txt"
ROWS = 700
FINGERPRINTED = grouped_launches.launcher_job(
    "fingerprint-capacity-from-the-file", 1, "--data=criteo", f"--train_path={TRAIN}",
    "--categorical_encoding=fingerprint", "--batch_size=64",
    "--dnn_units=16", "--epochs=1", "--logdir=none", "--checkpoint_dir=none",
    "--warmup_epochs=0")


@grouped_launches.prepare
def _file(directory):
    from tfscale.data.synthetic import SyntheticCTR

    path = pathlib.Path(TRAIN.format(dir=directory))
    path.parent.mkdir(parents=True)
    SyntheticCTR(seed=3, train_rows=ROWS, test_rows=10,
                 vocabulary_scale=0.002).write_criteo_tsv(str(path), 0, ROWS)


def test_fingerprinted_tables_take_their_capacity_from_the_training_rows(launched_jobs):
    result = launched_jobs[FINGERPRINTED]
    assert result.returncode == 0, result.output
    out = result.stdout()
    found = re.search(r"^dynamic tables: capacity ([\d,]+) rows, one per categorical value "
                      r"([\d,]+) training rows could hold \(--dynamic_capacity sets it\)$", out,
                      re.MULTILINE)
    assert found, out
    capacity, rows = (int(group.replace(",", "")) for group in found.groups())
    assert 0.8 * ROWS <= rows < ROWS  # the training rows: a tenth of the lines held out
    assert capacity == rows * 26
    assert "vocabulary:" not in out  # no pass over the file
    assert "tables dynamic (rows given to ids as they arrive)" in out
    assert re.search(r"^final test AUC [\d.]+", out, re.MULTILINE), out
