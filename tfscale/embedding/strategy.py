"""`TableStrategy`: how a FieldEmbedding's tables are held over the ranks and looked up. A
strategy turns a field's ids into table ids, makes each Table (with the Keras layer owning its
variable) and, where its tables need one, the layer's row index (state shared by its tables, e.g.
the id map of dynamic tables), builds them, and looks a step's rows up in all of a layer's tables
at once (they share their rows). It also answers every other question that depends on how
tables are held (the class attributes below): training, exchanges, optimizers, checkpoints,
evaluation and the launcher ask the strategy of a table (Table.strategy; the Table of a
variable is tfscale.embedding.strategies.table_of's), never its name. Strategies are named in
the registry, tfscale.embedding.strategies: a new one is a module with a TableStrategy subclass
plus one line there (or an entry point, for a strategy in another package). A strategy object
holds settings only (one may serve several layers).

A TableCheckpoint (the `checkpoint_format` of a strategy: tfscale.embedding.by_row_checkpoint's
BY_ROW, tfscale.embedding.by_id_checkpoint's BY_ID) writes and reads its tables and their
optimizer state apart from the rest of a checkpoint, every rank its own rows:
  parts(variables, state)          what it stores of those table variables and their optimizer
                                   state (`state`, a TableStateSource: `per_row(table)`, the
                                   optimizer's variables with one entry per row of it;
                                   `stored_rows(arrays, name)`, how a checkpoint file's array of
                                   such a variable is read, older layouts included);
  variables(parts)                 every variable it stores (the rest of the checkpoint skips
                                   them);
  check_matches(parts, directory)  a UserError when the checkpoint holds tables of this format
                                   the model lacks, or the reverse, before anything is read;
  save(parts, directory)           on every rank;
  restore(parts, directory)        everything, on the rank restoring (rank 0, or the only one);
  restore_rank_local(parts, directory)  after rank 0's restore and broadcast, on the others:
                                   the rows that differ between ranks."""

import contextlib

from tfscale.embedding.by_row_checkpoint import BY_ROW


class TableStrategy:
    """Base class. Its answers (class attributes; a subclass sets those that differ):

    name: FieldEmbedding's `sharding`.
    description: a few words on how the tables are held, for logs and errors.
    partitioned: whether ranks hold different rows, which are then never broadcast, averaged
        or written whole by one rank; their gradients come back through the lookup and stay on
        the rank (tfscale.exchanges.sharded).
    lookups_span_ranks: whether a lookup is a collective, so every rank must look up as many
        batches (evaluation pads a shorter rank's part with empty batches).
    takes_late_gradients: whether a row's gradient may be applied steps after its lookup, as
        stale embedding updates do (not where a row can change hands between ids meanwhile).
    takes_any_ids: whether a field's ids may be any ints in [0, 2**56) (rows given to ids as
        they come) rather than [0, vocabulary size).
    checkpoint_format: the TableCheckpoint of its tables (module docstring).
    hands_out_rows: whether a table's rows are written only when the strategy gives them to
        ids, so the table and its per-row optimizer state start unwritten (not resident:
        tfscale.embedding.table.unwritten) and a row's state is reset when it is handed out
        (Table.record_lookup's `fresh_rows`)."""

    name = None
    description = None
    partitioned = False
    lookups_span_ranks = False
    takes_late_gradients = True
    takes_any_ids = False
    checkpoint_format = BY_ROW
    hands_out_rows = False

    def get_config(self):
        """What FieldEmbedding's config stores as `sharding`: the name (a strategy with
        settings: a dict of them with its `name`, which `strategies.get` takes back).

        Returns:
            The strategy's `name`, or a dict of its settings with "name"."""
        return self.name

    def check(self, embedding):
        """Raises a UserError naming the FieldEmbedding argument `embedding` has that this
        strategy cannot hold; nothing by default.

        Args:
            embedding: the FieldEmbedding about to make its tables.

        Raises:
            UserError: `embedding` has an argument this strategy cannot hold."""

    def id_limits(self, vocabulary_sizes):
        """Per field, the ids a FieldEmbedding takes are [0, limit): by default its rows.

        Args:
            vocabulary_sizes: the FieldEmbedding's rows per field.

        Returns:
            A list of int, one limit per field."""
        return list(vocabulary_sizes)

    def table_ids(self, ids, offsets):
        """The table ids of `ids` (int64 [..., fields], field-local): by default the rows of a
        concatenated table (`ids + offsets`, the fields' first rows).

        Args:
            ids: int64 [..., fields], each field's own ids.
            offsets: int64 [fields], the first row of each field in a concatenated table.

        Returns:
            An int64 tensor of `ids`' shape."""
        return ids + offsets

    def make_row_index(self, embedding):
        """A Keras layer holding state `embedding`'s tables share on this rank (built by
        `build`), or None (the default).

        Args:
            embedding: the FieldEmbedding whose tables share it.

        Returns:
            A keras.layers.Layer, or None."""
        return None

    def make_table(self, name, rows, width, initializer, regularizer, dtype):
        """A Table `name` of `rows` x `width` (global) whose `layer` will own its variable.

        Args:
            name: the table's name (its layer's).
            rows: the table's rows over all ranks.
            width: the row width.
            initializer: the Keras initializer of its rows.
            regularizer: a Keras regularizer of the variable, or None.
            dtype: what the variable stores its rows in, one of
                tfscale.embedding.table_dtypes.TABLE_DTYPES (the lookup reads them as float32
                through Table.read_rows).

        Returns:
            A tfscale.embedding.table.Table, not built."""
        raise NotImplementedError

    def build(self, table, embedding):
        """Builds `table.layer` (one of FieldEmbedding `embedding`'s) and attaches its variable
        to `table` (Table.attach).

        Args:
            table: a Table this strategy made.
            embedding: the FieldEmbedding it belongs to (its row index is built first)."""
        raise NotImplementedError

    def updated_whole(self, table):
        """The train step found `table` (built) updated whole, every row read every step:
        nothing by default (a strategy that `hands_out_rows` writes the others first).

        Args:
            table: a built Table of this strategy."""

    def written_rows(self, table):
        """How many leading rows of `table` (built) have been written (eagerly): all of them by
        default (a strategy that `hands_out_rows`: the rows handed out so far).

        Args:
            table: a built Table of this strategy.

        Returns:
            An int, at most the rows of this rank's variable."""
        return int(table.variable.shape[0])

    @contextlib.contextmanager
    def served(self, tables):
        """Holds `tables` (built, this strategy's) in the form a SavedModel serves while it is
        traced and written (tfscale.serving.saved_model), and back in their training form after:
        by default the training form itself.

        Args:
            tables: built Tables of this strategy, in one process.

        Yields:
            The TensorFlow resources (lookup tables) that form reads besides variables, which
            the SavedModel must hold: none by default."""
        yield []

    def lookup(self, tables, rows, embedding, training=False):
        """The rows `rows` of each of `tables`, each table's de-duplicated lookup recorded on it
        (Table.record_lookup) when its gradient comes in unique rows.

        Args:
            tables: one layer's built Tables, of one size.
            rows: int64 table ids (from `table_ids`), any shape.
            embedding: the FieldEmbedding looking them up (its name, options, row index and
                step scalars).
            training: whether this is a training step's lookup.

        Returns:
            A list with one [*rows.shape, width] float32 tensor per table."""
        raise NotImplementedError
