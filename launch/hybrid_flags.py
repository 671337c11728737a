"""Hybrid-training flags (docs/persia.md): de-duplicated embedding lookups and bounded-staleness
embedding updates; the embedding tables' host placement is fixed (tfscale.embedding.placement) and
reported by `describe`."""

from absl import flags

from tfscale.embedding.strategies import names
from tfscale.errors import UserError

FLAGS = flags.FLAGS

flags.DEFINE_bool("dedup_ids", True,
                  "Look each unique id of a batch up once and gather back (the same outputs and "
                  "summed gradients; embedding gradients hold one row per unique id, so fewer "
                  "bytes are exchanged). --nodedup_ids: one row per occurrence.")
flags.DEFINE_integer("embedding_staleness", 0,
                     "Apply each step's embedding gradients this many steps later, exchanging "
                     "them while those steps compute; the dense part stays synchronous. 0: fully "
                     "synchronous. Not with --embedding_comm=topk or gtopk.", lower_bound=0)


flags.DEFINE_enum("embedding_sharding", "replicated", names(),
                  "replicated: every rank holds every embedding table whole; row: each rank holds "
                  "the rows id mod P == rank of every table and their optimizer state, and looks "
                  "the others up by alltoall (docs/sharding.md); dynamic: rows are given to ids "
                  "as they arrive in training, held as row does, up to --dynamic_capacity "
                  "(docs/dynamic.md). Not with --embedding_comm=topk|gtopk.")
flags.DEFINE_enum("sharded_wire_dtype", "float32", ["float32", "bfloat16"],
                  "--embedding_sharding=row: the dtype looked-up rows and their gradients travel "
                  "in between ranks; bfloat16 halves those bytes, rounding them to 8 significant "
                  "bits on the way (the tables stay float32; docs/sharding.md).")
flags.DEFINE_integer("dynamic_capacity", None,
                     "--embedding_sharding=dynamic: rows in use at most per table, over all "
                     "ranks (default: the data's vocabulary sizes summed; with "
                     "--categorical_encoding=fingerprint, one row per categorical value the "
                     "training files could hold, their rows x categorical fields).", lower_bound=1)
flags.DEFINE_integer("dynamic_min_count", 1,
                     "--embedding_sharding=dynamic: occurrences in training batches before an id "
                     "gets a row of its own (until then it reads its field's unknown row).",
                     lower_bound=1)
flags.DEFINE_integer("dynamic_expire_after_steps", None,
                     "--embedding_sharding=dynamic: also free rows unseen for this many steps "
                     "(default: rows are freed only when the tables are full, least recently "
                     "used first).", lower_bound=1)


# Flags that set a table strategy's settings: flag -> (the registered name of the strategy it
# goes with, its argument). Every other question about a strategy goes to the registry.
STRATEGY_SETTINGS = {
    "sharded_wire_dtype": ("row", "wire_dtype"),
    "dynamic_capacity": ("dynamic", "capacity"),
    "dynamic_min_count": ("dynamic", "min_count"),
    "dynamic_expire_after_steps": ("dynamic", "expire_after_steps"),
}


def table_strategy(dynamic_capacity=None):
    """FieldEmbedding's `sharding` for the flags: the registered name, or its config with the
    settings the flags give (TableStrategy.get_config); `dynamic_capacity` (dynamic_capacity's
    answer) stands for --dynamic_capacity when that is not given."""
    given = [flag for flag in STRATEGY_SETTINGS if FLAGS[flag].value != FLAGS[flag].default]
    misplaced = [f"--{flag}={FLAGS[flag].value} goes with --embedding_sharding={STRATEGY_SETTINGS[flag][0]}"
                 for flag in given if STRATEGY_SETTINGS[flag][0] != FLAGS.embedding_sharding]
    if misplaced:
        raise UserError(f"{'; '.join(misplaced)} (not --embedding_sharding="
                        f"{FLAGS.embedding_sharding})")
    settings = {STRATEGY_SETTINGS[flag][1]: FLAGS[flag].value for flag in given}
    if dynamic_capacity is not None:
        settings[STRATEGY_SETTINGS["dynamic_capacity"][1]] = int(dynamic_capacity)
    if not settings:
        return FLAGS.embedding_sharding
    return {"name": FLAGS.embedding_sharding, **settings}


# Encodings giving ids of any size (up to 2**56), which only tables that take any ids hold.
ANY_ID_ENCODINGS = ("fingerprint", "raw")


