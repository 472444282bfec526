"""Sibling row sums in one tuple reduction (knob `tuple_reductions`, off by default until
measured on a GPU): a layer norm's corrected variance sums d and d*d in one cross-warp
round, its backward sums g*dy and g*dy*xhat in one; results equal eager's (interpreter
tier: kernels run on CPU tensors, outputs poisoned by the compiled wrapper's own
allocation, fresh random inputs)."""
import sys

import pytest
import torch
import torch.nn.functional as F

from stitchml import config
from stitchml.codegen import generate_all
from stitchml.testing import compare_with_eager

sys.path.insert(0, "tests")
from planning import plan_of  # noqa: E402


def _sources(records) -> str:
    return "\n".join(ks.source for r in records for ks in generate_all(r.plan.graph, r.plan).values())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_layer_norm_forward_and_backward_reduce_sibling_sums_together(dtype):
    x = (torch.randn(48, 300) * 3 + 5).to(dtype).requires_grad_()
    w, b = torch.randn(300, requires_grad=True), torch.randn(300, requires_grad=True)
    with config.override(tuple_reductions=True):
        c = compare_with_eager(lambda x, w, b: F.layer_norm(x.float(), (300,), w, b), [x, w, b])
        src = _sources(c.backend.records)     # (generated again: under the same knobs)
    # forward: sum(d), sum(d*d) in one; backward: the two row sums of dx in one
    assert src.count("tl.reduce((") >= 2 and "_add2)" in src, src
    with config.override(tuple_reductions=False):
        c = compare_with_eager(lambda x, w, b: F.layer_norm(x.float(), (300,), w, b), [x, w, b])
        assert "tl.reduce((" not in _sources(c.backend.records)


def test_three_independent_row_sums_share_one_round_and_dependent_ones_do_not():
    def f(x, y):
        s1, s2, s3 = x.sum(-1, keepdim=True), (x * y).sum(-1, keepdim=True), (y * y).sum(-1, keepdim=True)
        t = (x - s1 / 64).sum(-1, keepdim=True)    # reads s1: a round of its own
        return x * s1 + y * s2 - s3 + t
    x, y = torch.randn(32, 64), torch.randn(32, 64)
    with config.override(tuple_reductions=True):
        plan = plan_of(f, x, y)
        src = "\n".join(ks.source for ks in generate_all(plan.graph, plan).values())
        compare_with_eager(f, [x, y], backward=False, rtol=1e-5, atol=1e-4)
    assert src.count("tl.reduce((") == 1 and "_add3)" in src and src.count("tl.sum(") == 1, src


def test_the_knob_is_part_of_the_kernel_cache_key():
    from stitchml.codegen import canonical
    assert "tuple_reductions" in canonical.CODE_KNOBS
