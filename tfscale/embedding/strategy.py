"""`TableStrategy`: how a FieldEmbedding's tables are held over the ranks and looked up. A
strategy turns a field's ids into table ids, makes each Table (with the Keras layer owning its
variable) and, where its tables need one, the layer's row index (state shared by its tables, e.g.
the id map of dynamic tables), builds them, and looks a step's rows up in all of a layer's tables
at once (they share their rows). Strategies are named in the registry,
tfscale.embedding.strategies: a new one is a module with a TableStrategy subclass plus one line
there. A strategy object holds settings only (one may serve several layers)."""


class TableStrategy:
    """Base class: `name` (FieldEmbedding's `sharding`), `partitioned` (whether ranks hold
    different rows, which are then never broadcast, averaged or written whole by one rank),
    `takes_late_gradients` (whether a row's gradient may be applied steps after its lookup, as
    stale embedding updates do: not where a row can change hands between ids meanwhile)."""

    name = None
    partitioned = False
    takes_late_gradients = True

    def get_config(self):
        """What FieldEmbedding's config stores as `sharding`: the name (a strategy with
        settings: a dict of them with its `name`, which `strategies.get` takes back)."""
        return self.name

    def check(self, embedding):
        """Raises a UserError naming the FieldEmbedding argument `embedding` has that this
        strategy cannot hold; nothing by default."""

    def id_limits(self, vocabulary_sizes):
        """Per field, the ids a FieldEmbedding takes are [0, limit): by default its rows."""
        return list(vocabulary_sizes)

    def table_ids(self, ids, offsets):
        """The table ids of `ids` (int64 [..., fields], field-local): by default the rows of a
        concatenated table (`ids + offsets`, the fields' first rows)."""
        return ids + offsets

    def make_row_index(self, embedding):
        """A Keras layer holding state `embedding`'s tables share on this rank (built by
        `build`), or None (the default)."""
        return None

    def make_table(self, name, rows, width, initializer, regularizer):
        """A Table `name` of `rows` x `width` (global) whose `layer` will own its variable."""
        raise NotImplementedError

    def build(self, table, embedding):
        """Builds `table.layer` (one of FieldEmbedding `embedding`'s) and attaches its variable
        to `table` (Table.attach)."""
        raise NotImplementedError

    def updated_whole(self, table):
        """The train step found `table` (built) updated whole, every row read every step:
        nothing by default (dynamic tables write the rows they have not handed out)."""

    def lookup(self, tables, rows, embedding, training=False):
        """The rows `rows` (int64 table ids, any shape) of each of `tables` (one layer's, of one
        size), as [*rows.shape, width] float32 tensors, each table's de-duplicated lookup
        recorded on it (Table.record_lookup) when its gradient comes in unique rows. `embedding`
        is the FieldEmbedding looking them up (its name, options, row index and step scalars);
        `training`: whether this is a training step's lookup."""
        raise NotImplementedError
