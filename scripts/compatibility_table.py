"""The compatibility tables of docs/concepts.md, written from the library's own declarations.

What combines with what is decided by class attributes the train step reads at `compile`:
each table kind's (tfscale.embedding.strategy.TableStrategy: `partitioned`,
`lookups_span_ranks`, `takes_late_gradients`, `takes_any_ids`, `checkpoint_format`), each
exchange's (tfscale.exchanges.EmbeddingExchange: `can_run_stale`, `carries_counts`,
`acts_in_one_process`; row-sharded and dynamic tables take only the averaging exchanges,
tfscale.exchanges.RowShardedExchange) and each optimizer's (tfscale.optimizers.TakesRowSlices,
TakesCountedSlices; the optimizers that may update a partitioned table whole,
tfscale.training.train_step.DENSE_SHARD_OPTIMIZERS). This script reads them and writes the
tables between the markers of docs/concepts.md (`--write`), or exits 1 when the page differs
(`--check`, run by tests/test_docs.py), so the page cannot drift from the code."""

import argparse
import os
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "concepts.md"
BEGIN = "<!-- compatibility tables: written by scripts/compatibility_table.py -->"
END = "<!-- end of compatibility tables -->"


def yes(value):
    return "yes" if value else "no"


def tables():
    """The tables, as markdown lines."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    sys.path.insert(0, str(ROOT))
    import keras

    from tfscale import exchanges, optimizers
    from tfscale.embedding import strategies
    from tfscale.exchanges.averaging import AveragingExchange
    from tfscale.training.train_step import DENSE_SHARD_OPTIMIZERS

    lines = ["Table kinds (`FieldEmbedding(sharding=...)`, the launcher's `--embedding_sharding`):",
             "",
             "| kind | held | ranks hold different rows | a lookup is a collective "
             "| stale updates allowed | ids may be any int < 2^56 | checkpoint |",
             "|---|---|---|---|---|---|---|"]
    for name, strategy in strategies.STRATEGIES.items():
        lines.append(
            f"| `{name}` | {strategy.description} | {yes(strategy.partitioned)} "
            f"| {yes(strategy.lookups_span_ranks)} | {yes(strategy.takes_late_gradients)} "
            f"| {yes(strategy.takes_any_ids)} "
            f"| {type(strategy.checkpoint_format).__name__.lower().replace('by', 'by ')} |")
    partitioned = [f"`{n}`" for n, s in strategies.STRATEGIES.items() if s.partitioned]
    lines += ["", "Exchanges (`compile(embedding_exchange=...)`, the launcher's `--embedding_comm`):",
              "", "| exchange | stale updates allowed | carries per-id counts (CowClip) "
              f"| with {' or '.join(partitioned)} tables | changes gradients in one process |",
              "|---|---|---|---|---|"]
    for name, exchange in exchanges.EXCHANGES.items():
        lines.append(f"| `{name}` | {yes(exchange.can_run_stale)} | {yes(exchange.carries_counts)} "
                     f"| {yes(issubclass(exchange, AveragingExchange))} "
                     f"| {yes(exchange.acts_in_one_process)} |")
    candidates = [optimizers.RowSparseAdam, optimizers.RowSparseAdagrad, optimizers.RowSparseCAME,
                  optimizers.RowSparseSGD, optimizers.CowClip, optimizers.CAME,
                  optimizers.FusedAdam, keras.optimizers.Adam]
    lines += ["", "Optimizers (the tables' updates):", "",
              "| optimizer | updates only the batch's rows | needs an exchange with counts "
              f"| may update {' or '.join(partitioned)} tables |",
              "|---|---|---|---|"]
    for optimizer in candidates:
        by_row = issubclass(optimizer, optimizers.TakesRowSlices)
        counted = issubclass(optimizer, optimizers.TakesCountedSlices)
        shards = by_row or issubclass(optimizer, DENSE_SHARD_OPTIMIZERS)
        module = optimizer.__module__.split(".")[0]
        lines.append(f"| `{module}.{'optimizers.' if module == 'keras' else 'optimizers.'}"
                     f"{optimizer.__name__}` | {yes(by_row)} | {yes(counted)} | {yes(shards)} |")
    return lines


def page_tables(text):
    lines = text.splitlines()
    return lines[lines.index(BEGIN) + 1:lines.index(END)]


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="rewrite docs/concepts.md's tables")
    parser.add_argument("--check", action="store_true", help="exit 1 if the page differs")
    args = parser.parse_args(argv)
    lines = tables()
    text = PAGE.read_text(encoding="utf-8")
    if args.write:
        page = text.splitlines()
        start, end = page.index(BEGIN), page.index(END)
        PAGE.write_text("\n".join(page[:start + 1] + lines + page[end:]) + "\n", encoding="utf-8")
    elif args.check:
        if page_tables(text) != lines:
            print("docs/concepts.md's compatibility tables differ from the library's "
                  "declarations; run python scripts/compatibility_table.py --write")
            return 1
    else:
        print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
