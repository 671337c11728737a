"""Under horovodrun (a job of tests/multiworker/jobs.py): every rank counts its share of a
Criteo file (text or Parquet) into the vocabulary (tfscale.data.vocabulary_pass) and writes what it got to
OUTPUT.rank<r> (a vocabulary file), or, when the pass stops on an error, the error's message to
OUTPUT.rank<r>.error."""

from tfscale import distributed
from tfscale.data import CriteoParquet, CriteoTSV
from tfscale.data.parquet import is_parquet
from tfscale.errors import UserError


def main(path, min_count, memory_mb, output):
    distributed.init()
    mine = f"{output}.rank{distributed.rank()}"
    try:
        reader = CriteoParquet if is_parquet(path) else CriteoTSV
        vocabulary = reader.build_vocabulary(path, min_count=int(min_count),
                                                memory_mb=int(memory_mb))
    except UserError as error:
        with open(mine + ".error", "w") as stream:
            stream.write(str(error))
        return 0
    vocabulary.save(mine)
    return 0
