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
import torch._dynamo.guards  # noqa: E402

# After each compile Dynamo times the new guards once for its compile metrics
# (`guard_latency_us`), first flushing the CPU caches by sweeping a large buffer: ~27 ms a
# compile on this 2-core machine, ~4 % of the suite's time over its thousands of compiles.
# Nothing in stitchml or in these tests reads that metric; the guards themselves are built
# and checked as always (`guard_manager.check` runs just before).
if hasattr(torch._dynamo.guards, "profile_guard_manager"):
    torch._dynamo.guards.profile_guard_manager = lambda *args, **kwargs: 0.0


# tests (in files other sessions own) that exercise the fallback to eager itself:
# "file" for a whole file, "file::test" (a name prefix) for one test and its parameters
FALLBACK_TESTS = (
    "test_failures.py",
    "test_dynamic.py::test_a_failing_size_runs_that_call_eagerly_with_a_warning",
    "test_coverage_strict.py::test_whole_graph_fallback_warns_once",
)


def pytest_configure(config):
    config.addinivalue_line("markers", "fallback: runs with fallback_on_error on (tests of the fallback itself)")


def _wants_fallback(item) -> bool:
    name = f"{os.path.basename(str(item.fspath))}::{item.name}"
    return any(name == f or name.startswith(f + "::") or ("::" in f and name.startswith(f)) for f in FALLBACK_TESTS)


def pytest_collection_modifyitems(config, items):
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


CUT_SMS = 12


@pytest.fixture
def h200_cut(monkeypatch):
    """The H200 cut to CUT_SMS SMs, its copy bandwidth and L2 in proportion: per SM the
    same plans (tiles, warps, walks, prefetch, column lanes, which the tests using it
    check) on a grid of 2 x 12 programs instead of 264, of which the interpreter runs 11x
    fewer (tests of walks took 40-66 s each at the H200's 264).  Returns the programs of
    its grid of two an SM."""
    from dataclasses import replace

    from stitchml.plan import devices
    h = devices.DEVICES["H200"]
    monkeypatch.setitem(devices.DEVICES, "H200", replace(h, sms=CUT_SMS, bandwidth=h.bandwidth * CUT_SMS / h.sms,
                                                         l2_bytes=h.l2_bytes * CUT_SMS // h.sms))
    return 2 * CUT_SMS
