"""tfscale as a Keras user meets it: the wheel `pip` builds from the repository, installed with
its dependencies resolved into a fresh virtual environment, every module of the package imported
there from outside the checkout, and a user's own functional Keras model (plain
keras.layers.Embedding tables, keras.Model) trained with tfscale's optimizers.

The environment has no network: its dependencies are the already-installed distributions that
the wheel's requirements reach (their closure, read from each one's metadata), linked into one
directory on its path; nothing else of this interpreter's environment (test tools, Horovod, the
editable checkout) is visible there. `pip install` (without --no-deps, --no-index) resolves the
wheel's requirements against them and `pip check` checks every installed requirement."""

import email
import importlib.metadata
import json
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]

USER_SCRIPT = textwrap.dedent("""
    import importlib
    import importlib.metadata
    import json
    import pkgutil
    import sys

    import keras
    import numpy as np

    import tfscale
    from tfscale.optimizers import CAME, CowClip

    site, expected_modules = sys.argv[1], set(json.loads(sys.argv[2]))
    assert tfscale.__file__.startswith(site), f"tfscale imported from {tfscale.__file__}"
    installed = {module.name for module in pkgutil.walk_packages(
        tfscale.__path__, "tfscale.", onerror=lambda name: importlib.import_module(name))}
    installed.add("tfscale")
    assert installed == expected_modules, (
        f"missing from the install: {sorted(expected_modules - installed)}, "
        f"not in the checkout: {sorted(installed - expected_modules)}")
    for name in sorted(expected_modules):
        module = importlib.import_module(name)
        assert module.__file__.startswith(site), module.__file__
    print(f"imported {len(expected_modules)} modules")
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


def _checkout_modules():
    """Every module of the checkout's tfscale package (its Python files and the C files of its
    extension modules), by dotted name."""
    names = set()
    for path in [*(ROOT / "tfscale").rglob("*.py"), *(ROOT / "tfscale").rglob("*.c")]:
        parts = path.relative_to(ROOT).with_suffix("").parts
        names.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def _requirements_of(wheel):
    """The Requires-Dist lines of `wheel`'s metadata."""
    with zipfile.ZipFile(wheel) as archive:
        metadata, = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        return email.message_from_bytes(archive.read(metadata)).get_all("Requires-Dist") or []


def _link_installed_closure(requirements, into):
    """Links into directory `into` the files of every distribution installed here that
    `requirements` (Requires-Dist strings) reach, following each one's own requirements (with
    the extras asked for); returns their names. A requirement not installed here is left for pip
    to report."""
    into.mkdir()
    pending = [(Requirement(text), "") for text in requirements]
    done, names = set(), set()
    while pending:
        requirement, extra = pending.pop()
        if requirement.marker and not requirement.marker.evaluate({"extra": extra}):
            continue
        name = canonicalize_name(requirement.name)
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        for wanted in ("", *requirement.extras):
            if (name, wanted) not in done:
                done.add((name, wanted))
                pending += [(Requirement(text), wanted) for text in dist.requires or []]
        if name in names:
            continue
        names.add(name)
        for top in {Path(str(f)).parts[0] for f in dist.files or []}:
            if top not in ("..", "__pycache__") and not (into / top).exists():
                (into / top).symlink_to(dist.locate_file(top))
    return names


def test_wheel_installs_with_its_dependencies_and_trains_a_users_model_from_outside(tmp_path):
    source, dist = tmp_path / "source", tmp_path / "dist"
    venv, elsewhere = tmp_path / "venv", tmp_path / "elsewhere"
    elsewhere.mkdir()
    # A clean copy: setuptools builds in the source tree and would package stale build/ files.
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "*.egg-info", "runs", "__pycache__", "*.so"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", "-w", str(dist), str(source)], check=True,
                   cwd=tmp_path)
    wheel = next(dist.glob("tfscale-*.whl"))
    packages = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()}
    name_and_version = "-".join(wheel.name.split("-")[:2])  # the readers' kernels: a platform tag
    assert packages == {"tfscale", name_and_version + ".dist-info"}, packages

    # A fresh environment of this interpreter whose only other distributions are the wheel's
    # dependencies (not tfscale's editable install, the test tools or Horovod).
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = Path(subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        check=True, capture_output=True, text=True).stdout.strip())
    requirements = _requirements_of(wheel)
    dependencies = _link_installed_closure(requirements, tmp_path / "dependencies")
    declared = {canonicalize_name(Requirement(text).name) for text in requirements
                if "extra ==" not in text}
    assert declared and declared <= dependencies, declared - dependencies
    (site / "installed_dependencies.pth").write_text(f"{tmp_path / 'dependencies'}\n")
    pip = [sys.executable, "-m", "pip", "--python", str(python)]
    installed = subprocess.run([*pip, "install", "--no-index", "--find-links", str(dist),
                                str(wheel)], cwd=tmp_path, capture_output=True, text=True)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    checked = subprocess.run([*pip, "check"], cwd=tmp_path, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr

    script = elsewhere / "train_my_model.py"
    script.write_text(USER_SCRIPT)
    result = subprocess.run(
        [python, str(script), str(site), json.dumps(sorted(_checkout_modules()))],
        cwd=elsewhere, capture_output=True, text=True,
        env={"TF_CPP_MIN_LOG_LEVEL": "2", "PATH": "/usr/bin:/bin"}, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"imported {len(_checkout_modules())} modules" in result.stdout, result.stdout
    assert "CowClip: loss" in result.stdout and "CAME: loss" in result.stdout, result.stdout
