"""Embedding tables as one interface (tfscale.embedding.table.Table) held by interchangeable
strategies (tfscale.embedding.strategy; the registry is tfscale.embedding.strategies): `replicated`
(every rank holds every row) and `row` (tfscale.embedding.row_sharding: rank r of P holds the rows
id mod P == r)."""
