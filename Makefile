# The two commands: `make report` (main job) and `make test` (every test).
# Both set up everything they need on a machine with only python3 and make.
SHELL := /bin/bash
PYTHON ?= python3
UV_VERSION := 0.13.9
UV := .tools/bin/uv
VENV := .venv
BIN := $(VENV)/bin
EXPERIMENT ?= data/experiments/seed_case.yaml
NAME ?= seed_case

export UV_PYTHON_DOWNLOADS := never
export UV_PYTHON := $(PYTHON)
export UV_PROJECT_ENVIRONMENT := $(VENV)
export UV_LINK_MODE := copy
export MPLBACKEND := Agg
export PYDEVD_DISABLE_FILE_VALIDATION := 1
unexport JUPYTER_PATH
# Every test, notebook kernel and CLI call is a fresh interpreter: without bytecode each one
# compiles pandas, matplotlib and the kit from source again (seconds a process). uv writes the
# dependencies' bytecode at install (--compile-bytecode); the kit's own is written as it runs.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: report test test-fast test-slow e2e e2e-control lab bench native lock lint clean help

help:
	@echo "make report   run the investigation on the built-in seed case -> reports/$(NAME)/"
	@echo "make test     every test: make test-fast, make test-slow, then make e2e"
	@echo "make test-fast  lint, type check, pytest on tests/ but the slow ones, nbval on notebooks/"
	@echo "make test-slow  the tests marked slow (whole reports, real Prometheus, a browser)"
	@echo "make e2e      kvpressure collect against a real vLLM server (CPU build, own venv);"
	@echo "              kvpressure verify-vllm against that vLLM's scheduler"
	@echo "make e2e-control  make e2e plus verify-remedy's control (2 minutes more)"
	@echo "make lab      open the notebooks in JupyterLab"
	@echo "make bench    speed and memory benchmarks (benchmarks/)"
	@echo "make native   compile the simulation's exact step with mypyc (used when built)"
	@echo "make lock     re-lock dependencies and export requirements-lock.txt"

$(UV):
	$(PYTHON) -m venv .tools
	.tools/bin/pip install --quiet uv==$(UV_VERSION)

$(VENV)/.synced: pyproject.toml uv.lock | $(UV)
	$(UV) sync --locked --extra test --extra report --extra dask --extra parquet --inexact --compile-bytecode
	@touch $@

report: $(VENV)/.synced
	$(MAKE) native || echo "report: no compiled simulation (make native), its sources run"
	$(BIN)/kvpressure report --experiment $(EXPERIMENT) --out reports/$(NAME)

# Every test: the fast lane, the slow tests, then the end-to-end suite against a real vLLM server.
test: test-fast test-slow e2e

# pytest's workers, one a core (auto); a test module stays on one worker (its fixtures are
# built once). PYTEST_WORKERS=0 runs in this process.
PYTEST_WORKERS ?= auto
PYTEST_PARALLEL := $(if $(filter 0,$(PYTEST_WORKERS)),,-n $(PYTEST_WORKERS) --dist loadfile)

# The inner loop: lint, mypy on lib/ ([tool.mypy] in pyproject.toml), pytest on
# tests/ (without tests/e2e and the slow tests) and nbval on notebooks/.
test-fast: $(VENV)/.synced
	scripts/system-deps.sh
	$(MAKE) native
	$(BIN)/ruff check lib tests benchmarks
	$(BIN)/mypy
	$(BIN)/python -m kvpressure.notebooks.lab --install-filter --verify
	$(BIN)/pytest tests -m "not slow" $(PYTEST_PARALLEL) --durations=15
	cd notebooks && KVPRESSURE_NB_EXPERIMENT=../data/experiments/ci_small.yaml \
	    KVPRESSURE_RUN_CONTEXT=$(CURDIR)/.venv/nbval-run.json \
	    ../$(BIN)/pytest --nbval-lax --nbval-current-env .

test-slow: $(VENV)/.synced
	scripts/system-deps.sh
	$(MAKE) native
	$(BIN)/pytest tests -m slow $(PYTEST_PARALLEL) --durations=15

# A real vLLM (PyPI's CPU build, in its own cached venv: scripts/vllm-env.sh) serving a small
# seeded model with a deliberately small KV pool, a real Prometheus scraping it, and
# `kvpressure collect` sweeping levels below and past the knee; and `kvpressure verify-vllm`
# diffing the same vLLM's scheduler against the simulation on data/verify/; AIPerf and GuideLLM
# (each in its own cached venv: scripts/aiperf-env.sh, scripts/guidellm-env.sh) loading it, their
# exports read by `kvpressure report` (tests/e2e/).
e2e: $(VENV)/.synced
	scripts/system-deps.sh
	scripts/aiperf-env.sh >/dev/null
	scripts/guidellm-env.sh >/dev/null
	vllm_env=$$(scripts/vllm-env.sh) && \
	    KVPRESSURE_E2E=1 KVPRESSURE_VLLM_PYTHON=$$vllm_env/bin/python \
	    $(BIN)/pytest tests/e2e -v -s -p no:cacheprovider --durations=0

$(VENV)/.lab: $(VENV)/.synced
	$(UV) sync --locked --extra test --extra report --extra lab --inexact --compile-bytecode
	@touch $@

# Lab plots inline (MPLBACKEND=Agg, exported above for batch runs, is left out of its
# environment), outputs reach git only through the nbstripout filter installed here, and
# `make lab EXPERIMENT=...` makes that experiment the run the notebooks read.
LAB_CHOOSE := $(if $(filter command line environment,$(origin EXPERIMENT)),--choose $(EXPERIMENT))

# The same suite with verify-remedy's control too (a setting that cannot act, measured in
# paired rounds on two more servers: about 2 minutes more than make e2e).
e2e-control:
	KVPRESSURE_E2E_CONTROL=1 $(MAKE) e2e

lab: $(VENV)/.lab
	$(BIN)/python -m kvpressure.notebooks.lab $(LAB_CHOOSE) --install-filter --start -- $(LAB_ARGS)

bench: $(VENV)/.synced
	$(MAKE) native || echo "bench: no compiled simulation, its sources are measured"
	$(BIN)/python benchmarks/run_all.py

# The simulation's exact step compiled with mypyc (needs a C compiler); without it, or once a
# compiled module's source is edited, the simulation runs its sources (simulation/native.py).
native: $(VENV)/.synced
	$(UV) sync --locked --extra test --extra report --extra dask --extra parquet --extra native --inexact --compile-bytecode
	$(BIN)/python scripts/build_native.py

lock: | $(UV)
	$(UV) lock
	$(UV) export --frozen --all-extras --no-emit-project --no-hashes -o requirements-lock.txt >/dev/null

lint: $(VENV)/.synced
	$(BIN)/ruff check lib tests benchmarks

clean:
	rm -rf $(VENV) .tools
