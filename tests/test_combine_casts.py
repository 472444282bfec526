"""A column reduction summed in float32 whose only reader is a cast is stored cast by the
combine kernel of its partials (plan/planner.py::_absorb_casts, knob `combine_casts`):
a bfloat16 bias or norm-weight gradient no longer takes a one-program kernel of its own.
Interpreter tier, outputs poisoned (tests/conftest.py); half precision judged against a
float64 run."""
import sys

import torch
import torch.nn.functional as F

from stitchml import config
from stitchml.codegen import generate_all
from stitchml.testing import compare_against_float64, compare_with_eager

sys.path.insert(0, "tests")
from planning import plan_of  # noqa: E402


def _norm(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b) * 2


def _inputs():
    x = torch.randn(64, 300, dtype=torch.bfloat16, requires_grad=True)
    return [x, torch.randn(300, dtype=torch.bfloat16, requires_grad=True),
            torch.randn(300, dtype=torch.bfloat16, requires_grad=True)]


def test_half_weight_gradients_are_cast_by_their_combine():
    c, judgement = compare_against_float64(_norm, _inputs())
    judgement.assert_ok()
    bwd = c.backend.records[-1].plan
    forms = [k.mapping.form for k in bwd.kernels]   # (rows of one program: column lanes, plan/mapping.py)
    assert forms[1:] == ["combine"] and forms[0] in ("packed_rows", "row_persistent"), forms
    (comb,) = [k for k in bwd.kernels if k.combine_of]
    g = bwd.graph
    assert len(comb.combine_casts) == 2 and all(g[o].dtype == torch.bfloat16 for o in comb.outputs)
    with config.override(combine_casts=False, combine_epilogues=False):
        c, judgement = compare_against_float64(_norm, _inputs())
    judgement.assert_ok()
    assert len(c.backend.records[-1].plan.kernels) == 4     # the two casts as kernels of their own
    with config.override(combine_casts=False):   # the casts are then the combine's epilogue
        c, judgement = compare_against_float64(_norm, _inputs())
    judgement.assert_ok()
    (comb,) = [k for k in c.backend.records[-1].plan.kernels if k.combine_of]
    assert len(c.backend.records[-1].plan.kernels) == 2 and len(comb.epilogue) == 2


def test_a_sum_read_by_more_than_its_cast_keeps_its_float32_output():
    x = torch.randn(600, 300)
    both = lambda x: (x.sum(0).bfloat16(), x.sum(0) * 3)  # noqa: E731
    c = compare_with_eager(both, [x], backward=False, atol=1e-4)
    (plan,) = [r.plan for r in c.backend.records]
    assert not any(k.combine_casts for k in plan.kernels)
    alone = plan_of(lambda x: x.sum(0).bfloat16(), x)
    (comb,) = [k for k in alone.kernels if k.combine_of]    # column partials, then the cast rides the combine
    assert comb.combine_casts and len(alone.kernels) == 2
    assert "_to_bf16" in generate_all(alone.graph, alone)[comb.name].source
    c = compare_with_eager(lambda x: x.sum(0).bfloat16(), [x], backward=False)
    assert [k.mapping.form for k in c.backend.records[0].plan.kernels] == ["packed_rows", "combine"]
