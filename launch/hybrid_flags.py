"""Hybrid-training flags (docs/persia.md): de-duplicated embedding lookups and bounded-staleness
embedding updates; the embedding tables' host placement is fixed (tfscale.embedding.placement) and
reported by `describe`."""

from absl import flags

from tfscale.embedding.strategies import STRATEGIES

FLAGS = flags.FLAGS

flags.DEFINE_bool("dedup_ids", True,
                  "Look each unique id of a batch up once and gather back (the same outputs and "
                  "summed gradients; embedding gradients hold one row per unique id, so fewer "
                  "bytes are exchanged). --nodedup_ids: one row per occurrence.")
flags.DEFINE_integer("embedding_staleness", 0,
                     "Apply each step's embedding gradients this many steps later, exchanging "
                     "them while those steps compute; the dense part stays synchronous. 0: fully "
                     "synchronous. Not with --embedding_comm=topk or gtopk.", lower_bound=0)


flags.DEFINE_enum("embedding_sharding", "replicated", list(STRATEGIES),
                  "replicated: every rank holds every embedding table whole; row: each rank holds "
                  "the rows id mod P == rank of every table and their optimizer state, and looks "
                  "the others up by alltoall (docs/sharding.md). Not with "
                  "--embedding_comm=topk|gtopk.")


def row_gradient_flags():
    """The flags given that need the tables' gradients as rows (IndexedSlices)."""
    given = []
    if FLAGS.embedding_sharding == "row":
        given.append("--embedding_sharding=row")
    if FLAGS.embedding_staleness:
        given.append(f"--embedding_staleness={FLAGS.embedding_staleness}")
    return given


def describe(model):
    """A few words on the embedding half: placement, how the tables are held, de-duplication,
    staleness."""
    from tfscale.embedding import placement
    from tfscale.optimizers import table_state

    dedup = "de-duplicated lookups" if FLAGS.dedup_ids else "plain lookups"
    staleness = (f"embedding updates {FLAGS.embedding_staleness} step(s) stale"
                 if FLAGS.embedding_staleness else "synchronous embedding updates")
    return (f"{placement.describe(model)}; {table_state.describe(model)}; {dedup}, "
            f"{staleness}")
