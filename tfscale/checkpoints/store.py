"""Atomic training checkpoints: model weights, optimizer state and the training position.

Each checkpoint is a directory `step-<global step>/` holding the embedding tables and their
optimizer state in their strategy's format (TableStrategy.checkpoint_format: by global row,
`tables-<i>-of-<n>.npz`, tfscale.embedding.by_row_checkpoint; by id,
tfscale.embedding.by_id_checkpoint; each rank writes the rows it holds, so tables spread over the
ranks are never gathered and resume at any number of ranks), a `tf.train.Checkpoint` of
every other model and optimizer variable (in the model's and the
optimizer's order) and `progress.json` (epoch, batches done in that epoch, global step, ...). It is
written under a temporary name and renamed into place, and the `latest` file is replaced atomically
afterwards, so a crash at any moment leaves the previous checkpoint intact and `latest` always names
a complete one.

State that differs between Horovod ranks (`per_rank_variables`, e.g. the top-k exchanges'
residuals, the stale embedding updates' queues) is gathered from every rank into `per_rank.npz`
(one array `<name>@rank<r>` per variable and rank) when saving and handed back to each rank after
a restore; with it, every rank calls `save` and `finish_restore`, and only
rank 0 writes.
"""

import json
import os
import shutil
import tempfile

import numpy as np
import tensorflow as tf

from tfscale.distributed import broadcast, per_rank, runtime
from tfscale.embedding import strategies
from tfscale.errors import UserError
from tfscale.optimizers.table_state import OptimizerTableState

_LATEST_FILE = "latest"
_PROGRESS_FILE = "progress.json"
_PER_RANK_FILE = "per_rank.npz"
_STATE_PREFIX = "state"
_STEP_DIR = "step-{:010d}"
_PER_RANK_KEY = "{}@rank{}"


