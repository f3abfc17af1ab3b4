# The two commands:  `make run` (the whole pipeline)  and  `make test` (the test suite).
# Both create the virtual environment on first use.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
CORES  ?= all
# Extra Snakemake arguments, e.g.  make run ARGS="--resources gpu=2"  or  ARGS="probe"
ARGS   ?=

.PHONY: run test check dry-run venv wheelhouse install-offline clean help

help:
	@echo "make run        run the whole pipeline (CPU virtual devices when no GPU is present)"
	@echo "make test       run the test suite (everything; what CI runs)"
	@echo "make check      the quick tier for the edit-run loop (under a minute): lint, then the unit tests"
	@echo "make dry-run    show which jobs would run"
	@echo "make wheelhouse build an offline wheel folder for an air-gapped GPU node (PYVER=3.12)"
	@echo "make clean      remove results/ and Snakemake's state"

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $@

venv: $(BIN)/.installed

run: venv
	$(BIN)/snakemake --cores $(CORES) $(ARGS)

dry-run: venv
	$(BIN)/snakemake --cores $(CORES) --dry-run $(ARGS)

# Both tiers run on pytest-xdist workers, one per core up to 4 (WORKERS=0: one process). A test
# module stays on one worker, its whole-pipeline fixture runs once (tests/conftest.py says how).
WORKERS ?= auto
XDIST    = -n $(WORKERS) --maxprocesses 4 --dist loadfile --no-loadscope-reorder

test: venv
	$(BIN)/python -m pytest $(XDIST) $(ARGS)

# The quick tier: lint (every Python file compiles), then every test marked neither e2e (starts
# Snakemake or a real cluster) nor slow (real measurements, worker processes: seconds each).
# `make test` runs both tiers.
check: venv
	$(BIN)/python -m compileall -q src scripts tests
	$(BIN)/python -m pytest -m "not e2e and not slow" -q $(XDIST) $(ARGS)

PYVER    ?= 3.12
PLATFORM ?= manylinux_2_28_x86_64
wheelhouse: venv
	$(BIN)/python -m gpulab.wheelhouse build --python-version $(PYVER) --platform $(PLATFORM) --dest wheelhouse

install-offline:
	PYTHONPATH=src $(PYTHON) -m gpulab.wheelhouse install --src wheelhouse

clean:
	rm -rf results/*/ .snakemake
