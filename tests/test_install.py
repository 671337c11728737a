"""tfscale as a Keras user meets it: the wheel `pip` builds from the repository, installed into a
fresh directory, imported from outside the checkout, training a user's own functional Keras
model (plain keras.layers.Embedding tables, keras.Model) with tfscale's optimizers."""

import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

USER_SCRIPT = textwrap.dedent("""
    import sys

    import keras
    import numpy as np

    import tfscale
    from tfscale.optimizers import CAME, CowClip

    site = sys.argv[1]
    assert tfscale.__file__.startswith(site), f"tfscale imported from {tfscale.__file__}"
    try:
        import models  # noqa: F401
    except ImportError:
        pass
    else:
        raise AssertionError("the wheel must not install a top-level `models` package")

    def users_model():
        ids = keras.Input(shape=(3,), dtype="int32", name="ids")
        dense = keras.Input(shape=(2,), name="numbers")
        vectors = keras.layers.Embedding(1000, 8, name="item_embedding")(ids)
        x = keras.layers.Concatenate()([keras.layers.Flatten()(vectors), dense])
        x = keras.layers.Dense(16, activation="relu")(x)
        return keras.Model([ids, dense], keras.layers.Dense(1, activation="sigmoid")(x))

    rng = np.random.default_rng(0)
    ids = rng.integers(0, 1000, size=(2048, 3)).astype("int32")
    dense = rng.normal(size=(2048, 2)).astype("float32")
    labels = ((ids[:, 0] % 2) ^ (dense[:, 0] > 0)).astype("float32")[:, None]
    for name, optimizer in [
        ("CowClip", CowClip(embedding_optimizer=keras.optimizers.Adam(3e-2),
                            dense_optimizer=keras.optimizers.Adam(1e-2))),
        ("CAME", CAME(learning_rate=1e-3)),
    ]:
        keras.utils.set_random_seed(0)
        model = users_model()
        model.compile(optimizer=optimizer, loss="binary_crossentropy")
        table = model.get_layer("item_embedding").embeddings
        before = table.numpy().copy()
        history = model.fit([ids, dense], labels, batch_size=256, epochs=4, verbose=0)
        losses = history.history["loss"]
        assert np.isfinite(losses).all(), (name, losses)
        assert losses[-1] < losses[0], (name, losses)
        moved = np.abs(table.numpy() - before).sum(axis=1) > 0
        assert moved.any(), name
        print(f"{name}: loss {losses[0]:.4f} -> {losses[-1]:.4f}, {moved.sum()} rows moved")
""")


def test_wheel_installs_and_trains_a_users_own_model_from_outside_the_checkout(tmp_path):
    source, dist = tmp_path / "source", tmp_path / "dist"
    site, elsewhere = tmp_path / "site", tmp_path / "elsewhere"
    elsewhere.mkdir()
    # A clean copy: setuptools builds in the source tree and would package stale build/ files.
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "*.egg-info", "runs", "__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", "-w", str(dist), str(source)], check=True,
                   cwd=tmp_path)
    wheel = next(dist.glob("tfscale-*.whl"))
    packages = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()}
    assert packages == {"tfscale", wheel.name.split("-py")[0] + ".dist-info"}, packages
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target",
                    str(site), str(wheel)], check=True, cwd=tmp_path)
    script = elsewhere / "train_my_model.py"
    script.write_text(USER_SCRIPT)
    result = subprocess.run(
        [sys.executable, str(script), str(site)], cwd=elsewhere, capture_output=True, text=True,
        env={"PYTHONPATH": str(site), "TF_CPP_MIN_LOG_LEVEL": "2", "PATH": "/usr/bin:/bin"},
        timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "CowClip: loss" in result.stdout and "CAME: loss" in result.stdout, result.stdout