class CheckpointStore:
    """Saves and restores `model`, its `optimizer` and each rank's `per_rank_variables`
    ({name: tf.Variable}) in `directory`, keeping the newest `keep` checkpoints. Under Horovod
    every rank calls `save` (each writes its rows of the tables and hands rank 0 its per-rank
    state); rank 0 alone calls `restore_latest`, then every rank `finish_restore`."""

    def __init__(self, directory, model, optimizer=None, keep=2, per_rank_variables=None):
        if keep < 1:
            raise ValueError("keep must be at least 1")
        self.directory = directory
        self.keep = keep
        self._model = model
        self._optimizer = optimizer
        self._per_rank_variables = dict(per_rank_variables or {})
        self._restored_per_rank = None

    def _table_parts(self):
        """[(TableCheckpoint, its parts)] of the model's tables: every registered format, with
        empty parts where the model has no tables of it."""
        by_format = {fmt: [] for fmt in strategies.checkpoint_formats()}
        for variable in self._model.variables:
            fmt = strategies.checkpoint_format_of(variable)
            if fmt is not None:
                by_format.setdefault(fmt, []).append(variable)
        state = OptimizerTableState(self._optimizer)
        return [(fmt, fmt.parts(variables, state)) for fmt, variables in by_format.items()]

    def _other_state(self):
        """A tf.train.Checkpoint of every model and optimizer variable that is not table state,
        in order."""
        table_ids = {id(v) for fmt, parts in self._table_parts() for v in fmt.variables(parts)}
        variables = list(self._model.variables)
        if self._optimizer is not None:
            variables += list(self._optimizer.variables)
        return tf.train.Checkpoint(variables=[v.value for v in variables
                                              if id(v) not in table_ids])

    def save(self, global_step, progress):
        """Writes a checkpoint for `global_step` with the JSON-serialisable `progress` dict and
        returns its directory (None on ranks other than 0, which only contribute their rows of
        the tables and their per-rank state)."""
        per_rank_arrays = per_rank.gather_to_chief(self._per_rank_variables) \
            if self._per_rank_variables else None
        staging_dir = broadcast.broadcast_from_chief(self._new_staging_dir,
                                                     name="tfscale_checkpoint_staging")
        for fmt, parts in self._table_parts():
            fmt.save(parts, staging_dir)
        broadcast.barrier("tfscale_checkpoint_tables_written")
        if not runtime.is_chief():
            return None
        final_dir = os.path.join(self.directory, _STEP_DIR.format(global_step))
        try:
            self._other_state().write(os.path.join(staging_dir, _STATE_PREFIX))
            if per_rank_arrays is not None:
                np.savez(os.path.join(staging_dir, _PER_RANK_FILE),
                         **{_PER_RANK_KEY.format(name, rank): array
                            for name, arrays in per_rank_arrays.items()
                            for rank, array in enumerate(arrays)})
            _write_file_durably(
                os.path.join(staging_dir, _PROGRESS_FILE),
                json.dumps(dict(progress, global_step=int(global_step)), indent=1, sort_keys=True),
            )
            if os.path.exists(final_dir):  # a re-save of the same step (after a resume)
                shutil.rmtree(final_dir)
            os.rename(staging_dir, final_dir)
        except BaseException:
            shutil.rmtree(staging_dir, ignore_errors=True)
            raise
        _replace_file_atomically(os.path.join(self.directory, _LATEST_FILE), os.path.basename(final_dir))
        self._delete_old(keep_name=os.path.basename(final_dir))
        return final_dir

    def _new_staging_dir(self):
        os.makedirs(self.directory, exist_ok=True)
        return tempfile.mkdtemp(prefix=".staging-", dir=self.directory)

    def latest_progress(self):
        """The progress dict of the newest complete checkpoint, or None if there is none."""
        checkpoint_dir = self._latest_dir()
        if checkpoint_dir is None:
            return None
        path = os.path.join(checkpoint_dir, _PROGRESS_FILE)
        try:
            with open(path) as f:
                return json.load(f)
        except (OSError, ValueError) as error:
            raise UserError(f"checkpoint {path} cannot be read ({error}); remove it or give "
                            "another `checkpoint_dir`") from error

    def restore_latest(self):
        """Restores the model and optimizer from the newest checkpoint and returns its progress
        dict, or returns None (restoring nothing) when the directory holds no checkpoint. Both
        must already be built (model called once, optimizer built) so every value has a home."""
        progress = self.latest_progress()
        if progress is not None:
            self._restore(self._latest_dir(), weights_only=False)
            self._restored_per_rank = self._read_per_rank(self._latest_dir())
        return progress

    def restore_latest_weights_only(self):
        """Restores the model (a store made without an optimizer) from the newest checkpoint,
        leaving its optimizer and per-rank state unread: for prediction and export, in one
        process, whatever number of ranks wrote it (the tables are assembled from every rank's
        rows). Returns its progress dict, or None when there is no checkpoint."""
        progress = self.latest_progress()
        if progress is not None:
            self._restore(self._latest_dir(), weights_only=True)
        return progress

    def _restore(self, checkpoint_dir, weights_only):
        """Reads the tables and the other state of `checkpoint_dir`: all of it, or with
        `weights_only` the model's alone (its variables come first in the checkpoint, the
        optimizer's after them)."""
        prefix = os.path.join(checkpoint_dir, _STATE_PREFIX)
        table_parts = self._table_parts()
        for fmt, parts in table_parts:
            fmt.check_matches(parts, checkpoint_dir)
        try:
            status = self._other_state().read(prefix)
            if weights_only:
                status.expect_partial().assert_existing_objects_matched()
            else:
                status.assert_consumed()
        except (tf.errors.OpError, AssertionError, ValueError) as error:
            raise UserError(
                f"checkpoint {prefix} does not match this model"
                f"{'' if weights_only else ' and optimizer'} ({_first_line(error)}); use the "
                "model, data schema and optimizer it was written with") from error
        for fmt, parts in table_parts:
            fmt.restore(parts, checkpoint_dir)

    def finish_restore(self):
        """After rank 0's `restore_latest`, on every rank: the other ranks read their own rows
        of tables spread over the ranks (replicated ones come with rank 0's broadcast), and
        every rank gets its slice of the per-rank state rank 0 restored."""
        if not runtime.is_chief():
            for fmt, parts in self._table_parts():
                fmt.restore_rank_local(parts, self._latest_dir())
        if self._per_rank_variables:
            per_rank.scatter_from_chief(self._per_rank_variables, self._restored_per_rank)

    def _read_per_rank(self, checkpoint_dir):
        path = os.path.join(checkpoint_dir, _PER_RANK_FILE)
        if not self._per_rank_variables and not os.path.exists(path):
            return None
        try:
            arrays = {}
            with np.load(path) as stored:
                for key in sorted(stored.files, key=_rank_order):
                    name = key.rsplit("@rank", 1)[0]
                    arrays.setdefault(name, []).append(stored[key])
        except (OSError, ValueError) as error:
            raise UserError(f"checkpoint {path} cannot be read ({error}): it was written without "
                            "the per-rank state this run needs (e.g. another `embedding_exchange`); "
                            "resume with the settings it was written with") from error
        if set(arrays) != set(self._per_rank_variables):
            raise UserError(f"checkpoint {path} holds {sorted(arrays)}, this run needs "
                            f"{sorted(self._per_rank_variables)}: resume with the flags it was "
                            "written with")
        for name, per_rank_arrays in arrays.items():
            if len(per_rank_arrays) != runtime.size():
                raise UserError(f"checkpoint {path} holds {name} of {len(per_rank_arrays)} ranks; "
                                f"this job has {runtime.size()}: resume with as many ranks")
        return arrays

    def _latest_dir(self):
        latest_file = os.path.join(self.directory, _LATEST_FILE)
        if not os.path.exists(latest_file):
            return None
        with open(latest_file) as f:
            name = f.read().strip()
        checkpoint_dir = os.path.join(self.directory, name)
        if not name or not os.path.isdir(checkpoint_dir):
            raise UserError(f"{latest_file} names checkpoint {name!r}, which does not exist in "
                            f"{self.directory}")
        return checkpoint_dir

    def _delete_old(self, keep_name):
        step_dirs = sorted(d for d in os.listdir(self.directory) if d.startswith("step-"))
        for name in step_dirs[:-self.keep]:
            if name != keep_name:
                shutil.rmtree(os.path.join(self.directory, name), ignore_errors=True)


def restore_trained_weights(model, checkpoint_dir):
    """Restores into the built `model` the weights of the newest checkpoint in `checkpoint_dir`
    (tfscale.training.train's, or tfscale.callbacks.Checkpoint's), without its optimizer, for
    prediction and export; returns the checkpoint's progress dict, or None when there is none."""
    return CheckpointStore(checkpoint_dir, model=model).restore_latest_weights_only()


def _write_file_durably(path, text):
    with open(path, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def _replace_file_atomically(path, text):
    directory = os.path.dirname(path)
    fd, staging_path = tempfile.mkstemp(prefix=".staging-", dir=directory)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(staging_path, path)
    except BaseException:
        if os.path.exists(staging_path):
            os.remove(staging_path)
        raise


def _rank_order(key):
    """Sort key of a per_rank.npz entry "<name>@rank<r>": by name, then by rank as a number."""
    name, _, rank = key.rpartition("@rank")
    if not name or not rank.isdigit():
        raise ValueError(f"entry {key!r} is not <name>@rank<r>")
    return name, int(rank)


def _first_line(error):
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
