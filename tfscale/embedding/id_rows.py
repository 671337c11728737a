"""`IdRows`: which id each row of this rank's dynamic tables holds (tfscale.embedding.dynamic), and
the decisions that change it: admission of new ids and eviction of old ones.

State (Keras variables of this layer, one entry per local row unless said):
  row_ids     the id a row holds, -1 when free;
  last_seen   the training step that last looked the row up;
  seen_count  the row's occurrences since its id was admitted;
  next_row    the rows handed out so far (scalar): rows 0 .. next_row - 1 have held an id;
  free_rows, free_count   a stack of the rows freed since (`free_count` of them);
  step        the training lookups done (scalar);
  sketch      admission counts of ids without a row (with `min_count` > 1).
A row is handed out from the free stack first (the lowest of the most recently freed first),
then at `next_row`. The per-row variables start unwritten (tfscale.embedding.table.unwritten),
so they take memory for the rows handed out only; an entry is written when its row is handed
out (or freed, or pushed on the stack), and only entries below `next_row` (the stack's below
`free_count`) are read. The id -> row map is a TensorFlow MutableHashTable, rebuilt from
`row_ids` after a restore (`rebuild_map`), since checkpoints keep rows by id.

Decisions depend on the global batch's ids and counts and on the rows in use, never on how ids
are spread over the ranks, so the same ids get rows and lose them at any number of ranks:
- admission: an id gets a row once it has been seen `min_count` times in training batches,
  counted in a count-min sketch (two rows of prime widths, id mod width; bounded memory; an
  estimate can only be too high, admitting an id early);
- eviction, least recently used: when the rows in use plus the step's admissions would exceed
  `capacity` (summed over the ranks), every row last seen before a step T is freed, T the first
  boundary of the global histogram of last-seen steps (BINS bins) freeing enough rows to come down
  to (1 - `evict_fraction`) of `capacity`; with `expire_after_steps` N, every N steps the rows
  unseen for N steps are freed too. Rows looked up in the current step are never freed.
Each rank holds `rows` rows, a little more than its share of `capacity`, so uneven shares do not
force a decision of its own; a rank whose share still does not fit frees its own least recently
used rows, counted in `balance_evictions` (then decisions can differ from another number of
ranks)."""

import math

import keras
import tensorflow as tf

from tfscale import distributed
from tfscale.embedding.table import unwritten

BINS = 1024
NO_ROW = -1
RANK_SLACK = 0.1  # at P > 1, each rank holds this share more than capacity / P rows


