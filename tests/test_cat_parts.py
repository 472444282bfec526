"""Element-wise kernels that exist only to compute the parts of one concatenation are
computed by the concatenation's kernel (knob `cat_parts`, `plan/planner.py::_parts_of_cats`):
a SwiGLU backward's gate and up gradients, concatenated for the weight gradient of the
fused gate/up projection (a Mixtral-style expert), are no longer written and read back.
Interpreter tier (fp32 against eager, bf16 against float64, outputs poisoned) and plan
tier (full-size H200 plans, no kernel run)."""
import sys

import pytest
import torch
import torch.nn.functional as F

from stitchml import config
from stitchml.ir import nodes as ir
from stitchml.codegen.canonical import closure as _closure
from stitchml.testing import compare_against_float64, compare_with_eager

sys.path.insert(0, "tests")
from planning import plan_of  # noqa: E402


def swiglu_backward(h, dy):
    """The gradient of silu(gate) * up with respect to h = [gate | up], written out."""
    gate, up = h.float().chunk(2, -1)
    s = torch.sigmoid(gate)
    d = dy.float()
    dgate = (d * up * s * (1 + gate * (1 - s))).to(h.dtype)
    dup = (d * gate * s).to(h.dtype)
    return torch.cat([dgate, dup], -1)


def _ops(plan, k):
    """The ops a kernel's code computes: its members and the free values it pulls in."""
    return {plan.graph[m].op for m in _closure(plan.graph, k) if m not in k.inputs}


def test_one_kernel_computes_the_parts_where_it_concatenates():
    """MoE's expert size (8192 tokens, 2 x 1408, bf16): one kernel reading h and dy and
    writing the concatenation (115 MB); with the knob off, the parts' kernel and a copy
    into the concatenation (207 MB)."""
    h, dy = torch.empty(8192, 2816, dtype=torch.bfloat16), torch.empty(8192, 1408, dtype=torch.bfloat16)
    with config.override(device="H200"):
        on = plan_of(swiglu_backward, h, dy)
    with config.override(device="H200", cat_parts=False, place_cats=False):
        off = plan_of(swiglu_backward, h, dy)
    with config.override(device="H200", place_cats=False):
        parts = plan_of(swiglu_backward, h, dy)
    moved = lambda p: sum(k.bytes_read + k.bytes_written for k in p.kernels)   # noqa: E731
    # by default the SwiGLU kernel writes both gradients into the concatenation's halves
    # (buffer placement, tests/test_place_cats.py): no kernel computes the concatenation
    assert len(on.kernels) == 1 and "cat" not in _ops(on, on.kernels[0]) and moved(on) == moved(parts)
    on = parts
    assert len(on.kernels) == 1 and {"cat", "sigmoid"} <= _ops(on, on.kernels[0]), \
        [_ops(on, k) for k in on.kernels]
    assert moved(on) <= (h.nbytes * 2 + dy.nbytes) * 1.01, moved(on) / 1e6
    assert len(off.kernels) == 2 and moved(off) >= 1.7 * moved(on), (moved(off) / 1e6, moved(on) / 1e6)
    assert on.predicted_s < off.predicted_s


def test_a_part_read_elsewhere_keeps_its_kernel():
    """The gate gradient also returned (a graph output): its kernel writes it anyway, so
    nothing is absorbed."""
    def fn(h, dy):
        gate, up = h.chunk(2, -1)
        dgate = dy * up * torch.sigmoid(gate)
        dup = dy * gate
        return torch.cat([dgate, dup], -1), dgate

    with config.override(device="H200"):
        plan = plan_of(fn, torch.empty(512, 256), torch.empty(512, 128))
    cat_kernels = [k for k in plan.kernels if "cat" in _ops(plan, k)]
    assert len(cat_kernels) == 1 and "sigmoid" not in _ops(plan, cat_kernels[0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_swiglu_backward_matches(dtype):
    h = torch.randn(37, 2 * 24).to(dtype)
    dy = torch.randn(37, 24).to(dtype)
    if dtype == torch.float32:
        c = compare_with_eager(swiglu_backward, [h, dy], backward=False)
    else:
        c, verdict = compare_against_float64(swiglu_backward, [h, dy], backward=False)
        verdict.assert_ok("swiglu backward")
    (rec,) = c.backend.records
    assert len(rec.plan.kernels) == 1, [_ops(rec.plan, k) for k in rec.plan.kernels]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_a_fused_gate_up_mlp_trains(dtype):
    """silu(gate) * up with gate and up one matrix product's halves, then a down
    projection: the backward's concatenated gradient of the product's output is computed
    in the kernel that writes it (it holds the sigmoid), every gradient as eager's."""
    def mlp(x, w_gu, w_down):
        gate, up = (x @ w_gu).chunk(2, -1)
        return (F.silu(gate) * up) @ w_down

    torch.manual_seed(0)
    x = torch.randn(24, 16).to(dtype).requires_grad_()
    w_gu = (torch.randn(16, 40) * 0.3).to(dtype).requires_grad_()
    w_down = (torch.randn(20, 16) * 0.3).to(dtype).requires_grad_()
    if dtype == torch.float32:
        c = compare_with_eager(mlp, [x, w_gu, w_down])
    else:
        c, verdict = compare_against_float64(mlp, [x, w_gu, w_down])
        verdict.assert_ok("fused gate/up MLP")
    (bwd,) = [r for r in c.backend.records if r.kind == "backward"]
    g = bwd.plan.graph
    cats = [k for k in bwd.plan.kernels if any(g[m].kind == ir.CAT for m in k.members)]
    placed = [n for n in g.nodes if n.kind == ir.CAT and n.attr("placed")]
    if dtype == torch.bfloat16:
        # halves of 20 bf16 values a row (40 bytes) are too narrow to place: the
        # concatenation's kernel computes its parts
        assert cats and not placed and all("sigmoid" in _ops(bwd.plan, k) for k in cats)
        return
    # float32 (80 bytes a row): the concatenation is placed (tests/test_place_cats.py), the
    # kernel holding the sigmoid writes both parts into it, and no kernel copies them
    assert not cats and len(placed) == 1, [_ops(bwd.plan, k) for k in bwd.plan.kernels]
    (writer,) = [k for k in bwd.plan.kernels if set(placed[0].refs) & set(k.outputs)]
    assert set(placed[0].refs) <= set(writer.outputs) and "sigmoid" in _ops(bwd.plan, writer)


def test_explain_says_the_parts_are_computed_by_the_concatenation():
    from stitchml.tools.explain import Report
    c = compare_with_eager(swiglu_backward, [torch.randn(9, 16), torch.randn(9, 8)], backward=False)
    text = Report(c.backend.records).to_text()
    assert "computed where read, not written:" in text
    assert "a part of a concatenation, computed by the concatenation's kernel" in text
