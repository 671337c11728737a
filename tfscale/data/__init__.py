"""CTR data sources behind one interface (`source.CTRSource`): the built-in synthetic Criteo-like
stream (`synthetic.SyntheticCTR`) and the file formats, listed once in `FILE_FORMATS` (the
launcher's `--data` and `launch.build_vocab --format` read it), and their rows in Parquet files,
in `PARQUET_FORMATS`. A new format is a `delimited_text.DelimitedTextSource` subclass with its
`TextFormat`, plus one line here (and a `parquet.ParquetSource` subclass of the same FORMAT for
its Parquet files).
`rank_batches` gives each Horovod rank its part of arrays, a tf.data.Dataset or a source."""

from tfscale.data.avazu import AvazuCSV, AvazuParquet
from tfscale.data.criteo import CriteoParquet, CriteoTSV
from tfscale.data.rank_batches import rank_batches

FILE_FORMATS = {"criteo": CriteoTSV, "avazu": AvazuCSV}
PARQUET_FORMATS = {"criteo": CriteoParquet, "avazu": AvazuParquet}
