"""Hybrid-training flags (docs/persia.md): de-duplicated embedding lookups and bounded-staleness
embedding updates; the embedding tables' host placement is fixed (tfscale.placement) and reported
by `describe`."""

from absl import flags

FLAGS = flags.FLAGS

flags.DEFINE_bool("dedup_ids", True,
                  "Look each unique id of a batch up once and gather back (the same outputs and "
                  "summed gradients; embedding gradients hold one row per unique id, so fewer "
                  "bytes are exchanged). --nodedup_ids: one row per occurrence.")
flags.DEFINE_integer("embedding_staleness", 0,
                     "Apply each step's embedding gradients this many steps later, exchanging "
                     "them while those steps compute; the dense part stays synchronous. 0: fully "
                     "synchronous. Not with --embedding_comm=topk or gtopk.", lower_bound=0)


def describe(model):
    """A few words on the embedding half: placement, de-duplication, staleness."""
    from tfscale import placement

    dedup = "de-duplicated lookups" if FLAGS.dedup_ids else "plain lookups"
    staleness = (f"embedding updates {FLAGS.embedding_staleness} step(s) stale"
                 if FLAGS.embedding_staleness else "synchronous embedding updates")
    return f"{placement.describe(model)}; {dedup}, {staleness}"
