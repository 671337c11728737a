"""`DelimitedTextSource`: the CTRSource over delimited text files that a data set (Criteo TSV,
Avazu CSV, a user's own) specialises with a `TextFormat`.

Owns: the train and test pipelines (file order and window shuffles per epoch, sharding by line
number), the counts a run reports (rows per shard, bad and short lines, each in a pass of its
own), the test lines a run records, and the vocabulary pass over its files
(tfscale.data.vocabulary_pass). The pipelines read blocks of lines with
tfscale.data.text_blocks (pyarrow's parser and Arrow's checks, the LineParser for any block they
cannot vouch for); lines, the LineParser and the line-by-line passes are tfscale.data.text_lines'.
"""

import gzip
import itertools

import numpy as np
import tensorflow as tf

from tfscale.data import handover, vocabulary_pass
from tfscale.data.pipeline import without_autotuning
from tfscale.data.preprocessing import source_preprocessing
from tfscale.data.source import CTRSource
from tfscale.data.text_blocks import TextBlocks
from tfscale.data.text_lines import (CHUNK_LINES, FileSet, LineParser, LineSelection,
                                     check_bad_line_policy, check_short_line_policy,
                                     compression_of, held_out_fraction, in_test_split,
                                     parsed_chunks, shuffle_seed, shuffle_windows)
from tfscale.errors import UserError


# ----------------------------------------------------------------------------- the source

