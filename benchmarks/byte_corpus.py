"""The byte-level language-model corpus of the CAME benchmarks: the Python standard library's own
.py files (present offline wherever Python is), sorted by relative path, site-packages excluded;
every 10th file (index % 10 == 9) is validation."""

import pathlib
import platform
import sysconfig

import numpy as np


def stdlib_corpus():
    """(train bytes, validation bytes, description) of the standard library's .py files."""
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p.relative_to(root) for p in root.rglob("*.py")
                   if "site-packages" not in p.relative_to(root).parts)
    splits = {"train": [], "validation": []}
    for index, path in enumerate(files):
        splits["validation" if index % 10 == 9 else "train"].append((root / path).read_bytes())
    train, validation = (np.frombuffer(b"".join(splits[s]), np.uint8) for s in splits)
    description = (f"Python {platform.python_version()} standard library .py files under {root} "
                   f"(site-packages excluded): {len(files)} files, {train.size:,} train bytes, "
                   f"{validation.size:,} validation bytes (every 10th file)")
    return train, validation, description


def windows(data, starts, length):
    """int32 [len(starts), length + 1] windows of `data`: inputs [:, :-1], targets [:, 1:]."""
    return data[np.asarray(starts)[:, None] + np.arange(length + 1)].astype(np.int32)


def validation_windows(validation, count, length):
    """`count` evenly spaced, fixed windows of the validation bytes."""
    starts = np.linspace(0, validation.size - length - 1, count).astype(np.int64)
    return windows(validation, starts, length)
