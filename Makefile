# Two entry points on a fresh machine: `make demo` (the main job) and `make test` (the test suite's fast tier; CI runs
# it, then `make test-slow`: the tests that start processes or run for long, benchmarks/SUITE_TIME.md).
# Both create or reuse the virtual environment below and install what they need.
VENV ?= .venv
PYTHON ?= python3
# The torch the suite runs with: 2.13.0 from the configured index. On plain PyPI that is the CUDA build on Linux
# x86-64 (with ~15 nvidia-* packages, 4.6 GB installed instead of 3.4 GB); PyTorch's CPU wheels come from its own
# index: make TORCH_PIP_OPTIONS='--index-url https://download.pytorch.org/whl/cpu'. TORCH_SPEC picks another version.
TORCH_SPEC ?= torch==2.13.0
TORCH_PIP_OPTIONS ?=
BIN := $(VENV)/bin

.PHONY: demo test test-slow bench install

# Flower 1.31 and later (the flower extra asks 1.41-1.42) need Python 3.11: stop before pip spends a minute
# finding no Flower for an older interpreter. %-formatting, so even an old Python prints the line.
$(BIN)/activate:
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11) and "make: $(PYTHON) is Python %s; kfca-llm needs Python >= 3.11 (Flower does): make PYTHON=python3.11 ..." % sys.version.split()[0])'
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: pyproject.toml | $(BIN)/activate
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet $(TORCH_PIP_OPTIONS) "$(TORCH_SPEC)"
	$(BIN)/python -m pip install --quiet -e '.[test,flower]'
	touch $@

install: $(VENV)/.installed

demo: $(VENV)/.installed
	$(BIN)/kfca-llm simulate

test: $(VENV)/.installed
	$(BIN)/python -m pytest -q -n 2 -m "not slow"

test-slow: $(VENV)/.installed
	$(BIN)/python -m pytest -q -n 2 -m slow

bench: $(VENV)/.installed
	$(BIN)/python benchmarks/bench_cpu_engine.py
