"""CI slice of the OpInfo sweep (`python -m stitchml.tools.opinfo_sweep`, `make opinfo`
for the whole op_db): one op_db entry per stratum of op families (`CI_SLICE`: element-wise
in every dtype, reductions, normalisations, views, indexed reads, constructors, complex,
the ops issue 19 added), one sample in each configuration (float32 forward and
backward, bfloat16, float16 and float64 forward), outputs poisoned, fallback off.
No sample may crash inside stitchml or mismatch (half precision: no further from a
float64 run than eager); in float32 every op of the slice must run in kernels.
About a minute on 2 cores."""
from __future__ import annotations

import pytest

from stitchml.tools.opinfo_sweep import CI_SLICE, LABELS, sweep_op


@pytest.mark.parametrize("key", CI_SLICE)
def test_opinfo_slice(key: str) -> None:
    result = sweep_op(key, samples=1, half_samples=1)
    assert result["fp32 fwd"].samples, f"{key}: no float32 sample ran"
    problems = [f"{label}: {t.first_failure}" for label, t in result.items() if t.failed or t.crashed]
    assert not problems, f"{key}: " + "; ".join(problems)
    assert set(result) == set(LABELS)
    t = result["fp32 fwd"]  # every op of the slice is lowered: in kernels (or views: none needed)
    assert t.passed == t.samples, f"{key}: ran eagerly in float32: {dict(t.reasons)}"


def test_sweep_counts_a_crash_inside_stitchml_as_a_crash(monkeypatch):
    import stitchml.pipeline as pipeline

    def boom(gm):
        raise ZeroDivisionError("injected crash")
    monkeypatch.setattr(pipeline, "lower", boom)
    t = sweep_op("exp", samples=1, half_samples=1, labels=("fp32 fwd",))["fp32 fwd"]
    assert t.crashed == 1 and "injected crash" in t.first_failure, t
