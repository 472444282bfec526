# Two entry points: `make demo` (the main job) and `make test` (the test suite).
# Both build their own virtual environment: torch 2.13.0 first (the CPU build that
# the machine provides; a bare `torch` requirement would pull CUDA packages), then
# stitchml with its test extras.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.stitchml-installed
JOBS ?= 2

.PHONY: demo test test-gpu explain venv clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	TRITON_INTERPRET=1 $(BIN)/stitchml demo

explain: $(STAMP)
	TRITON_INTERPRET=1 $(BIN)/stitchml explain

test: $(STAMP)
	TRITON_INTERPRET=1 $(BIN)/python -m pytest -q -n $(JOBS) tests

# on a GPU machine (no package index): PYTHONPATH=src python3 -m pytest -m gpu tests
test-gpu:
	PYTHONPATH=src $(PY) -m pytest -q -m gpu tests

clean:
	rm -rf $(VENV) build src/*.egg-info
