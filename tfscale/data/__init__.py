"""CTR data sources behind one interface (`CTRSource`, its batches described by a
`FeatureSchema`): the built-in synthetic Criteo-like stream (`SyntheticCTR`) and the file
formats, listed once in `FILE_FORMATS` (the launcher's `--data` and `launch.build_vocab
--format` read it), and their rows in Parquet files, in `PARQUET_FORMATS`. A new format is a
`DelimitedTextSource` subclass with its `TextFormat` (which tells each file's `LineLayout`),
plus one line here (and a `ParquetSource` subclass of the same FORMAT for its Parquet files); a
source of another kind implements `CTRSource`.
`rank_batches` gives each rank its part of arrays, a tf.data.Dataset or a source;
`retain_freed_memory` sets the process's C allocator to reuse the readers' freed blocks."""

from tfscale.data.allocator import retain_freed_memory
from tfscale.data.avazu import AvazuCSV, AvazuParquet
from tfscale.data.criteo import CriteoParquet, CriteoTSV
from tfscale.data.delimited_text import DelimitedTextSource
from tfscale.data.parquet import ParquetSource
from tfscale.data.rank_batches import rank_batches
from tfscale.data.schema import FeatureSchema
from tfscale.data.source import CTRSource
from tfscale.data.synthetic import SyntheticCTR
from tfscale.data.text_lines import LineLayout, TextFormat

FILE_FORMATS = {"criteo": CriteoTSV, "avazu": AvazuCSV}
PARQUET_FORMATS = {"criteo": CriteoParquet, "avazu": AvazuParquet}

__all__ = ["AvazuCSV", "AvazuParquet", "CTRSource", "CriteoParquet", "CriteoTSV",
           "DelimitedTextSource", "FILE_FORMATS", "FeatureSchema", "LineLayout", "PARQUET_FORMATS",
           "ParquetSource", "SyntheticCTR", "TextFormat", "rank_batches",
           "retain_freed_memory"]
