"""The library's shape, checked statically: no import cycles between tfscale's modules, Horovod
imported by the Horovod engine alone, each
package importing only the layers below it (serving below training: it imports nothing of
tfscale.training), no imports of the repository-level `models` and
`launch`, private Keras imports only where Keras has
no public form, and errors raised by the library that speak in its arguments, never in the
launcher's flags."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "tfscale"


def _modules():
    """{dotted module name: parsed tree} of every tfscale module (a package as its __init__)."""
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        modules[name.removesuffix(".__init__")] = ast.parse(path.read_text(), str(path))
    return modules


def _imported(tree, modules=()):
    """The modules the import statements of `tree` name: `from a import b` names a.b when that is
    one of `modules`, else a (a package's own __init__ importing its submodules is not counted
    as an edge from each submodule back to the package)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                names.add(full if full in modules else node.module)
    return names


def test_no_import_cycles():
    modules = _modules()
    graph = {name: {m for m in _imported(tree, modules) if m in modules and m != name}
             for name, tree in modules.items()}

    def reaches(start, goal, seen):
        for following in graph[start]:
            if following == goal:
                return True
            if following not in seen:
                seen.add(following)
                if reaches(following, goal, seen):
                    return True
        return False

    cyclic = sorted(name for name in graph if reaches(name, name, set()))
    assert not cyclic, f"modules on an import cycle: {cyclic}"


# Bottom to top: a module may import its own layer and those below. "core" is the top-level
# modules (errors, row gradients, step scalars, metrics), which every layer shares. Checkpoints
# lie below both of their users: training writes and resumes them, serving reads their weights.
LAYERS = ("core", "distributed", "data", "embedding", "optimizers", "exchanges", "checkpoints",
          "serving", "training")


def _layer(module):
    """The layer of `module` (a dotted tfscale name): its package, or "core" at the top level."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (PACKAGE / parts[1]).is_dir() else "core"


def test_packages_import_only_the_layers_below_them():
    modules = _modules()
    assert {_layer(name) for name in modules if name != "tfscale"} == set(LAYERS)
    upward = []
    for name, tree in modules.items():
        if name == "tfscale":  # the public surface gathers every layer
            continue
        rank = LAYERS.index(_layer(name))
        upward += [f"{name} imports {m}" for m in _imported(tree, modules)
                   if m in modules and m != "tfscale" and LAYERS.index(_layer(m)) > rank]
    assert not upward, upward


def test_serving_imports_nothing_of_training():
    """A SavedModel is written and read without the training run's modules: what serving needs
    of a run (its checkpoints) lies below both."""
    modules = _modules()
    serving = {name: sorted(m for m in _imported(tree, modules)
                            if m == "tfscale.training" or m.startswith("tfscale.training."))
               for name, tree in modules.items() if name.startswith("tfscale.serving")}
    assert serving and not any(serving.values()), serving


def test_the_library_imports_neither_models_nor_launch_and_keras_src_only_once():
    private = {}
    for name, tree in _modules().items():
        imported = _imported(tree)
        assert not {m for m in imported if m.split(".")[0] in ("models", "launch")}, name
        private.update({m: name for m in imported if m.startswith("keras.src")})
    # Keras has no public form of the test telling Model(inputs, outputs) from a subclass.
    assert set(private) == {"keras.src.models.model"}, private


def test_library_errors_name_arguments_not_flags():
    flag = re.compile(r"(^|[\s(])--[a-z_]+")
    for name, tree in _modules().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Raise):
                for text in (c.value for c in ast.walk(node)
                             if isinstance(c, ast.Constant) and isinstance(c.value, str)):
                    assert not flag.search(text), f"{name}: {text!r}"


def test_a_library_refusal_is_a_value_error():
    """`tfscale.UserError` is a ValueError: a user catching bad values catches ours too."""
    import pytest

    from tfscale import FieldEmbedding, UserError

    with pytest.raises(ValueError, match="`deduplicate=False` cannot be used with `sharding=row`"):
        FieldEmbedding([4, 5], sharding="row", deduplicate=False)
    assert issubclass(UserError, ValueError)


def test_only_the_engine_seam_imports_horovod():
    """Every collective goes through tfscale.distributed's Engine: no module of the library,
    the launcher, the models or the examples outside tfscale/distributed/ imports Horovod (the
    Horovod engine alone does)."""
    trees = dict(_modules())
    for folder in ("launch", "models", "examples"):
        for path in (ROOT / folder).rglob("*.py"):
            trees[str(path.relative_to(ROOT))] = ast.parse(path.read_text(), str(path))
    importers = sorted(name for name, tree in trees.items()
                       if any(imported.split(".")[0] == "horovod" for imported in _imported(tree)))
    assert importers == ["tfscale.distributed.horovod_engine"], importers
