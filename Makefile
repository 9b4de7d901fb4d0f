# fedrec: `make demo` sets up and runs the main job; `make test` sets up and runs the tests.
# PyTorch: a CPU build by default. GPU users: make setup TORCH_INDEX=https://download.pytorch.org/whl/cu126
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
BIN := $(VENV)/bin

.PHONY: setup demo test docs lint bench wheel wheel-check clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --timeout 10 --retries 1 --extra-index-url $(TORCH_INDEX) "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -e ".[dev]"
	touch $@

demo: setup
	$(BIN)/fedrec data stats ml-100k
	$(BIN)/fedrec run mf --dataset ml-100k --protocol loo-sampled --seed 0

# one worker a core, each test file on one worker (its module fixtures built once, its tests
# in order), the files in the order tests/conftest.py gives (the longest first); each worker
# runs PyTorch on one thread
test: setup
	$(BIN)/python -m pytest -n auto --dist loadfile --no-loadscope-reorder

# the documentation site, into site/ (a broken link or reference fails it)
docs: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

lint: setup
	$(BIN)/ruff check fedrec tests benchmarks

# dist/: the sdist and the wheel, built with the venv's setuptools (nothing downloaded)
wheel: setup
	$(BIN)/python -m build --no-isolation --outdir dist

# the wheel built from a clean copy, installed in a fresh venv and run (tests/test_wheel.py)
wheel-check: setup
	$(BIN)/python -m pytest tests/test_wheel.py

clean:
	rm -rf $(VENV) runs .pytest_cache site build dist fedrec.egg-info
