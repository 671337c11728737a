"""The interface every CTR data source implements (synthetic generator, Criteo, Avazu), so the
launcher and the benchmarks never care where rows come from."""

import abc


class CTRSource(abc.ABC):
    """A train split and a labelled test split, streamed as batches of the source's `schema`.

    Batches are deterministic: the same (batch_size, epoch, seed) gives the same batches in the
    same order, which is what makes a stopped-and-resumed run identical to an uninterrupted one.
    """

    schema = None  # FeatureSchema

    @abc.abstractmethod
    def train_batches(self, batch_size, *, epoch=0, skip_batches=0, shard_index=0, num_shards=1):
        """One epoch of training batches as a tf.data.Dataset of (features, labels).

        Full batches only (drop remainder). `skip_batches` starts the epoch that many batches in
        (resume); rank `shard_index` of `num_shards` reads a disjoint part of the rows."""

    @abc.abstractmethod
    def test_batches(self, batch_size, *, shard_index=0, num_shards=1):
        """The whole test split once, as a tf.data.Dataset of (features, labels); the last batch
        may be short."""

    def train_steps_per_epoch(self, batch_size, num_shards=1):
        """Batches per epoch per shard, or None when it is only known after a pass (files)."""
        return None

    def bad_line_count(self):
        """Malformed lines skipped so far (sources that read files with skipping on), else 0."""
        return 0

    def describe(self):
        """A one-line description for logs."""
        return type(self).__name__