def choose_tables_for_encoding():
    """Without --embedding_sharding, a --categorical_encoding of ANY_ID_ENCODINGS chooses the
    tables that take any ids (TableStrategy.takes_any_ids), so that one flag turns a file's
    fixed tables into dynamic ones; sets --embedding_sharding (a default that follows another
    flag; the run's description line names the tables)."""
    if FLAGS["embedding_sharding"].present or FLAGS.categorical_encoding not in ANY_ID_ENCODINGS:
        return
    from tfscale.embedding import strategies

    FLAGS.embedding_sharding = next(name for name in strategies.names()
                                    if strategies.get(name).takes_any_ids)


def strategy():
    """The TableStrategy --embedding_sharding names (from the registry)."""
    from tfscale.embedding import strategies

    return strategies.get(FLAGS.embedding_sharding)


def any_id_strategies():
    """The names of the strategies whose ids may be any ints (TableStrategy.takes_any_ids), as
    --embedding_sharding's values: "a|b"."""
    from tfscale.embedding import strategies

    return "|".join(name for name in strategies.names() if strategies.get(name).takes_any_ids)


def dynamic_capacity(source, local_batch_size, whole_files):
    """The dynamic tables' capacity to give: --dynamic_capacity; else, when the vocabulary sizes
    are beyond what a dynamic table holds by default (ids keyed by fingerprint) and `source`
    holds `whole_files` (not one day of several), one row per categorical value its training
    rows could hold, rows x categorical fields, so that a pass over the files never evicts;
    else None (not dynamic tables, or the library's default: the vocabulary sizes summed, which
    it refuses beyond MAX_DEFAULT_CAPACITY). Refuses a capacity below the distinct ids of this
    rank's first training batch (the first step could not give them rows), before anything is
    written; the batch is read only when the capacity is below its values (rows x categorical
    fields), the most distinct ids a batch can hold, so that a start with room for them builds
    no data pipeline of its own."""
    if FLAGS.embedding_sharding != STRATEGY_SETTINGS["dynamic_capacity"][0]:
        return None
    import numpy as np

    from tfscale import distributed
    from tfscale.embedding.dynamic import MAX_DEFAULT_CAPACITY

    capacity = FLAGS.dynamic_capacity
    vocabulary_rows = sum(source.schema.vocabulary_sizes)
    if capacity is None and vocabulary_rows > MAX_DEFAULT_CAPACITY and whole_files:
        ranks = distributed.size()
        rows = source.train_steps_per_epoch(1, ranks) * ranks
        capacity = min(MAX_DEFAULT_CAPACITY, max(1, rows * source.schema.num_categorical))
        if distributed.is_chief():
            print(f"dynamic tables: capacity {capacity:,} rows, one per categorical value "
                  f"{rows:,} training rows could hold (--dynamic_capacity sets it)", flush=True)
    if local_batch_size * source.schema.num_categorical <= (capacity or vocabulary_rows):
        return capacity
    features, _ = next(iter(source.train_batches(local_batch_size, **distributed.data_shard())))
    ids = features["categorical"].numpy()
    distinct = sum(len(np.unique(ids[:, field])) for field in range(ids.shape[1]))
    if distinct > (capacity or vocabulary_rows):
        raise UserError(f"--dynamic_capacity={capacity or vocabulary_rows}: the first training "
                        f"batch alone holds {distinct:,} distinct ids; give the tables room for "
                        "the ids of many batches")
    return capacity


def row_gradient_flags():
    """The flags given that need the tables' gradients as rows (IndexedSlices)."""
    given = []
    if strategy().partitioned:
        given.append(f"--embedding_sharding={FLAGS.embedding_sharding}")
    if FLAGS.embedding_staleness:
        given.append(f"--embedding_staleness={FLAGS.embedding_staleness}")
    return given


def describe(model):
    """A few words on the embedding half: placement, how the tables are held, de-duplication,
    staleness."""
    from tfscale.embedding import placement_report
    from tfscale.optimizers import table_state

    dedup = "de-duplicated lookups" if FLAGS.dedup_ids else "plain lookups"
    staleness = (f"embedding updates {FLAGS.embedding_staleness} step(s) stale"
                 if FLAGS.embedding_staleness else "synchronous embedding updates")
    wire = ("; rows and their gradients between ranks in bfloat16"
            if FLAGS.sharded_wire_dtype == "bfloat16" else "")
    return (f"{placement_report.describe(model)}; {table_state.describe(model)}{wire}; {dedup}, "
            f"{staleness}")
