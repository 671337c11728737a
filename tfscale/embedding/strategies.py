"""The registry of table strategies, by the name FieldEmbedding's `sharding` takes: one line
per strategy here, `register` at run time, or, for a strategy in another package, an entry point
of the group "tfscale.table_strategies" (name = "module:Class", a TableStrategy subclass or
instance), loaded when its name is first asked for, so the launcher's `--embedding_sharding`
takes it too.

It is also the one place that says which variables are embedding tables (`table_of`,
`tables_of`, `is_table`): the train step, the optimizers, the exchanges, checkpoints and the
launcher's reports all ask it, never a variable's name. A table is a Table a strategy made
(registered when it is built: Table.attach), or a keras.layers.Embedding's table in a user's
model, which the default strategy (`replicated`) recognises; every table is 2-D and its gradient
comes as rows. Which TableCheckpoint holds a variable: `checkpoint_format_of`."""

from importlib import metadata

import keras

from tfscale.embedding import dynamic, replicated, row_sharding
from tfscale.embedding import table as made_tables
from tfscale.embedding.strategy import TableStrategy
from tfscale.embedding.table import RowShard, Table

ENTRY_POINT_GROUP = "tfscale.table_strategies"

STRATEGIES = {strategy.name: strategy for strategy in (
    replicated.Replicated(),
    row_sharding.RowSharded(),
    dynamic.DynamicTables(),
)}

# FieldEmbedding's default `sharding`, and the strategy of a keras.layers.Embedding's table.
DEFAULT = "replicated"


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


def table_of(variable):
    """The Table of `variable`, or None when it is not an embedding table: the one answer to
    "is this a table" (module docstring).

    A Table a strategy made is found by its variable (Table.attach). A keras.layers.Embedding's
    table (a 2-D Keras variable named "embeddings" that no strategy made: Keras gives it that
    name) is recognised by the default strategy and registered as one of its Tables, every row
    on every rank, the first time it is asked for; its tf.Variable is found from then on too.

    Args:
        variable: a Keras variable, or the tf.Variable a Keras variable holds.

    Returns:
        A tfscale.embedding.table.Table, or None."""
    table = made_tables.table_of(variable)
    if table is None and _is_keras_embedding_table(variable):
        table = _registered_keras_table(variable)
    return table


def tables_of(variables):
    """The Tables of those of `variables` that are embedding tables (`table_of`), in order.

    Args:
        variables: Keras variables (or the tf.Variables they hold).

    Returns:
        A list of Tables."""
    return [t for t in map(table_of, variables) if t is not None]


def is_table(variable):
    """Whether `variable` is an embedding table (`table_of`): 2-D, its gradient in rows.

    Args:
        variable: a Keras variable, or the tf.Variable a Keras variable holds.

    Returns:
        A bool."""
    return table_of(variable) is not None


def checkpoint_format_of(variable):
    """The TableCheckpoint holding `variable`: its Table's strategy's (by row for a Keras
    Embedding's table, held by the default strategy); None for any other variable."""
    table = table_of(variable)
    return None if table is None else table.strategy.checkpoint_format


def checkpoint_formats():
    """The TableCheckpoints of every registered strategy, each once (a checkpoint is checked
    against each, so tables of a kind the model lacks are told apart)."""
    formats = []
    for strategy in STRATEGIES.values():
        if strategy.checkpoint_format not in formats:
            formats.append(strategy.checkpoint_format)
    return formats


def _is_keras_embedding_table(variable):
    return (isinstance(variable, keras.Variable) and len(variable.shape) == 2
            and variable.path.split("/")[-1] == "embeddings")


def _registered_keras_table(variable):
    """A Table of the default strategy for the keras.layers.Embedding table `variable` (its
    layer not known: only Tables a strategy made are looked up through theirs)."""
    rows, width = (int(n) for n in variable.shape)
    name = variable.path.split("/")[-2] if "/" in variable.path else variable.path
    table = Table(name, rows, width, STRATEGIES[DEFAULT], layer=None)
    table.attach(variable, RowShard(rows, 1, 0))
    return table


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
