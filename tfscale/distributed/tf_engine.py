"""TensorFlow's own engine: tfscale's collectives on the collective runtime inside every TF wheel
(the one tf.distribute.MultiWorkerMirroredStrategy runs on): gRPC between processes, rings on
CPU, NCCL for GPU tensors. Processes find each other through TF_CONFIG (tfscale.run writes it on
one host; Kubernetes' TFJob, Vertex AI and SageMaker set it for TF jobs).

The runtime's collectives take equal shapes on every rank (alltoall: equal chunks); per-rank
first dimensions are agreed first (one small allgather) and padded to the largest, which costs
bytes (measured in benchmarks.engines).

Keys. The runtime remembers each (group key, instance key) with the shape it first saw, so a
collective whose shapes change from call to call needs a new instance key each call, agreed by
every rank. Each named collective (every rank names its collectives alike, as under Horovod) is
its own group (the key derived from the name), and its calls are counted: the n-th call of a
name on one rank meets the n-th call of that name on the others, whatever the order between
names, so collectives issued from two threads (the input pipeline's agreement, the step) cannot
cross. Inside a tf.function the count is read when the function is called, not traced.

Each collective waits at most `timeout_seconds` for its peers; a failed collective leaves the
runtime unusable, so a job whose collective failed must end."""

import itertools
import pickle
import socket
import zlib

import numpy as np
import tensorflow as tf
from tensorflow.python.framework import ops
from tensorflow.python.ops import collective_ops

from tfscale.distributed.engine import Engine
from tfscale.errors import UserError
from tfscale.row_gradients import CountedSlices

# Fused broadcasts and reductions are cut into pieces of at most this many bytes (gRPC messages
# are limited to 2 GB; pieces also bound the extra memory of a fused buffer).
_PIECE_BYTES = 64 << 20
_WIRE_DTYPES = (tf.float16, tf.float32, tf.float64, tf.int32, tf.int64)
_MERGE_OPS = {"sum": ("Add", "Id"), "average": ("Add", "Div"), "min": ("Min", "Id"),
              "max": ("Max", "Id")}


def start_runtime(cluster):
    """Starts this process's gRPC server and collective executor for `cluster` (a TFCluster).
    Must run before TensorFlow's context is created (before any op); GPUs but the local rank's
    are hidden first."""
    from tensorflow.core.protobuf import config_pb2, tensorflow_server_pb2
    from tensorflow.python.eager import context

    _check_port_free(cluster.port)
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        tf.config.set_visible_devices(gpus[cluster.local_rank % len(gpus)], "GPU")
    config = config_pb2.ConfigProto()
    config.CopyFrom(context.context().config)  # this process's settings, as MultiWorkerMirrored
    config.experimental.collective_group_leader = cluster.device_prefix(0)
    context.context().configure_collective_ops(
        collective_leader=cluster.device_prefix(0),
        device_filters=(cluster.device_prefix(cluster.rank).replace("/replica:0", ""),))
    server_def = tensorflow_server_pb2.ServerDef(
        cluster=tf.train.ClusterSpec(cluster.spec).as_cluster_def(),
        default_session_config=config, job_name=cluster.job, task_index=cluster.task_index,
        protocol="grpc", port=cluster.port)
    context.context().enable_collective_ops(server_def)


