"""Stands in for an environment where Horovod was never installed: every launch of the test
suite on TensorFlow's engine puts this folder first on its path (tests/horovod_launch.py), so
those jobs prove that the engine, the launcher and the library run without Horovod."""

raise ModuleNotFoundError("No module named 'horovod' (tests/without_horovod)", name="horovod")
