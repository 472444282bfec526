"""Test tiers (DESIGN §5): plan/IR/codegen-text tests run no kernels; interpreter
tests run generated kernels on CPU tensors under TRITON_INTERPRET=1; `gpu` tests need
CUDA and are skipped cleanly without it."""
import os

# must be set before triton is imported anywhere
os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("STITCHML_POISON_OUTPUTS", "1")
# tests exercise the planner every time (several replace planning stages to inject
# failures); the plan cache has its own tests (tests/test_compile_cache.py)
os.environ.setdefault("STITCHML_PLAN_CACHE", "0")
# likewise AOTAutograd's cache of stitched graphs (tests/test_aot_cache.py): a hit would skip the
# decompositions and partitioner that tests replace or inspect
os.environ.setdefault("STITCHML_AOT_CACHE", "0")
# a crash inside stitchml is a test failure, not a silent run in eager (issue 19): the
# fallback is off in every test except those that test the fallback itself (marked
# `fallback`, or listed in FALLBACK_TESTS below)
os.environ.setdefault("STITCHML_FALLBACK_ON_ERROR", "0")

import pytest  # noqa: E402
import torch  # noqa: E402


# tests (in files other sessions own) that exercise the fallback to eager itself:
# "file" for a whole file, "file::test" (a name prefix) for one test and its parameters
FALLBACK_TESTS = (
    "test_failures.py",
    "test_dynamic.py::test_a_failing_size_runs_that_call_eagerly_with_a_warning",
    "test_coverage_strict.py::test_whole_graph_fallback_warns_once",
    "test_bench.py::test_simulator_100_steps_compile_to_one_triton_launch",  # xfails on a known fallback
)


# The longest tests (over ~20 s each on the 2-core machine, `--durations` at 8eddd2f) run
# first: collected last, one of them could start on one worker while the other has
# nothing left, and the suite would wait for it alone (longest-first scheduling).
LONGEST_FIRST = (
    "test_models_torchvision.py::test_vision_model_trains_stitched",
    "test_model_sweep.py::test_architecture_trains_stitched_at_two_sizes_against_float64",
    "test_coverage_ops.py::test_this_sessions_kernel_forms_compile_for_sm90",
    "test_scan.py::test_scan_and_index_kernels_compile_for_sm90",
    "test_bench.py::test_simulator_100_steps_compile_to_one_triton_launch",
    "test_coverage_bessel.py::test_float",
    "test_coverage_search.py::test_search_kernels_compile_for_sm90",
    "test_aot_gpu.py::test_column_loops_keep_their_reductions_within_warps_for_sm90",
    "test_fuzz.py::test_cli_runs_cases_on_recycled_worker_pools",
    "test_models_real.py::test_model_trains_stitched_through_a_size_change",
    "test_layout_order.py::test_layer_norm_backward_over_few_tokens_matches_eager",
    "test_compile_time.py::test_bert_base_training_plans_and_generates_within_the_bounds",
    "test_coverage_igamma.py::test_igamma_and_bicubic_backward_compile_for_sm90",
    "test_aot_cache.py::test_a_changed_knob_or_a_damaged_entry_compiles_cold",
)


def _rank(item) -> int:
    name = f"{os.path.basename(str(item.fspath))}::{item.name}"
    return next((i for i, f in enumerate(LONGEST_FIRST) if name.startswith(f)), len(LONGEST_FIRST))


def pytest_configure(config):
    config.addinivalue_line("markers", "fallback: runs with fallback_on_error on (tests of the fallback itself)")


def _wants_fallback(item) -> bool:
    name = f"{os.path.basename(str(item.fspath))}::{item.name}"
    return any(name == f or name.startswith(f + "::") or ("::" in f and name.startswith(f)) for f in FALLBACK_TESTS)


def pytest_collection_modifyitems(config, items):
    items.sort(key=_rank)   # (stable: every other test keeps its place)
    for item in items:
        if _wants_fallback(item):
            item.add_marker(pytest.mark.fallback)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield


@pytest.fixture(autouse=True)
def _fallback_for_marked_tests(request):
    if request.node.get_closest_marker("fallback") is None:
        yield
        return
    from stitchml import config
    with config.override(fallback_on_error=True):  # an inner override (fallback off) still wins
        yield
