"""CI slice of the OpInfo sweep (`python -m stitchml.tools.opinfo_sweep`, `make opinfo`
for the whole op_db): one op_db entry per stratum of op families (`CI_SLICE`: element-wise
in every dtype, reductions, normalisations, views, indexed reads, constructors, complex,
the ops issue 19 added, integer and bool ones), one sample in each configuration (float32
forward and backward, bfloat16, float16 and float64 forward; int64, int32 and bool
forward; float32 made non-contiguous, forward and backward), outputs poisoned, fallback
off.  No sample may crash inside stitchml or mismatch (half precision: no further from a
float64 run than eager); in float32 (contiguous or not), int64 and bool every op of the
slice must run in kernels.  About a minute on 2 cores."""
from __future__ import annotations

import pytest

from stitchml.tools.opinfo_sweep import CI_SLICE, LABELS, sweep_op


@pytest.mark.parametrize("key", CI_SLICE)
def test_opinfo_slice(key: str) -> None:
    result = sweep_op(key, samples=1, half_samples=1)
    assert result["fp32 fwd"].samples or result["int64 fwd"].samples, f"{key}: no float32 or int64 sample ran"
    problems = [f"{label}: {t.first_failure}" for label, t in result.items() if t.failed or t.crashed]
    assert not problems, f"{key}: " + "; ".join(problems)
    assert set(result) == set(LABELS)
    for label in ("fp32 fwd", "int64 fwd", "bool fwd", "fp32 nc"):
        t = result[label]  # every op of the slice is lowered: in kernels (or views: none needed)
        assert t.passed == t.samples, f"{key}: ran eagerly in {label}: {dict(t.reasons)}"


def test_sweep_counts_a_crash_inside_stitchml_as_a_crash(monkeypatch):
    import stitchml.pipeline as pipeline

    def boom(gm):
        raise ZeroDivisionError("injected crash")
    monkeypatch.setattr(pipeline, "lower", boom)
    t = sweep_op("exp", samples=1, half_samples=1, labels=("fp32 fwd",))["fp32 fwd"]
    assert t.crashed == 1 and "injected crash" in t.first_failure, t


def test_sweep_fails_a_match_while_stitchml_logged_a_warning(monkeypatch):
    # a misprediction the run absorbed (an eager op's result converted to the plan's
    # layout at every call, fuzz seed 44635) matched eager and counted as a pass
    import logging

    import stitchml

    real = stitchml.StitchBackend.__call__

    def logging_call(self, gm, example_inputs):
        logging.getLogger("stitchml").warning("stitchml: injected by the test")
        return real(self, gm, example_inputs)
    monkeypatch.setattr(stitchml.StitchBackend, "__call__", logging_call)
    t = sweep_op("exp", samples=1, half_samples=1, labels=("fp32 fwd",))["fp32 fwd"]
    assert t.failed == 1 and "stitchml warned: stitchml: injected by the test" in t.first_failure, t


def test_judge_handles_nan_in_the_reference():
    # a NaN in the float64 run made every allowance NaN, so equal results "failed"
    # (__rpow__, igamma, var_mean in half precision)
    import torch

    from stitchml.testing import judge_against_float64
    ref = torch.tensor([1.0, float("nan"), 3.0], dtype=torch.float64)
    low = ref.to(torch.bfloat16)
    assert judge_against_float64([low.clone()], [low], [ref]).ok
    wrong = low.clone()
    wrong[0] = 1.5
    assert not judge_against_float64([wrong], [low], [ref]).ok


def test_float32_mismatch_with_eager_is_judged_by_a_float64_run():
    # native_layer_norm over one element: the exact input gradient is the mean's
    # cotangent; eager is ~1e-5 off, a kernel exact: not a failure of ours
    import torch

    from stitchml.tools.opinfo_sweep import _arbitrate
    ref = torch.tensor([0.3, -1.2], dtype=torch.float64)
    exact, eager = ref.float(), ref.float() + torch.tensor([3e-5, 0.0])
    assert _arbitrate("grad 0: not close", exact, eager, lambda: ref) == ""
    assert _arbitrate("grad 0: not close", eager + 1e-3, exact, lambda: ref) == "grad 0: not close"


def test_float64_mismatch_with_eager_is_judged_by_the_opinfo_reference():
    """Eager's float64 Bessel J0 is off by up to 3e-7 between 5 and 8 (its asymptotic form
    starts at 5); ours is exact to 1e-13: outside eager's tolerance, so the sample is judged
    by op_db's SciPy reference instead, and passes.  A wrong kernel still fails."""
    import torch
    from torch.testing._internal.common_methods_invocations import op_db
    from torch.testing._internal.opinfo.core import SampleInput

    from stitchml.tools import opinfo_sweep
    pytest.importorskip("scipy")
    (op,) = [o for o in op_db if o.name == "special.bessel_j0" and not o.variant_test_name]
    sample = SampleInput(torch.linspace(5.1, 7.9, 29, dtype=torch.float64))
    assert opinfo_sweep.run_sample(op, sample, torch.float64, False).status == "pass"
    ref = opinfo_sweep._numpy_reference(op, sample)
    eager = torch.special.bessel_j0(sample.input)
    assert (eager - ref).abs().max() > 1e-8   # (why the reference is needed)
    assert opinfo_sweep._arbitrate("not close", ref + 1e-6, eager, lambda: ref) == "not close"


def test_library_reasons_behind_a_prefix_are_library_work():
    """The memory-intensive coverage leaves out library work however the reason is prefixed
    (an op's name: torch's chunked linear cross-entropy; `with_effects`), and only that
    (the one predicate the sweeps, the fuzzer and the model tests share)."""
    from stitchml.fallback import by_design
    assert by_design("compute-intensive: vendor library")
    assert by_design("torch_nn._linear_cross_entropy_batch_chunked.default: compute-intensive: torch's chunked")
    assert by_design("with_effects: library op: an op with side effects")
    assert not by_design("no lowering rule for aten.foo.default")
    assert not by_design("aten.foo.default: no lowering rule")
