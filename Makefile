# Entry points: `make demo` (the main job), `make test` (the test suite) and `make bench`
# (the benchmark harness: full suites on a GPU, `--quick` without one).
# All build their virtual environment: torch 2.13.0 first (the CPU build that
# the machine provides; a bare `torch` requirement would pull CUDA packages), then
# stitchml with its test extras.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.stitchml-installed
JOBS ?= 2

.PHONY: demo test test-gpu explain bench fuzz venv clean

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

# with a CUDA GPU: every suite at full size; without one: --quick (tiny sizes, Triton
# interpreter, timings flagged as not meaningful).  BENCH_ARGS adds options, e.g.
# `make bench BENCH_ARGS="--suite micro --out bench/results/h100-run1"`.
BENCH_ARGS ?=
bench: $(STAMP)
	@if $(BIN)/python -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then \
		$(BIN)/stitchml bench $(BENCH_ARGS); \
	else \
		TRITON_INTERPRET=1 $(BIN)/stitchml bench --quick $(BENCH_ARGS); \
	fi

test: $(STAMP)
	TRITON_INTERPRET=1 $(BIN)/python -m pytest -q -n $(JOBS) tests

# the differential fuzzer outside pytest (docs/FUZZ.md): N random programs, seeds
# START..START+N-1, compiled vs eager, on FUZZ_JOBS processes; prints each failing case
# as one reproducible line and a summary, exits non-zero on any mismatch.
# `make fuzz N=10000`; replay one case: `python -m stitchml.fuzz --seed S --reduce`.
N ?= 1000
START ?= 0
FUZZ_JOBS ?= $(shell nproc 2>/dev/null || echo 2)
FUZZ_ARGS ?=
fuzz: $(STAMP)
	TRITON_INTERPRET=1 $(BIN)/python -m stitchml.fuzz -n $(N) --start $(START) --jobs $(FUZZ_JOBS) $(FUZZ_ARGS)

# on a GPU machine (no package index): PYTHONPATH=src python3 -m pytest -m gpu tests
test-gpu:
	PYTHONPATH=src $(PY) -m pytest -q -m gpu tests

clean:
	rm -rf $(VENV) build src/*.egg-info