class TFEngine(Engine):
    """The collective runtime of a started cluster (`start_runtime`)."""

    name = "tf"

    def __init__(self, cluster, timeout_seconds):
        self.rank, self.size = cluster.rank, cluster.size
        self.local_rank, self.local_size = cluster.local_rank, cluster.local_size
        self._cluster = cluster
        self._timeout = float(timeout_seconds)
        self._gpu = bool(tf.config.list_logical_devices("GPU"))
        self._groups, self._calls = {}, {}
        # NCCL needs the same order on every rank; an ordering token serialises GPU collectives.
        self._ordering = tf.Variable(0.0, name="tfscale_collective_order") if self._gpu else None

    def rank_of_task(self, job, index):
        return self._cluster.rank_of(job, index)

    # The runtime's primitives, keyed by name.

    def _keys(self, name, on_gpu):
        """(group key, instance key) of the next call of collective `name`."""
        name = f"{name}@gpu" if on_gpu else name
        group = zlib.crc32(name.encode()) & 0x3FFFFFFF | 0x40000000
        known = self._groups.setdefault(group, name)
        if known != name:
            raise RuntimeError(f"collectives {known!r} and {name!r} map to one group key: "
                               "rename one")
        calls = self._calls.setdefault(name, itertools.count(1))
        if not tf.inside_function():
            return group, next(calls)
        graph = ops.get_default_graph()
        while getattr(graph, "is_control_flow_graph", False):  # as MultiWorkerMirrored does
            graph = graph.outer_graph
        with graph.as_default():
            return group, graph.capture_call_time_value(lambda: tf.constant(next(calls)),
                                                        tf.TensorSpec([], tf.int32))

    def _options(self, name, on_gpu=False):
        group, instance = self._keys(name, on_gpu)
        options = dict(group_size=self.size, group_key=group, instance_key=instance,
                       timeout=self._timeout, communication_hint="nccl" if on_gpu else "ring")
        if on_gpu:
            options["ordering_token"] = self._ordering.handle
        return options

    def _gather_equal(self, tensor, name):
        with tf.device("CPU:0"):
            return collective_ops.all_gather_v2(tensor, **self._options(name))

    def _reduce(self, tensor, op, name, on_gpu=False):
        merge, final = _MERGE_OPS[op]
        with tf.device("GPU:0" if on_gpu else "CPU:0"):
            return collective_ops.all_reduce_v2(tensor, merge_op=merge, final_op=final,
                                                **self._options(name, on_gpu))

    # The contract.

    def allreduce(self, tensor, op, name):
        tensor = tf.convert_to_tensor(tensor)
        if tensor.dtype == tf.bool:
            return tf.cast(self._reduce(tf.cast(tensor, tf.int32), op, name), tf.bool)
        return self._reduce(tensor, op, name)

    def grouped_allreduce(self, tensors, op, name):
        tensors = list(tensors)
        results = [None] * len(tensors)
        slices = [i for i, t in enumerate(tensors) if isinstance(t, tf.IndexedSlices)]
        for i, gathered in zip(slices, self._gathered_slices([tensors[i] for i in slices],
                                                             f"{name}/slices")):
            values = gathered.values / self.size if op == "average" else gathered.values
            results[i] = (CountedSlices(values, gathered.indices, tensors[i].dense_shape,
                                        gathered.counts)
                          if isinstance(gathered, CountedSlices)
                          else tf.IndexedSlices(values, gathered.indices, tensors[i].dense_shape))
        dense = [i for i, t in enumerate(tensors) if not isinstance(t, tf.IndexedSlices)]
        for i in [i for i in dense if not tensors[i].shape.is_fully_defined()]:
            results[i] = self._reduce(tensors[i], op, f"{name}/{i}", on_gpu=self._gpu)
        dense = [i for i in dense if results[i] is None]
        for dtype in sorted({tensors[i].dtype.name for i in dense}):
            members = [i for i in dense if tensors[i].dtype.name == dtype]
            reduced = self._fused_reduce([tf.convert_to_tensor(tensors[i]) for i in members],
                                         op, f"{name}/{dtype}", on_gpu=self._gpu)
            for i, value in zip(members, reduced):
                results[i] = value
        return results

    def allgather(self, tensor, name):
        return self._padded_gather([tf.convert_to_tensor(tensor)], name)[0]

    def alltoall(self, tensor, splits, name):
        original = tf.convert_to_tensor(tensor)
        tensor, unpacked = _on_the_wire(original)
        splits = tf.cast(splits, tf.int32)
        # Everyone's splits: [source, destination] rows, so every rank knows what it receives
        # and the chunk all sends are padded to.
        matrix = self._gather_equal(splits[None, :], f"{name}/splits")
        received_splits = matrix[:, self.rank]
        chunk = tf.maximum(tf.reduce_max(matrix), 1)  # the runtime crashes on empty tensors
        offsets = tf.cumsum(splits, exclusive=True)
        slot = tf.range(chunk)[None, :]
        # Row i of a destination's chunk: the sender's row offsets[d] + i, or the zero row.
        rows = tf.where(slot < splits[:, None], offsets[:, None] + slot,
                        tf.shape(tensor)[0])
        padded = tf.gather(_with_zero_row(tensor), rows)  # [size, chunk, ...]
        flat = tf.reshape(padded, [self.size, -1])
        with tf.device("CPU:0"):
            moved = collective_ops.all_to_all_v2(flat, **self._options(f"{name}/rows"))
        moved = tf.reshape(moved, tf.concat([[self.size * chunk], tf.shape(tensor)[1:]], 0))
        keep = tf.reshape(tf.sequence_mask(received_splits, chunk), [-1])
        return _rows_like(unpacked(tf.boolean_mask(moved, keep)), original), received_splits

    def broadcast_variables(self, variables, root_rank=0):
        variables = list(variables)
        for dtype in sorted({v.dtype.name for v in variables}):
            members = [v for v in variables if v.dtype.name == dtype]
            wire = _broadcast_dtype(tf.as_dtype(dtype))
            received = [[] for _ in members]
            for piece, (flat, parts) in enumerate(_pieces([v.shape for v in members], dtype)):
                name = f"tfscale_broadcast_variables/{dtype}/{piece}"
                if self.rank == root_rank:
                    self._send(tf.cast(tf.concat([tf.reshape(members[i], [-1])[start:stop]
                                                  for i, start, stop in parts], 0), wire), name)
                    continue
                buffer = tf.cast(self._receive([flat], wire, name), dtype)
                for (i, start, stop), value in zip(parts, tf.split(
                        buffer, [stop - start for _, start, stop in parts])):
                    received[i].append(value)
            if self.rank != root_rank:
                for variable, values in zip(members, received):
                    variable.assign(tf.reshape(tf.concat(values, 0), variable.shape))

    def broadcast_object(self, value, name, root_rank=0):
        if self.rank == root_rank:
            data = pickle.dumps(value)
            words = np.frombuffer(data + bytes(-len(data) % 8), np.int64)
            self._send(tf.constant([len(data)], tf.int64), f"{name}/size")
            self._send(tf.constant(words), f"{name}/data")
            return value
        size = int(self._receive([1], tf.int64, f"{name}/size")[0])
        words = self._receive([-(-size // 8)], tf.int64, f"{name}/data")
        return pickle.loads(words.numpy().tobytes()[:size])

    def allgather_object(self, value, name):
        data = pickle.dumps(value)
        words = tf.constant(np.frombuffer(data + bytes(-len(data) % 8), np.int64))
        (joined,), sizes = self._padded_gather([words], name, with_sizes=True)
        # One size agreement serves both: pickle ignores the padding after an object's bytes.
        parts = np.split(joined.numpy(), np.cumsum(sizes.numpy()[:, 0])[:-1])
        return [pickle.loads(part.tobytes()) for part in parts]

    # Built on the primitives.

    def _send(self, tensor, name):
        with tf.device("CPU:0"):
            collective_ops.broadcast_send_v2(tensor, **self._options(name))

    def _receive(self, shape, dtype, name):
        with tf.device("CPU:0"):
            return collective_ops.broadcast_recv_v2(tf.constant(shape, tf.int32), dtype,
                                                    **self._options(name))

    def _padded_gather(self, tensors, name, with_sizes=False):
        """Each of `tensors` (first dimensions per rank) gathered from every rank: one allgather
        of all their sizes, then one of each padded to its largest rank's size."""
        sizes = self._gather_equal(
            tf.stack([tf.shape(t, out_type=tf.int32)[0] for t in tensors])[None, :],
            f"{name}/sizes")  # [rank, tensor]
        # At least one row: the runtime's collectives crash on empty tensors.
        longest = tf.maximum(tf.reduce_max(sizes, axis=0), 1)
        gathered = []
        for i, original in enumerate(tensors):
            tensor, unpacked = _on_the_wire(original)
            missing = longest[i] - tf.shape(tensor, out_type=tf.int32)[0]
            padded = tf.concat([tensor, tf.zeros(tf.concat(
                [[missing], tf.shape(tensor, out_type=tf.int32)[1:]], 0), tensor.dtype)], 0)
            joined = self._gather_equal(padded, f"{name}/{i}")
            keep = tf.reshape(tf.sequence_mask(sizes[:, i], longest[i]), [-1])
            gathered.append(_rows_like(unpacked(tf.boolean_mask(joined, keep)), original))
        return (gathered, sizes) if with_sizes else gathered

    def _gathered_slices(self, slices, name):
        """IndexedSlices of every rank's rows of each of `slices`, in rank order: each slice's
        values and int64 indices travel as one tensor (the indices' bits as value columns), so
        one slice costs one allgather beside the one of all sizes."""
        if not slices:
            return []
        packed = [_with_index_columns(s) for s in slices]
        joined = self._padded_gather([rows for rows, _ in packed], name)
        return [unpack(rows) for rows, (_, unpack) in zip(joined, packed)]

    def _fused_reduce(self, tensors, op, name, on_gpu):
        """`tensors` (one dtype) reduced by `op`, flattened into pieces of at most _PIECE_BYTES
        each reduced by one collective (Horovod's tensor fusion, written here for this
        runtime)."""
        flats = [tf.reshape(t, [-1]) for t in tensors]
        results = [[] for _ in tensors]
        for piece, (_, parts) in enumerate(_pieces([t.shape for t in tensors],
                                                   tensors[0].dtype.name)):
            buffer = tf.concat([flats[i][start:stop] for i, start, stop in parts], 0)
            if not buffer.shape.num_elements():  # nothing to add (and the runtime crashes)
                reduced = buffer
            else:
                reduced = self._reduce(buffer, op, f"{name}/{piece}", on_gpu)
            for (i, start, stop), value in zip(parts, tf.split(
                    reduced, [stop - start for _, start, stop in parts])):
                results[i].append(value)
        return [_shaped_as(tf.concat(parts, 0) if len(parts) > 1 else parts[0], t)
                for parts, t in zip(results, tensors)]


def _on_the_wire(tensor):
    """(`tensor` in a dtype every collective of the runtime takes, a function that turns such a
    tensor of other first dimension back). The runtime moves float16/32/64 and int32/64 only:
    bool travels as int32, narrower types (bfloat16, int16, uint8, ...) packed into int32
    (rows padded to whole int32s)."""
    if tensor.dtype in _WIRE_DTYPES:
        return tensor, lambda received: received
    if tensor.dtype == tf.bool:
        return tf.cast(tensor, tf.int32), lambda received: tf.cast(received, tf.bool)
    per_word = 4 // tensor.dtype.size
    trailing = tf.shape(tensor)[1:]
    width = tf.reduce_prod(trailing)
    rows = tf.reshape(tensor, [tf.shape(tensor)[0], width])
    words = (width + per_word - 1) // per_word
    rows = tf.pad(rows, [[0, 0], [0, words * per_word - width]])
    packed = tf.bitcast(tf.reshape(rows, [-1, words, per_word]), tf.int32)

    def unpacked(received):
        values = tf.reshape(tf.bitcast(received, tensor.dtype), [tf.shape(received)[0], -1])
        return tf.reshape(values[:, :width], tf.concat([[-1], trailing], 0))

    return packed, unpacked


def _check_port_free(port):
    """A UserError naming `port` when another process listens on it (TensorFlow's server would
    abort the process instead)."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC binds
    try:
        probe.bind(("", port))
    except OSError as error:
        raise UserError(f"TF_CONFIG gives this task port {port}, which another process holds "
                        f"({error.strerror}): give each task a free port") from None
    finally:
        probe.close()


def _broadcast_dtype(dtype):
    """The dtype `dtype` values are broadcast in, exactly: itself where the runtime takes it,
    else float32 (narrower floats) or int64 (narrower integers)."""
    if dtype in _WIRE_DTYPES or dtype == tf.bool:
        return dtype
    return tf.float32 if dtype.is_floating else tf.int64


def _with_index_columns(slices):
    """([n, width + extra columns] of the values' dtype: the values flattened per row, then the
    int64 indices' bits and, for a CountedSlices, its float32 counts' bits; the function that
    turns such rows back into IndexedSlices (or a CountedSlices with every rank's counts))."""
    values = tf.convert_to_tensor(slices.values)
    dtype = values.dtype if values.dtype in _WIRE_DTYPES and values.dtype.is_floating \
        else tf.float32
    index_columns, count_columns = max(1, 8 // dtype.size), max(1, 4 // dtype.size)
    counted = isinstance(slices, CountedSlices)
    trailing = tf.shape(values)[1:]
    parts = [tf.reshape(tf.cast(values, dtype), [tf.shape(values)[0], -1]),
             _bits_as(tf.cast(slices.indices, tf.int64), dtype, index_columns)]
    if counted:
        parts.append(_bits_as(tf.cast(slices.counts, tf.float32), dtype, count_columns))
    extra = index_columns + (count_columns if counted else 0)

    def unpacked(rows):
        width = tf.shape(rows)[1] - extra
        indices = _bits_from(rows[:, width:width + index_columns], index_columns, tf.int64)
        gathered = tf.reshape(tf.cast(rows[:, :width], values.dtype),
                              tf.concat([[-1], trailing], 0))
        gathered = _rows_like(gathered, values)
        if not counted:
            return tf.IndexedSlices(gathered, indices)
        counts = _bits_from(rows[:, width + index_columns:], count_columns, tf.float32)
        return CountedSlices(gathered, indices, None, counts)

    return tf.concat(parts, axis=1), unpacked


def _bits_as(tensor, dtype, columns):
    """[n, columns] of `dtype` holding the bits of the 1-D `tensor` (float64 rows hold a float32
    as its exact float64 value: they are wider than its bits)."""
    if dtype.size > tensor.dtype.size:
        return tf.cast(tensor, dtype)[:, None]
    return tf.reshape(tf.bitcast(tensor, dtype), [-1, columns])


def _bits_from(columns, count, dtype):
    """The 1-D `dtype` tensor whose bits (or, for one wider column, value) the `count` columns
    `columns` hold."""
    columns = tf.reshape(columns, [-1, count])
    if columns.dtype.size > dtype.size:
        return tf.cast(columns[:, 0], dtype)
    return tf.bitcast(columns if count > 1 else columns[:, 0], dtype)


def _with_zero_row(tensor):
    """`tensor` with one row of zeros after its last."""
    return tf.concat([tensor, tf.zeros(tf.concat([[1], tf.shape(tensor)[1:]], 0),
                                       tensor.dtype)], 0)


def _rows_like(rows, tensor):
    """`rows` with `tensor`'s static shape but its first dimension."""
    if tensor.shape.rank is not None:
        rows.set_shape([None] + tensor.shape.as_list()[1:])
    return rows


def _shaped_as(flat, tensor):
    """`flat` reshaped as `tensor`, keeping its static shape (later ops and graph rewrites see
    what they would see without the collective)."""
    shape = tensor.shape if tensor.shape.is_fully_defined() else tf.shape(tensor)
    reshaped = tf.reshape(flat, shape)
    reshaped.set_shape(tensor.shape)
    return reshaped


def _pieces(shapes, dtype):
    """How tensors of `shapes` (fully defined) and `dtype`, flattened in order, are cut into
    pieces of at most _PIECE_BYTES: a list of (elements, [(tensor index, start, stop)])."""
    limit = max(1, _PIECE_BYTES // tf.as_dtype(dtype).size)
    pieces, parts, filled = [], [], 0
    for i, shape in enumerate(shapes):
        size, start = int(np.prod(shape.as_list())), 0
        while start < size:
            stop = min(size, start + limit - filled)
            parts.append((i, start, stop))
            filled += stop - start
            start = stop
            if filled == limit:
                pieces.append((filled, parts))
                parts, filled = [], 0
        if size == 0:
            parts.append((i, 0, 0))
    if parts:
        pieces.append((filled, parts))
    return pieces

