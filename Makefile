# The two commands a fresh machine needs (README, "Quick start"): `make train` and `make test`.
# GPU=1 (`make setup GPU=1`, `make train GPU=1`, ...) uses the GPU variant instead: .venv-gpu with
# tensorflow[and-cuda] and Horovod built with NCCL (docs/gpu.md).
ifeq ($(GPU),1)
VENV := .venv-gpu
SETUP_FILES := setup.py tfscale/data/_kernels.c scripts/setup_gpu.sh scripts/install_horovod_gpu.sh \
	scripts/horovod_gpu_source.sh scripts/gpu-constraints.txt
SETUP_SCRIPT := scripts/setup_gpu.sh
else
VENV := .venv
SETUP_FILES := setup.py tfscale/data/_kernels.c scripts/setup.sh scripts/install_horovod.sh
SETUP_SCRIPT := scripts/setup.sh
endif
PY := $(VENV)/bin/python
STAMP := $(VENV)/.tfscale-installed
# The main job: the launcher's defaults for the built-in data (DeepFM, Adam with sqrt scaling
# from the tuned synthetic preset, tables updated by row with absent rows caught up) at the batch
# and epochs that kept the tuned batch-1024 AUC in the least time in benchmarks.cowclip_tuned
# (docs/results/cowclip_tuned.md). `--embedding_update=dense` gives the update that base was tuned
# with (docs/row_updates.md, "AUC"). ARGS follow and win.
MAIN_JOB := --batch_size=32768 --epochs=5

.PHONY: setup train test bench docs

setup: $(STAMP)

$(STAMP): $(SETUP_FILES)
	bash $(SETUP_SCRIPT)
	touch $@

train: $(STAMP)
	$(PY) -m launch.train $(MAIN_JOB) $(ARGS)

test: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder --durations=15 tests

bench: $(STAMP)
	$(PY) -m benchmarks.throughput

# The documentation site (mkdocs.yml) into site/; warnings are errors, as in tests/test_docs.py.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict
