"""The registry of table strategies, by the name FieldEmbedding's `sharding` takes: one line
per strategy."""

from tfscale.embedding import dynamic, replicated, row_sharding
from tfscale.embedding.strategy import TableStrategy

STRATEGIES = {strategy.name: strategy for strategy in (
    replicated.Replicated(),
    row_sharding.RowSharded(),
    dynamic.DynamicTables(),
)}


def register(strategy):
    """Adds `strategy` (a TableStrategy instance) under its name, e.g. for a strategy that lives
    outside the package; a ValueError if the name is taken."""
    if strategy.name in STRATEGIES:
        raise ValueError(f"a table strategy named {strategy.name!r} exists already")
    STRATEGIES[strategy.name] = strategy


def get(sharding):
    """The strategy `sharding` names: a registered name, a TableStrategy (itself) or the config
    of one with settings (`TableStrategy.get_config`); a ValueError naming `sharding` and the
    choices."""
    if isinstance(sharding, TableStrategy):
        return sharding
    if isinstance(sharding, dict):
        settings = dict(sharding)
        return type(get(settings.pop("name", None)))(**settings)
    if sharding not in STRATEGIES:
        raise ValueError(f"`sharding={sharding!r}`: give one of {', '.join(STRATEGIES)}, or a "
                         "TableStrategy")
    return STRATEGIES[sharding]
