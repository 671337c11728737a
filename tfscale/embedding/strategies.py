"""The registry of table strategies, by the name FieldEmbedding's `sharding` takes: one line
per strategy."""

from tfscale.embedding import replicated, row_sharding

STRATEGIES = {strategy.name: strategy for strategy in (
    replicated.Replicated(),
    row_sharding.RowSharded(),
)}


def register(strategy):
    """Adds `strategy` (a TableStrategy instance) under its name, e.g. for a strategy that lives
    outside the package; a ValueError if the name is taken."""
    if strategy.name in STRATEGIES:
        raise ValueError(f"a table strategy named {strategy.name!r} exists already")
    STRATEGIES[strategy.name] = strategy


def get(name):
    """The strategy registered as `name`; a ValueError naming `sharding` and the choices."""
    if name not in STRATEGIES:
        raise ValueError(f"`sharding={name!r}`: give one of {', '.join(STRATEGIES)}")
    return STRATEGIES[name]
