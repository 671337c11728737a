"""CTR data sources behind one interface (`source.CTRSource`): the built-in synthetic Criteo-like
stream (`synthetic.SyntheticCTR`) and the file formats, listed once in `FILE_FORMATS` (the
launcher's `--data` and `launch.build_vocab --format` read it). A new format is a
`text_lines.DelimitedTextSource` subclass with its `TextFormat`, plus one line here.
`rank_batches` gives each Horovod rank its part of arrays, a tf.data.Dataset or a source."""

from tfscale.data.avazu import AvazuCSV
from tfscale.data.criteo import CriteoTSV
from tfscale.data.rank_batches import rank_batches

FILE_FORMATS = {"criteo": CriteoTSV, "avazu": AvazuCSV}
