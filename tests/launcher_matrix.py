"""Runs many `python -m launch.train` configurations in one process, for
tests/test_launcher_matrix.py: `python tests/launcher_matrix.py CASES.json` where the file maps a
case name to its command-line flags. Per case it resets the flags and Keras, runs
launch.train.run() as the command line would, and prints one line `MATRIX {json}` of what the
flags built: the optimizer (its rates, warm-up schedule, CowClip settings, loss scaling), the
model (tables, layers, dtype policy, initial weights), the exchange, the data split, and what
the run changed. A case that fails prints its error instead."""

import hashlib
import json
import sys
import traceback

import keras
import numpy as np
from tensorflow.python.framework import config as tf_config

import launch.train
from tests.multiworker import launcher_run
from tfscale.embedding.strategies import is_table
from tfscale.optimizers.cowclip import CowClip
from tfscale.training import run as training

def digest(arrays):
    """A short hash of the bytes of `arrays`."""
    sha = hashlib.sha1()
    for array in arrays:
        sha.update(np.ascontiguousarray(array).tobytes())
    return sha.hexdigest()[:16]


def rate(learning_rate):
    """A learning rate: a float, or a warm-up schedule's length, target and values per step."""
    if not isinstance(learning_rate, keras.optimizers.schedules.LearningRateSchedule):
        return float(keras.ops.convert_to_numpy(learning_rate))
    steps = int(learning_rate.decay_steps)
    return {"warmup_steps": steps, "target": float(learning_rate.end_learning_rate),
            "values": [float(learning_rate(step)) for step in range(steps + 2)]}


def optimizer_facts(optimizer, model):
    """What an optimizer is (recursively through loss scaling and the Multi/CowClip maps)."""
    facts = {"class": type(optimizer).__name__, "name": optimizer.name}
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        facts.update(loss_scale={"initial": float(optimizer.initial_scale),
                                 # Keras's own scaler (no `dynamic`) is always dynamic
                                 "dynamic": bool(getattr(optimizer, "dynamic", True)),
                                 "growth_steps": int(optimizer.dynamic_growth_steps),
                                 "final": float(optimizer.dynamic_scale.numpy())},
                     inner=optimizer_facts(optimizer.inner_optimizer, model))
    elif isinstance(optimizer, keras.optimizers.MultiOptimizer):
        choose = (optimizer._optimizer_for if isinstance(optimizer, CowClip)
                  else optimizer._optimizer_map)
        facts["by_variable"] = {_kind(v): choose(v).name for v in model.trainable_variables}
        facts["inner"] = {inner.name: optimizer_facts(inner, model)
                          for inner in optimizer._inner_optimizers}
        if isinstance(optimizer, CowClip):
            facts.update(r=optimizer.r, zeta=optimizer.zeta, l2=optimizer.l2, mode=optimizer.mode)
    else:
        facts["learning_rate"] = rate(optimizer._learning_rate)
        if hasattr(optimizer, "table_l2"):  # a row-sparse optimizer's L2 on the tables' rows
            facts["table_l2"] = optimizer.table_l2
    return facts


def _kind(variable):
    if is_table(variable):
        return "deep_table" if variable.shape[-1] > 1 else "wide_table"
    return "dense"


def model_facts(model):
    """The model's class, tables, layers, dtype policy and regularisation."""
    deep = model.field_embedding.deep_table.embeddings
    wide = model.field_embedding.wide_table
    facts = {"class": type(model).__name__, "deep_table": list(deep.shape),
             "table_dtype": deep.dtype,
             "deep_table_regularized": model.field_embedding.deep_table.embeddings_regularizer
             is not None,
             "wide_table_rows": None if wide is None else int(wide.embeddings.shape[0]),
             "vocabulary_sizes": list(model.schema.vocabulary_sizes),
             "num_dense": model.schema.num_dense,
             "policy": model.dtype_policy.name, "compute_dtype": model.compute_dtype,
             "variable_dtype": model.variable_dtype, "deduplicate": model.deduplicate_ids,
             "l2": {"embedding": model.l2_embedding, "wide": model.l2_wide,
                    "linear": model.l2_linear}}
    cross = getattr(model, "cross", None)
    if isinstance(cross, list):  # DCN-v2: one layer per cross layer
        facts["cross"] = [{"class": type(layer).__name__,
                           "experts": getattr(layer, "num_experts", 1)} for layer in cross]
    elif cross is not None:  # DCN: one layer holding a kernel per cross layer
        facts["cross"] = [{"class": type(cross).__name__, "kernel": list(k.shape)}
                          for k in cross.kernels]
    return facts


