"""The registry of table strategies, by the name FieldEmbedding's `sharding` takes: one line
per strategy here, `register` at run time, or, for a strategy in another package, an entry point
of the group "tfscale.table_strategies" (name = "module:Class", a TableStrategy subclass or
instance), loaded when its name is first asked for, so the launcher's `--embedding_sharding`
takes it too. Also which TableCheckpoint holds a variable (`checkpoint_format_of`)."""

from importlib import metadata

from tfscale.embedding import dynamic, replicated, row_sharding, table_names
from tfscale.embedding.by_row_checkpoint import BY_ROW
from tfscale.embedding.strategy import TableStrategy
from tfscale.embedding.table import table_of

ENTRY_POINT_GROUP = "tfscale.table_strategies"

STRATEGIES = {strategy.name: strategy for strategy in (
    replicated.Replicated(),
    row_sharding.RowSharded(),
    dynamic.DynamicTables(),
)}


def register(strategy):
    """Adds `strategy` under its name, e.g. for a strategy that lives outside the package; a
    ValueError if the name is taken.

    Args:
        strategy: a TableStrategy instance; its `name` is what `sharding` will take.

    Raises:
        ValueError: a strategy of that name is registered already."""
    if strategy.name in STRATEGIES:
        raise ValueError(f"a table strategy named {strategy.name!r} exists already")
    STRATEGIES[strategy.name] = strategy


def names():
    """Every strategy's name: the registered ones, then the installed entry points'.

    Returns:
        A list of str, the names `get` takes."""
    return list(STRATEGIES) + [point.name for point in _entry_points()
                               if point.name not in STRATEGIES]


def get(sharding):
    """The strategy `sharding` names; a ValueError naming `sharding` and the choices.

    Args:
        sharding: a registered or installed name, a TableStrategy (returned as it is) or the
            config of one with settings (a dict, as `TableStrategy.get_config` gives it).

    Returns:
        A TableStrategy.

    Raises:
        ValueError: no strategy has that name, or an installed entry point of that name does
            not give a TableStrategy of that name."""
    if isinstance(sharding, TableStrategy):
        return sharding
    if isinstance(sharding, dict):
        settings = dict(sharding)
        return type(get(settings.pop("name", None)))(**settings)
    if sharding not in STRATEGIES:
        _load_entry_point(sharding)
    if sharding not in STRATEGIES:
        raise ValueError(f"`sharding={sharding!r}`: give one of {', '.join(names())}, or a "
                         "TableStrategy")
    return STRATEGIES[sharding]


def checkpoint_format_of(variable):
    """The TableCheckpoint holding `variable`: its Table's strategy's; by row for a Keras
    Embedding's table (tfscale.embedding.table_names); None for any other variable."""
    table = table_of(variable)
    if table is not None:
        return table.strategy.checkpoint_format
    return BY_ROW if table_names.is_row_table(variable) else None


def checkpoint_formats():
    """The TableCheckpoints of every registered strategy, each once (a checkpoint is checked
    against each, so tables of a kind the model lacks are told apart)."""
    formats = [BY_ROW]
    for strategy in STRATEGIES.values():
        if strategy.checkpoint_format not in formats:
            formats.append(strategy.checkpoint_format)
    return formats


def _entry_points():
    return metadata.entry_points(group=ENTRY_POINT_GROUP)


def _load_entry_point(name):
    """Registers the installed strategy `name`, if there is one."""
    for point in _entry_points():
        if point.name == name:
            loaded = point.load()
            strategy = loaded() if isinstance(loaded, type) else loaded
            if not isinstance(strategy, TableStrategy) or strategy.name != name:
                raise ValueError(f"entry point {point.value!r} ({ENTRY_POINT_GROUP}) must give a "
                                 f"TableStrategy named {name!r}")
            register(strategy)
            return