class IdRows(keras.layers.Layer):
    """This rank's id -> row map, for a dynamic table group of `capacity` rows in use at most
    over all ranks (module docstring); `rows` (set by `build`): the rows this rank holds.
    `min_count`: occurrences before an id gets a row; `sketch_width`: counters per sketch row;
    `evict_fraction`: the share of `capacity` an eviction frees; `expire_after_steps`: free rows
    unseen this long (None: only at capacity)."""

    def __init__(self, capacity, min_count=1, sketch_width=1 << 20, evict_fraction=0.1,
                 expire_after_steps=None, **kwargs):
        super().__init__(**kwargs)
        self.rows = None
        self.capacity = int(capacity)
        self.min_count = int(min_count)
        self.evict_fraction = float(evict_fraction)
        self.expire_after_steps = None if expire_after_steps is None else int(expire_after_steps)
        self.sketch_primes = _two_primes_below(int(sketch_width)) if self.min_count > 1 else ()
        self.map = None
        self.memory_checked = False  # tfscale.optimizers.table_state.warn_when_beyond_memory

    def build(self, input_shape=None):
        ranks = distributed.size()
        self.rows = (self.capacity if ranks == 1
                     else math.ceil(self.capacity / ranks * (1 + RANK_SLACK)))

        def weight(name, shape, initializer, dtype="int64"):
            return self.add_weight(shape=shape, initializer=initializer, dtype=dtype,
                                   trainable=False, autocast=False, name=name)

        with tf.device("/cpu:0"):
            self.row_ids = weight("row_ids", (self.rows,), unwritten)
            self.last_seen = weight("last_seen", (self.rows,), unwritten)
            self.seen_count = weight("seen_count", (self.rows,), unwritten)
            self.free_rows = weight("free_rows", (self.rows,), unwritten)
            self.free_count = weight("free_count", (), "zeros")
            self.next_row = weight("next_row", (), "zeros")
            self.step = weight("step", (), "zeros")
            self.sketch = (weight("sketch", (2, max(self.sketch_primes)), "zeros", "int32")
                           if self.sketch_primes else None)
        # Outside any graph being traced, as Keras creates variables: a subclassed model is
        # built in a scratch graph, which a table created there would not outlive.
        with tf.init_scope(), tf.device("/cpu:0"):
            self.map = tf.lookup.experimental.MutableHashTable(tf.int64, tf.int64, NO_ROW,
                                                               name=f"{self.name}_map")

    @property
    def state(self):
        """The variables that differ between ranks (all but `step`)."""
        return [v for v in (self.row_ids, self.last_seen, self.seen_count, self.free_rows,
                            self.free_count, self.next_row, self.sketch) if v is not None]

    def in_use(self):
        """(rows, ids): the rows holding an id, ascending, and their ids (int64 tensors)."""
        row_ids = self.handed_out(self.row_ids)
        rows = tf.where(row_ids >= 0)[:, 0]
        return rows, tf.gather(row_ids, rows)

    def handed_out(self, variable):
        """The entries of `variable` (one of this layer's per-row variables, or a table's) of
        the rows handed out so far, read in place."""
        return tf.gather(variable.value, tf.range(self.next_row.value.read_value()))

    def rows_of(self, keys):
        """The rows of `keys` (int64 [n]), NO_ROW for ids without one; changes nothing."""
        return tf.ensure_shape(self.map.lookup(keys), [None])

    def rows_for_step(self, keys, counts, scalars=None):
        """A training step's rows of `keys` (unique int64 [n] owned here) seen `counts` times in
        the global batch: (rows, NO_ROW for ids not admitted; the rows given to new ids; the new
        ids). Stamps the rows as seen, counts, admits and evicts (module docstring); with
        `scalars` (a StepScalars) records rows in use, admitted, evicted and unknown lookups."""
        counts = tf.cast(counts, tf.int64)
        step = self.step.value.assign_add(1)
        expired = self._expire(step) if self.expire_after_steps else tf.constant(0, tf.int64)
        rows = self.rows_of(keys)
        known = rows >= 0
        known_rows = tf.boolean_mask(rows, known)
        self._scatter(self.last_seen, known_rows, tf.fill(tf.shape(known_rows), step))
        self._scatter(self.seen_count, known_rows, tf.boolean_mask(counts, known), add=True)

        new_position = tf.where(~known)[:, 0]
        new_keys, new_counts = tf.gather(keys, new_position), tf.gather(counts, new_position)
        admit = self._admitted(new_keys, new_counts)
        admitted_position = tf.boolean_mask(new_position, admit)
        admitted_keys = tf.boolean_mask(new_keys, admit)
        admitted_counts = tf.boolean_mask(new_counts, admit)
        evicted = self._make_room(tf.size(admitted_keys, out_type=tf.int64), step, scalars)
        with tf.control_dependencies([evicted]):  # carries the check that the new ids fit
            fresh = self._pop_free(tf.size(admitted_keys, out_type=tf.int64))
        self.map.insert(admitted_keys, fresh)
        self._scatter(self.row_ids, fresh, admitted_keys)
        self._scatter(self.last_seen, fresh, tf.fill(tf.shape(fresh), step))
        self._scatter(self.seen_count, fresh, admitted_counts)
        rows = tf.tensor_scatter_nd_update(rows, admitted_position[:, None], fresh)
        if scalars is not None:
            self._record(scalars, tf.size(admitted_keys, out_type=tf.int64), evicted + expired,
                         tf.reduce_sum(tf.where(rows < 0, counts, 0)))
        return rows, fresh, admitted_keys

    def _record(self, scalars, admitted, evicted, unknown_lookups):
        """Records the step's rows in use (after it), admitted and evicted ids and lookups of
        ids without a row, summed over the ranks."""
        totals = distributed.allreduce_sum(
            tf.stack([self._rows_in_use(), admitted, evicted, unknown_lookups]),
            name=f"{self.name}_scalars")
        for i, name in enumerate(("rows_in_use", "admitted", "evicted", "unknown_lookups")):
            scalars.record(f"dynamic/{self.name}/{name}", totals[i])

    def rebuild_map(self):
        """Refills the id -> row map from `row_ids` (after a restore)."""
        self.map.remove(self.map.export()[0])
        rows, ids = self.in_use()
        self.map.insert(ids, rows)

    def _rows_in_use(self):
        return self.next_row.value.read_value() - self.free_count.value.read_value()

    # Admission

    def _admitted(self, keys, counts):
        """Whether each of `keys` (no row yet) has now been seen `min_count` times."""
        if not self.sketch_primes:
            return tf.ones(tf.shape(keys), tf.bool)
        cells = tf.stack([tf.stack([tf.fill(tf.shape(keys), tf.constant(d, tf.int64)),
                                    tf.math.floormod(keys, prime)], axis=1)
                          for d, prime in enumerate(self.sketch_primes)], axis=0)
        cells = tf.reshape(cells, [-1, 2])
        sketch = self.sketch.value
        sketch.scatter_nd_add(cells, tf.cast(tf.tile(counts, [2]), tf.int32))
        # Saturate at min_count, so the int32 counters never overflow.
        capped = tf.minimum(tf.gather_nd(sketch, cells), self.min_count)
        sketch.scatter_nd_update(cells, capped)
        estimate = tf.reduce_min(tf.reshape(capped, [2, -1]), axis=0)
        return estimate >= self.min_count

    # Eviction

    def _make_room(self, needed, step, scalars):
        """Frees rows so that `needed` new ids fit (module docstring); returns how many it
        freed; an InvalidArgumentError naming `capacity` when one batch's new ids cannot fit."""
        totals = distributed.allreduce_sum(tf.stack([self._rows_in_use(), needed]),
                                           name=f"{self.name}_totals")
        excess = totals[0] + totals[1] - self.capacity
        target = int((1 - self.evict_fraction) * self.capacity)
        evicted = tf.cond(excess > 0,
                          lambda: self._evict_least_recent(totals[0] + totals[1] - target, step),
                          lambda: tf.constant(0, tf.int64))
        short = needed - (self.rows - self._rows_in_use())
        balance = tf.cond(short > 0, lambda: self._evict_local_least_recent(short, step),
                          lambda: tf.constant(0, tf.int64))
        if scalars is not None:
            scalars.record(f"dynamic/{self.name}/balance_evictions", balance)
        check = tf.debugging.assert_less_equal(
            needed, self.rows - self._rows_in_use(),
            message=f"{self.name}: one batch's new ids do not fit in the dynamic table even after "
                    "evicting every row not in the batch: give FieldEmbedding's dynamic tables a "
                    "larger `capacity` (at least the unique ids of a few batches)")
        with tf.control_dependencies([check]):
            return tf.identity(evicted + balance)

    def _evict_least_recent(self, wanted, step):
        """Frees every row last seen before the first boundary of the global histogram of
        last-seen steps that frees at least `wanted` rows (all rows not seen this step if none
        does); the same rows at any number of ranks."""
        last_seen = self.handed_out(self.last_seen)
        eligible = (self.handed_out(self.row_ids) >= 0) & (last_seen < step)
        oldest = -distributed.allreduce_max(-tf.reduce_min(tf.where(eligible, last_seen, step)),
                                            name=f"{self.name}_oldest")
        width = tf.maximum((step - oldest + BINS - 1) // BINS, 1)
        bins = tf.math.bincount(tf.cast((tf.boolean_mask(last_seen, eligible) - oldest) // width,
                                        tf.int32), minlength=BINS, maxlength=BINS, dtype=tf.int64)
        cumulative = tf.cumsum(distributed.allreduce_sum(bins, name=f"{self.name}_ages"))
        enough = cumulative >= wanted
        last_bin = tf.where(tf.reduce_any(enough), tf.argmax(enough, output_type=tf.int64),
                            BINS - 1)
        threshold = oldest + (last_bin + 1) * width
        return self._free(tf.where(eligible & (last_seen < threshold))[:, 0])

    def _evict_local_least_recent(self, wanted, step):
        """Frees this rank's `wanted` least recently seen rows not seen this step (ties: lower
        row first)."""
        last_seen = self.handed_out(self.last_seen)
        eligible = (self.handed_out(self.row_ids) >= 0) & (last_seen < step)
        age = tf.where(eligible, tf.cast(step - last_seen, tf.float64), -1.0)
        k = tf.minimum(wanted, tf.reduce_sum(tf.cast(eligible, tf.int64)))
        return self._free(tf.math.top_k(age, tf.cast(k, tf.int32)).indices)

    def _expire(self, step):
        """Every `expire_after_steps` steps, frees the rows unseen for that many steps."""
        period = self.expire_after_steps

        def expire():
            stale = (self.handed_out(self.row_ids) >= 0) & (
                self.handed_out(self.last_seen) <= step - period)
            return self._free(tf.where(stale)[:, 0])

        return tf.cond(step % period == 0, expire, lambda: tf.constant(0, tf.int64))

    def _free(self, rows):
        """Frees `rows` (int64, in use): their ids leave the map and the rows go on the free
        stack; returns how many."""
        rows = tf.cast(rows, tf.int64)
        self.map.remove(tf.gather(self.row_ids.value, rows))
        self._scatter(self.row_ids, rows, tf.fill(tf.shape(rows), tf.constant(NO_ROW, tf.int64)))
        count = tf.size(rows, out_type=tf.int64)
        top = self.free_count.value.read_value()
        # Pushed highest row first, so the lowest freed row is handed out first.
        self._scatter(self.free_rows, top + tf.range(count, dtype=tf.int64), tf.reverse(rows, [0]))
        self.free_count.value.assign_add(count)
        return count

    def _pop_free(self, count):
        """`count` free rows: off the stack (lowest of the most recently freed first), then from
        `next_row` on."""
        top = self.free_count.value.read_value()
        reused = tf.minimum(count, top)
        first = self.next_row.value.read_value()
        rows = tf.concat([tf.reverse(tf.gather(self.free_rows.value, tf.range(top - reused, top)),
                                     [0]),
                          tf.range(first, first + count - reused)], axis=0)
        with tf.control_dependencies([rows]):
            self.free_count.value.assign_sub(reused)
            self.next_row.value.assign_add(count - reused)
        return rows

    @staticmethod
    def _scatter(variable, rows, values, add=False):
        update = tf.IndexedSlices(values, rows)
        if add:
            variable.value.scatter_add(update)
        else:
            variable.value.scatter_update(update)


def write_rows_from(variable, first, fill, block_rows=1 << 20):
    """Writes `fill` into rows `first`, `first` + 1, ... of `variable` (eagerly, in blocks)."""
    rows = int(variable.shape[0])
    for start in range(first, rows, block_rows):
        indices = tf.range(start, min(start + block_rows, rows), dtype=tf.int64)
        values = tf.fill(tf.concat([tf.shape(indices), list(variable.shape[1:])], axis=0),
                         tf.constant(fill, variable.dtype))
        variable.value.scatter_update(tf.IndexedSlices(values, indices))


def _two_primes_below(limit):
    """The two largest primes <= `limit` (>= 5), largest first."""
    primes = []
    candidate = max(int(limit), 5)
    while len(primes) < 2:
        if all(candidate % d for d in range(2, int(candidate ** 0.5) + 1)):
            primes.append(candidate)
        candidate -= 1
    return tuple(primes)
