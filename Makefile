# The two commands a fresh machine needs (README, "Quick start"): `make train` and `make test`.
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.tfscale-installed

.PHONY: setup train test bench

setup: $(STAMP)

$(STAMP): setup.py scripts/setup.sh scripts/install_horovod.sh
	bash scripts/setup.sh
	touch $@

train: $(STAMP)
	$(PY) -m launch.train $(ARGS)

test: $(STAMP)
	$(PY) -m pytest -q --durations=15 tests

bench: $(STAMP)
	$(PY) -m benchmarks.throughput
