"""Embedding tables as one interface (tfscale.embedding.table.Table) held by interchangeable
strategies (`TableStrategy`; the registry is tfscale.embedding.strategies), which
`FieldEmbedding(sharding=...)` takes by name or as an instance with its settings: `Replicated`
("replicated": every rank holds every row), `RowSharded` ("row": rank r of P holds the rows
id mod P == r) and `DynamicTables` ("dynamic": rows given to ids as they arrive)."""

from tfscale.embedding.dynamic import DynamicTables
from tfscale.embedding.replicated import Replicated
from tfscale.embedding.row_sharding import RowSharded
from tfscale.embedding.strategy import TableStrategy

__all__ = ["DynamicTables", "Replicated", "RowSharded", "TableStrategy"]