def exchange_facts(exchange, model):
    """The exchange's class; for top-k ones their density settings and, per kind of variable,
    the rows (elements for dense variables) left in the error-feedback residuals."""
    facts = {"class": type(exchange).__name__}
    if hasattr(exchange, "density_at"):
        kinds = {v.path: _kind(v) for v in model.trainable_variables}
        residual_rows = {}
        for path, residual in exchange.residuals.items():
            values = np.abs(residual.numpy()).reshape(residual.shape[0], -1).sum(axis=1)
            kind = kinds[path]
            residual_rows[kind] = residual_rows.get(kind, 0) + int(np.count_nonzero(values))
        facts.update(
            density=exchange.density, warmup_density=exchange.warmup_density,
            warmup_steps=exchange.warmup_steps, dense_gradients=exchange.dense_gradients,
            density_at={step: float(exchange.density_at(step))
                        for step in (0, exchange.warmup_steps)},
            residual_rows=residual_rows)
    return facts


def source_facts(source):
    """The split sizes and the first training rows of epoch 0 (their order shows shuffling)."""
    train_rows = source.train_steps_per_epoch(1)
    test_rows = sum(int(labels.shape[0]) for _, labels in source.test_batches(4096))
    features, labels = next(iter(source.train_batches(train_rows)))
    dense = features["dense"].numpy()
    return {"class": type(source).__name__, "train_rows": train_rows, "test_rows": test_rows,
            "first_labels": labels.numpy()[:16, 0].astype(int).tolist(),
            "first_dense": dense[:2].round(6).tolist(),
            "epoch_digest": digest(np.sort(features["categorical"].numpy(), axis=0)),
            "dense_range": [float(dense.min()), float(dense.max())] if dense.size else None}


def run_case(argv):
    """Runs launch.train with `argv` and returns the facts of what it built and did."""
    captured = {}
    real_train = training.train

    def recording_train(model, source, config, print_fn=print):
        deep = model.field_embedding.deep_table.embeddings.numpy()
        captured.update(initial=digest(w.numpy() for w in model.weights),
                        initial_table_std=float(deep.std()),
                        initial_table_head=deep[2, :3].round(6).tolist())
        result = real_train(model, source, config, print_fn)
        captured.update(model=model, source=source, result=result)
        return result

    launcher_run.start(["--logdir=none", "--checkpoint_dir=none", *argv])
    training.train = recording_train
    try:
        launch.train.run()
    finally:
        training.train = real_train
    model, result = captured["model"], captured["result"]
    scalars = model.summary_scalars()
    return {
        "model": model_facts(model), "optimizer": optimizer_facts(model.optimizer, model),
        "exchange": exchange_facts(model.embedding_exchange, model),
        "source": source_facts(captured["source"]),
        "initial": captured["initial"], "initial_table_std": captured["initial_table_std"],
        "initial_table_head": captured["initial_table_head"],
        "final": digest(w.numpy() for w in model.weights),
        "global_step": result.global_step, "test_auc": result.final["auc"],
        "unique_id_rate": scalars.get("embedding/unique_id_rate"),
        "op_determinism": bool(tf_config.is_op_determinism_enabled()),
    }


def main(cases_path):
    with open(cases_path) as f:
        cases = json.load(f)
    for name, argv in cases.items():
        try:
            facts = run_case(argv)
        except BaseException as error:  # a bad flag ends in SystemExit; report it, go on
            facts = {"error": f"{type(error).__name__}: {error}",
                     "traceback": traceback.format_exc()}
        print("MATRIX " + json.dumps({"case": name, **facts}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
