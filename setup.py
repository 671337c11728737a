"""Packaging for tfscale. Only the library (`tfscale`) is installed; the reference models
(`models/`) and the entry points (`launch/`) are found from the repository root, so a generic
top-level `models` package never lands in site-packages (see docs/architecture.md)."""

from setuptools import Extension, find_packages, setup

setup(
    name="tfscale",
    version="0.1.0",
    description="Fast large-batch and multi-worker training for CTR and large-embedding Keras models",
    python_requires=">=3.10,<3.13",
    packages=find_packages(include=["tfscale", "tfscale.*"]),
    # The readers' C kernels (FarmHash fingerprints, the vocabulary's key table), which run
    # without the GIL in the reader threads: plain C against Python's API only, so any C compiler
    # builds them and they do not depend on TensorFlow's version (docs/architecture.md).
    ext_modules=[Extension("tfscale.data._kernels", ["tfscale/data/_kernels.c"],
                           extra_compile_args=["-O3", "-std=c99"])],
    # `tfscale-run -np N train.py`: `python -m tfscale.run`, the one-host launcher.
    entry_points={"console_scripts": ["tfscale-run=tfscale.run:main"]},
    install_requires=[
        "tensorflow==2.21.0",
        "keras>=3.15,<3.16",
        "keras-rs==0.4.0",
        "absl-py>=2.0,<3",
        "tensorboard==2.21.0",
        "numpy>=1.26",
        # Parquet input (tfscale.data.parquet) and the vocabulary pass, which parses and counts
        # with it and writes Parquet vocabulary files.
        "pyarrow>=16",
        # bfloat16 arrays in NumPy (half-precision tables' checkpoints); TensorFlow's own
        # dependency.
        "ml_dtypes",
    ],
    extras_require={
        # torch 2.13.0 is the CPU build the machine image carries; came-pytorch is CAME's
        # reference implementation, used only by tests/test_came_parity.py; pytest-xdist runs
        # the suite in two workers (`make test`; 3.8 keeps the test files' order when asked);
        # MkDocs, its Material theme and mkdocstrings build the documentation site, which
        # tests/test_docs.py builds with warnings as errors (`make docs`); pandas writes Parquet
        # files as its users do (tests/test_parquet.py).
        "test": ["pytest>=8", "pytest-xdist>=3.8", "scikit-learn>=1.4", "torch==2.13.0",
                 "pandas>=2.2", "came-pytorch==0.1.3", "mkdocs==1.6.1", "mkdocs-material==9.8.1",
                 "mkdocstrings[python]==1.0.8", "mkdocstrings-python==2.0.11"],
        "bench": ["matplotlib>=3.8"],
    },
)
