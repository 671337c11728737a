"""`TableStrategy`: how a FieldEmbedding's tables are held over the ranks and looked up. A
strategy makes each Table (with the Keras layer owning its variable), builds it, and looks a
step's rows up in all of a layer's tables at once (they share their rows). Strategies are named
in the registry, tfscale.embedding.strategies: a new one is a module with a TableStrategy
subclass plus one line there."""


class TableStrategy:
    """Base class: `name` (FieldEmbedding's `sharding`), `partitioned` (whether ranks hold
    different rows, which are then never broadcast, averaged or written whole by one rank)."""

    name = None
    partitioned = False

    def check(self, embedding):
        """Raises a UserError naming the FieldEmbedding argument `embedding` has that this
        strategy cannot hold; nothing by default."""

    def make_table(self, name, rows, width, initializer, regularizer):
        """A Table `name` of `rows` x `width` (global) whose `layer` will own its variable."""
        raise NotImplementedError

    def build(self, table):
        """Builds `table.layer` and attaches its variable to `table` (Table.attach)."""
        raise NotImplementedError

    def lookup(self, tables, rows, embedding):
        """The rows `rows` (int64 global ids, any shape) of each of `tables` (one layer's, of one
        size), as [*rows.shape, width] float32 tensors, each table's de-duplicated lookup
        recorded on it (Table.record_lookup) when its gradient comes in unique rows. `embedding`
        is the FieldEmbedding looking them up (its name, options and step scalars)."""
        raise NotImplementedError
