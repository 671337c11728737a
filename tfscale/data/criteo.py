"""The Criteo Kaggle (Display Advertising Challenge) TSV reader.

Owns what a Criteo line is: tab-separated label, 13 integer features I1..I13 and 26 categorical
features C1..C26 (8-hex-digit strings), an empty field being a missing value; test files have no
label column (39 fields). Reading, checking, encoding and splitting are in delimited_text and
text_lines (and for
Parquet files of the same fields, parquet).
"""

from tfscale.data.parquet import ParquetSource
from tfscale.data.delimited_text import DelimitedTextSource
from tfscale.data.text_lines import LineLayout, TextFormat
from tfscale.errors import UserError

LABEL = "label"
DENSE_NAMES = tuple(f"I{i}" for i in range(1, 14))
CATEGORICAL_NAMES = tuple(f"C{i}" for i in range(1, 27))
_UNLABELLED = LineLayout(DENSE_NAMES + CATEGORICAL_NAMES)
_LABELLED = LineLayout((LABEL,) + _UNLABELLED.column_names)


class CriteoFormat(TextFormat):
    """Criteo lines: labelled (40 fields) or not (39), told apart by a file's first line."""

    name = "criteo"
    delimiter = "\t"
    delimiter_name = "tab"
    label_name = LABEL
    dense_names = DENSE_NAMES
    categorical_names = CATEGORICAL_NAMES

    def layout(self, path, first_lines):
        """Labelled when one of the first lines has 40 fields: a line missing trailing fields
        (a common export strips empty ones) must not make a labelled file look unlabelled."""
        found = {len(line.split(self.delimiter)) for line in first_lines}
        for layout in (_LABELLED, _UNLABELLED):
            if layout.num_fields in found:
                return layout
        raise UserError(
            f"{path} line 1: expected {_LABELLED.num_fields} tab-separated fields "
            f"({_UNLABELLED.num_fields} in a file without labels), found "
            f"{len(first_lines[0].split(self.delimiter))}"
            + ("" if len(first_lines) == 1 else
               f", and none of the first {len(first_lines)} lines has either")
            + "; is this a Criteo TSV file?"
        )


class CriteoTSV(DelimitedTextSource):
    """Criteo Kaggle TSV files (plain or .gz) as a CTRSource.

    features["dense"]: the 13 integers, by default sign(x) * log1p(|x|) (I2 has negatives), or
    min-max scaled with the ranges of a vocabulary; missing -> 0. features["categorical"]: C1..C26
    as ids, row 0 = missing, by hashing or a vocabulary (see DelimitedTextSource for every option).

    Args:
        train_paths: a path, glob, or list of them (`.gz` files are read as gzip); labelled.
        test_paths: the same for the test split; None holds out `test_fraction` of the train
            lines (by a fixed hash of file and line number).
        test_fraction: without `test_paths`, the fraction held out (0: an empty test split;
            None: none, the test split is the train split itself).
        vocabulary: a Vocabulary or the path of one saved by `launch.build_vocab`; categorical
            strings are then looked up (row 0 missing, row 1 out of vocabulary).
        hash_buckets: without a vocabulary, hash each categorical field into this many buckets
            (one int, or one per field); ids 1..buckets, 0 = missing.
        dense_transform: "log1p" (the default) or "minmax" (needs a vocabulary).
        preprocessing: a Preprocessing of this format to use instead of one made from
            `vocabulary`, `hash_buckets` and `dense_transform` (which must then be unset).
        shuffle_buffer: 0 reads the train split in file order; otherwise the file order is
            shuffled and rows within windows of this many, by (`seed`, epoch).
        seed: the seed of that shuffle.
        on_bad_line: "error" stops at the first malformed line; "skip" drops and counts them.
        on_short_line: "missing" reads the missing trailing fields of a short line as missing
            values; "error" treats such a line as malformed.
        chunk_lines: lines parsed together by one vectorised step of the passes that count
            rows, bad and short lines.

    Raises:
        UserError: a path or pattern matches no file, a file has no data lines or not the
            format's columns, or the files' columns differ; the training files have no label
            column; `preprocessing` with any of `vocabulary`, `hash_buckets` and
            `dense_transform`, or of another format; an invalid `test_fraction`,
            `hash_buckets`, `dense_transform`, `on_bad_line` or `on_short_line`.

    Example:
        ```python
        source = tfscale.data.CriteoTSV("train.txt.gz", test_fraction=0.1, hash_buckets=1_000_000)
        features, labels = next(iter(source.train_batches(1024)))
        source.schema.vocabulary_sizes  # rows per categorical field, for FieldEmbedding
        ```
    """

    FORMAT = CriteoFormat()


class CriteoParquet(ParquetSource):
    """Criteo rows in Parquet files as a CTRSource: columns label, I1..I13 and C1..C26 (or the
    names `columns` maps them to), encoded as CriteoTSV encodes lines (see ParquetSource for
    every option).

    Example:
        ```python
        source = tfscale.data.CriteoParquet(
            "day_0/part-*.parquet", columns={"label": "clicked"}, hash_buckets=1_000_000)
        features, labels = next(iter(source.train_batches(1024)))
        ```
    """

    FORMAT = CriteoTSV.FORMAT