class DelimitedTextSource(CTRSource):
    """A CTRSource reading delimited text files of the data set described by `FORMAT`.

    Args:
      train_paths: path, glob, or list of them (`.gz` files are read as gzip). Must be labelled.
      test_paths: the same for the test split; None splits the train files by a fixed hash of
        (file, line number): lines in `test_fraction` of the hash range are test, the rest train.
      test_fraction: used only without test_paths (0: an empty test split; None: no line held
        out, the test split is the train split itself, as online training scores a day before
        training on it).
      vocabulary: a Vocabulary or the path of one saved by `launch.build_vocab`; categorical
        strings are then looked up (row 0 missing, row 1 out of vocabulary, then its values).
      hash_buckets: without a vocabulary, hash each categorical field into this many buckets
        (one int, or one per field; default preprocessing.DEFAULT_HASH_BUCKETS); ids
        1..buckets, 0 = missing. Ignored when there is a vocabulary. (vocabulary, hash_buckets
        and dense_transform make the source's `preprocessing`, a data.preprocessing.Preprocessing.)
      dense_transform: "log1p" (sign(x) * log1p(|x|), the default) or "minmax" (needs a
        vocabulary, which records each field's min and max); missing integers are 0 either way.
      preprocessing: a Preprocessing of this FORMAT to use instead of one made from
        vocabulary, hash_buckets and dense_transform (which must then be unset): sources of
        several days share one, and with it its vocabulary's lookup constants.
      shuffle_buffer: 0 reads the train split in file order; otherwise the file order is shuffled
        and rows are shuffled within consecutive windows of this many rows (shuffle_windows),
        both by a seed derived from (seed, epoch), so each epoch is deterministic.
      seed: the seed of that shuffle.
      on_bad_line: "error" stops at the first malformed line with a data error naming file and
        line; "skip" drops malformed lines and counts them (see bad_line_count).
      on_short_line: "missing" reads the missing trailing fields of a line that holds at least
        the label and one more field as missing values, counting such lines (see
        short_line_count); "error" treats such a line as malformed.
      chunk_lines: lines parsed together by one vectorised step of the passes that count rows,
        bad and short lines (training reads blocks of lines, tfscale.data.text_blocks).
    """

    FORMAT = None  # a TextFormat

    def __init__(self, train_paths, test_paths=None, *, test_fraction=0.1, vocabulary=None,
                 hash_buckets=None, dense_transform=None, preprocessing=None, shuffle_buffer=0,
                 seed=0, on_bad_line="error", on_short_line="missing", chunk_lines=CHUNK_LINES):
        fmt = self.FORMAT
        check_bad_line_policy(on_bad_line)
        check_short_line_policy(on_short_line)
        self._train = FileSet(fmt, train_paths)
        if not self._train.has_labels:
            raise UserError(f"{self._train.paths[0]}: training files need the "
                            f"'{fmt.label_name}' column and this one has none (a test file?)")
        self._test = FileSet(fmt, test_paths) if test_paths is not None else None
        self._test_fraction = held_out_fraction(test_paths, test_fraction)
        self._skip_bad_lines = on_bad_line == "skip"
        self.on_short_line = on_short_line
        self._shuffle_buffer = int(shuffle_buffer)
        self._seed = int(seed)
        self._chunk_lines = int(chunk_lines)
        # (FileSet, LineSelection) read with lines to count -> (bad, short) lines or None
        self._line_counts = {}
        self._train_rows_per_shard = {}  # num_shards -> train rows per shard
        self.preprocessing = source_preprocessing(fmt, preprocessing, vocabulary=vocabulary,
                                                  hash_buckets=hash_buckets,
                                                  dense_transform=dense_transform)
        self.schema = self.preprocessing.schema

    @property
    def train_layout(self):
        """The LineLayout of the training files."""
        return self._train.layout

    # -- CTRSource

    @property
    def test_has_labels(self):
        """False when the test files have no label column (their labels are then all 0)."""
        return (self._test or self._train).has_labels

    def train_batches(self, batch_size, *, epoch=0, skip_batches=0, shard_index=0, num_shards=1):
        selection = LineSelection(self._test_fraction, False, shard_index, num_shards)
        order = np.arange(len(self._train.paths))
        if self._shuffle_buffer:
            order = np.random.default_rng(shuffle_seed(self._seed, epoch)).permutation(order)
        rows = self._rows(self._train, selection, order)
        if self._shuffle_buffer:
            rows = shuffle_windows(rows, self._shuffle_buffer, shuffle_seed(self._seed, epoch))
        batches = rows.rebatch(batch_size, drop_remainder=True)
        return without_autotuning(batches.skip(skip_batches).prefetch(tf.data.AUTOTUNE))

    def test_batches(self, batch_size, *, shard_index=0, num_shards=1):
        files = self._test or self._train
        # Without a fraction, the same selection as the train split's (its lines counted once).
        selection = LineSelection(self._test_fraction, self._test_fraction is not None,
                                  shard_index, num_shards)
        rows = self._rows(files, selection, np.arange(len(files.paths)))
        return without_autotuning(rows.rebatch(batch_size).prefetch(tf.data.AUTOTUNE))

    def test_lines(self, count, max_scanned_lines=1_000_000):
        """The text of the first `count` well-formed lines of the test split (fewer when it is
        shorter), in file order, without line ends: lines of the test files, or the held-out
        lines of the training files. At most `max_scanned_lines` lines of each file are read."""
        files = self._test or self._train
        parser = LineParser(self.FORMAT, files, skip_bad_lines=True,
                            on_short_line=self.on_short_line)
        found = []
        for file_index, path in enumerate(files.paths):
            opener = gzip.open if compression_of(path) else open
            with opener(path, "rb") as stream:
                numbered = itertools.islice(enumerate(stream, 1), files.header_lines,
                                            files.header_lines + max_scanned_lines)
                while len(found) < count:
                    block = list(itertools.islice(numbered, CHUNK_LINES))
                    if not block:
                        break
                    numbers = tf.constant([number for number, _ in block], tf.int64)
                    lines = [raw.rstrip(b"\r\n").decode("utf-8", "replace") for _, raw in block]
                    keep = tf.logical_not(parser.bad_lines_mask(tf.constant(lines)))
                    if self._test_fraction is not None:
                        keep &= in_test_split(tf.constant(file_index, tf.int64), numbers,
                                              self._test_fraction)
                    found += [line for line, kept in zip(lines, keep.numpy()) if kept]
            if len(found) >= count:
                break
        return found[:count]

    def train_steps_per_epoch(self, batch_size, num_shards=1):
        """Full batches per epoch that every shard can read (the smallest shard's count), from
        one pass over the train files the first time it is asked (cached): lines are only
        counted, or with on_bad_line="skip" parsed, so that skipped lines do not count."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        if num_shards not in self._train_rows_per_shard:
            self._train_rows_per_shard[num_shards] = self._count_train_rows(num_shards)
        return int(min(self._train_rows_per_shard[num_shards])) // batch_size

    def _count_train_rows(self, num_shards):
        """Rows per shard of the train split, as an int64 array [num_shards]."""
        selection = LineSelection(self._test_fraction, False, 0, 1)
        order = np.arange(len(self._train.paths))
        parser = LineParser(self.FORMAT, self._train, skip_bad_lines=True,
                            on_short_line=self.on_short_line)

        def count_chunk(file_index, first_line, lines):
            numbers = first_line + tf.range(tf.size(lines, out_type=tf.int64))
            keep = selection(file_index, numbers)
            if self._skip_bad_lines:
                bad = parser.bad_lines_mask(tf.boolean_mask(lines, keep))
                keep = tf.tensor_scatter_nd_update(
                    keep, tf.where(keep), tf.logical_not(bad))
            return tf.math.unsorted_segment_sum(
                tf.cast(keep, tf.int64), numbers % num_shards, num_shards)

        counts = self._train.chunks(order, self._chunk_lines).map(
            count_chunk, num_parallel_calls=tf.data.AUTOTUNE)
        return counts.reduce(tf.zeros([num_shards], tf.int64), tf.add).numpy()

    def bad_line_count(self):
        """Malformed lines among the lines this process has read (on_bad_line="skip"), each
        counted once however many epochs read it. The pipelines cannot count (a counter is a
        stateful op, see the module doc), so the first call after a new split or shard was read
        counts its bad lines in a pass of its own; counts are cached."""
        return self._line_count(0)

    def short_line_count(self):
        """Lines missing trailing fields that were read as missing values (on_short_line=
        "missing") among the lines this process has read, counted as bad_line_count is."""
        return self._line_count(1)

    def _line_count(self, which):
        for (files, selection), counts in self._line_counts.items():
            if counts is None:
                self._line_counts[files, selection] = self._count_lines(files, selection)
        return sum(counts[which] for counts in self._line_counts.values())

    def describe(self):
        if self._test:
            test = self._test.describe()
        elif self._test_fraction is None:
            test = "the train lines themselves"
        else:
            test = f"{self._test_fraction:g} of the train lines by line hash"
        return (f"{type(self).__name__}: train {self._train.describe()}, test {test}; "
                f"{self.preprocessing.describe()}; on bad lines: "
                f"{'skip' if self._skip_bad_lines else 'error'}, on short lines: "
                f"{self.on_short_line}")

    # -- pipeline

    def _rows(self, files, selection, order):
        """Batches of variable size (one per chunk) of the selected lines, as (features, labels)."""
        if self._skip_bad_lines or self.on_short_line == "missing":
            self._line_counts.setdefault((files, selection), None)
        reader = TextBlocks(self.FORMAT, files, self._skip_bad_lines, self.on_short_line)
        raw = handover.raw_columns(
            lambda: reader.elements(selection, order, self.preprocessing.encoder), self.FORMAT)
        return raw.map(self._features, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)

    def _features(self, raw):
        return self.preprocessing.features(raw), tf.expand_dims(raw["labels"], 1)

    def _count_lines(self, files, selection):
        """(bad lines, short lines) of one split, in a pass of its own."""
        parser = LineParser(self.FORMAT, files, skip_bad_lines=True,
                            on_short_line=self.on_short_line)
        counts = parsed_chunks(files, parser, selection, np.arange(len(files.paths)),
                               self._chunk_lines,
                               lambda raw: tf.stack([raw["bad_lines"], raw["short_lines"]]))
        bad, short = counts.reduce(tf.zeros([2], tf.int64), tf.add).numpy()
        return int(bad) if self._skip_bad_lines else 0, int(short)

    # -- vocabulary

    @classmethod
    def build_vocabulary(cls, paths, *, min_count=1, on_bad_line="error",
                         on_short_line="missing", test_fraction=None, progress=None,
                         memory_mb=None):
        """Count categorical values and integer ranges in one streaming pass over `paths` (only
        the train side of the `test_fraction` split when given, as DelimitedTextSource splits
        them), split over the ranks under horovodrun, in about `memory_mb` MB of counts
        (tfscale.data.vocabulary_pass); `progress(lines counted)` is called now and then."""
        check_bad_line_policy(on_bad_line)
        return vocabulary_pass.count_files(
            cls.FORMAT, paths, min_count=min_count, on_bad_line=on_bad_line,
            on_short_line=on_short_line, test_fraction=test_fraction, progress=progress,
            memory_mb=memory_mb or vocabulary_pass.DEFAULT_MEMORY_MB)
