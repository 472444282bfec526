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

.PHONY: demo test test-gpu gpu explain bench fuzz opinfo modules models vision venv clean browser-deps

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[test]'
	# torchvision (the release for torch 2.13) and timm for tests/test_models_torchvision.py,
	# in a folder off the venv's path: with the CPU build of torch, `import torchvision` fails
	# (its compiled library is built for CUDA torch), and transformers imports it when present;
	# src/stitchml/bench/vision.py puts the folder on the path behind the two op schemas torchvision expects
	$(BIN)/pip install --quiet --no-deps --target $(VENV)/vision torchvision==0.28.0 timm==1.0.31
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	@mkdir -p build
	TRITON_INTERPRET=1 $(BIN)/stitchml demo --html build/demo-report.html

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

# tests/test_report.py opens the HTML explain report in headless Chromium, and Graphviz
# draws its graph: both come from the distribution's packages, installed here where
# missing (as root, e.g. in CI; with sudo otherwise), so that test runs rather than skips.
browser-deps:
	@if ! command -v dot >/dev/null 2>&1 || ! command -v chromium >/dev/null 2>&1; then \
		if [ "$$(id -u)" = 0 ]; then apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y graphviz chromium; \
		elif command -v sudo >/dev/null 2>&1; then sudo apt-get update && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y graphviz chromium; \
		else echo "graphviz/chromium missing and not root: tests/test_report.py will fail" \
			"(STITCHML_SKIP_BROWSER_TESTS=1 skips it)"; fi; \
	fi

# (--durations: the 30 slowest tests go to the log, to keep the suite within its 20 minutes)
test: $(STAMP) browser-deps
	TRITON_INTERPRET=1 STITCHML_VISION_PATH=$(VENV)/vision $(BIN)/python -m pytest -q -n $(JOBS) --durations=30 tests

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

# PyTorch's whole OpInfo database (op_db) through the stitch backend, float32 forward and
# backward (OPINFO_SAMPLES samples an op), bfloat16/float16/float64/int64/int32/bool forward
# and non-contiguous float32 forward and backward (3), outputs poisoned, fallback off;
# writes docs/OPINFO.md (counts per status and per reason).  About 35 min on 2 CPU cores
# under the interpreter; OPINFO_ARGS="--family '^linalg'" for a part.
OPINFO_SAMPLES ?= 12
OPINFO_JOBS ?= $(shell nproc 2>/dev/null || echo 2)
OPINFO_ARGS ?=
opinfo: $(STAMP)
	TRITON_INTERPRET=1 $(BIN)/python -m stitchml.tools.opinfo_sweep --out docs/OPINFO.md --samples $(OPINFO_SAMPLES) \
		--half-samples 3 --jobs $(OPINFO_JOBS) $(OPINFO_ARGS)

# PyTorch's module database (module_db, every torch.nn module with samples): train and
# inference mode against eager, strict, fallback off; writes docs/MODULES.md.  About 2.5 min
modules: $(STAMP)
	TRITON_INTERPRET=1 $(BIN)/python -m stitchml.tools.module_sweep --out docs/MODULES.md $(MODULES_ARGS)

# real models beyond the zoo tests: 147 Hugging Face architectures, two sizes, strict, float64 judge
models: $(STAMP)
	TRITON_INTERPRET=1 $(BIN)/python -m stitchml.tools.model_sweep --out docs/MODELS.md $(MODELS_ARGS)

# vision models: the smallest timm model of each family (up to 10 M parameters), one training step
vision: $(STAMP)
	TRITON_INTERPRET=1 $(BIN)/python -m stitchml.tools.timm_sweep --jobs 2 --out docs/VISION.md $(VISION_ARGS)

# on a GPU machine (no package index): PYTHONPATH=src python3 -m pytest -m gpu tests
test-gpu:
	TRITON_INTERPRET=0 PYTHONPATH=src $(PY) -m pytest -q -m gpu tests

# the whole GPU batch from source (GPU tests, calibrate, micro + models suites) into
# bench/results/<gpu>-<date>/, resumable; GPU_STEPS picks steps (`bash tools/gpu_run.sh list`).
# Detached on the lent machines: see bench/NOTES.md, "One-command GPU runner".
GPU_STEPS ?=
gpu:
	PY=$(PY) bash tools/gpu_run.sh $(GPU_STEPS)

clean:
	rm -rf $(VENV) build src/*.egg-info
