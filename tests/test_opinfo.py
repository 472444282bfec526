"""CI slice of the OpInfo sweep (`python -m stitchml.tools.opinfo_sweep`): the first
few of PyTorch's own OpInfo samples of every op family we map, compiled with the stitch
backend and compared with eager, forward in float32 and bfloat16 and backward in
float32.  Every op we claim to lower must pass all of them; a sample may run an op
eagerly only where that op's rule deliberately refuses the arguments (or, in a backward
graph, where the mapping table names the op as having no rule)."""
from __future__ import annotations

import pytest

from stitchml.tools.opinfo_sweep import MAPPING, sweep_op

MAX_SAMPLES = 1  # per op, per configuration (fp32 fwd, fp32 bwd, bf16 fwd)


@pytest.mark.parametrize("key", sorted(MAPPING))
def test_opinfo_samples(key: str) -> None:
    result = sweep_op(key, max_samples=MAX_SAMPLES)
    assert any(t.samples for t in result.values()), f"{key}: no sample ran"
    problems = []
    for label, t in result.items():
        if t.failed:
            problems.append(f"{label}: {t.failed}/{t.samples} failed, first: {t.first_failure}")
        if t.unrefused_eager:
            problems.append(f"{label}: {t.unrefused_eager} samples ran ops eagerly that no rule refused: "
                            f"{t.eager_reasons}")
        assert t.passed + t.eager == t.samples
    assert not problems, f"{key}: " + "; ".join(problems)
