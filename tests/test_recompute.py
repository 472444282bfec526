"""Cheap element-wise values of graph inputs computed again by every kernel that reads
them: a softmax backward over few long rows is split, and its float32 dy * y was written
by the chunk kernel for the last kernel to read back; now both compute it from dy and y.
From two bfloat16 tensors always (`plan/graph_view.py::recompute_cheap`: never more bytes
for any reader); from two float32 tensors because the last kernel reads y anyway (the
planner weighs it against the plan's kernels, `planner._cheaper_recomputed`), while a
residual add that two kernels read stays written."""
import sys

import pytest
import torch

from stitchml import config
from stitchml.plan.graph_view import is_free
from stitchml.testing import compare_against_float64, compare_with_eager

sys.path.insert(0, "tests")
from planning import plan_of  # noqa: E402

SPLIT = dict(split_min_cols=64, persistent_max_cols=128, loop_block_cols=32)


def softmax_backward(y, dy):
    return torch.ops.aten._softmax_backward_data(dy, y, -1, y.dtype)


def test_split_softmax_backward_writes_no_float32_product():
    y = torch.empty(128, 262144, dtype=torch.bfloat16, device="meta")
    dy = torch.empty(128, 262144, dtype=torch.bfloat16, device="meta")
    with config.override(device="H100"):
        plan = plan_of(softmax_backward, y, dy)
    g = plan.graph
    assert len(plan.kernels) >= 2   # (the split: chunk statistics, then the element-wise pass)
    full = [o for k in plan.kernels for o in k.outputs if g[o].numel == 128 * 262144]
    assert [g[o].dtype for o in full] == [torch.bfloat16]   # only the result itself
    # dy * y (its operands the float32 casts of the two inputs): free, computed by each reader
    (product,) = [n for n in g.nodes if n.kind == "pointwise" and n.op == "mul"
                  and all(g[r].op == "cast" and g[g[r].refs[0]].kind == "input" for r in n.refs)]
    assert product.dtype == torch.float32 and is_free(product)


def test_a_narrow_product_is_not_recomputed():
    """float32 * float32 in float32: writing it once (4 bytes an element) is cheaper than
    re-reading both operands (8 bytes) in each reader."""
    a = torch.empty(128, 262144, dtype=torch.float32, device="meta")
    with config.override(device="H100"):
        plan = plan_of(lambda a, b: ((a * b).sum(-1), (a * b) / 3), a, a.clone())
    g = plan.graph
    assert not any(n.attr("recompute") for n in g.nodes if n.op == "mul")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_split_softmax_backward_matches_eager(dtype):
    y = torch.softmax(torch.randn(2, 600) * 3, -1).to(dtype)
    dy = torch.randn(2, 600).to(dtype)
    with config.override(**SPLIT):
        if dtype == torch.bfloat16:
            c, verdict = compare_against_float64(softmax_backward, [y, dy], backward=False)
            verdict.assert_ok("softmax_backward")
        else:
            c = compare_with_eager(softmax_backward, [y, dy], backward=False)
    plan = c.backend.records[0].plan
    assert len(plan.kernels) >= 2
    (recomputed,) = [n for n in plan.graph.nodes if n.op == "mul" and n.attr("recompute")]
    assert recomputed.dtype == torch.float32


def test_float32_product_over_split_rows_is_recomputed_by_the_plan():
    y = torch.empty(128, 262144, dtype=torch.float32, device="meta")
    with config.override(device="H100"):
        plan = plan_of(softmax_backward, y, y.clone())
    g = plan.graph
    full = [o for k in plan.kernels for o in k.outputs if g[o].numel == 128 * 262144]
    assert len(full) == 1   # only the result itself goes to memory


def test_a_residual_add_read_by_another_kernel_stays_written():
    """r = x + h (two float32 graph inputs) feeds a layer norm and a softmax over rows (a
    column max first: the exponentials are a kernel of their own, reading r): computing r
    there would read x and h (8 bytes an element), writing it and reading it back costs
    the same, so it stays written."""
    def block(x, h, w):
        r = x + h
        return torch.nn.functional.layer_norm(r, (r.shape[-1],), w), r.softmax(0)
    x = torch.empty(4096, 4096, device="meta")
    with config.override(device="H100"):
        plan = plan_of(block, x, x.clone(), torch.empty(4096, device="meta"))
    g = plan.graph
    (add,) = [n for n in g.nodes if n.op == "add" and all(g[r].kind == "input" for r in n.refs)]
    assert not add.attr("recompute")
    assert len([k for k in plan.kernels if add.id in k.inputs]) == 1   # (the case weighed)


def ln_backward(x, w, dy, mean, rstd):
    return torch.ops.aten.native_layer_norm_backward(dy, x, (x.shape[-1],), mean, rstd, w, w, [True, True, True])


def rms_backward(x, w, dy, rstd):
    """An RMSNorm's backward as AOTAutograd writes it for `(x.float() * rstd).to(bf16) * w`."""
    xf = x.float()
    xn = (xf * rstd).to(x.dtype)
    gw = (dy * xn).sum(0)
    g = (dy * w).float()
    dx = g * rstd - xf * ((g * xf).sum(-1, keepdim=True) * rstd.pow(3) / x.shape[-1])
    return dx.to(x.dtype), gw


def _norm_inputs(rows, cols, dtype, device="cpu", layer=True):
    x = (torch.randn(rows, cols, device=device) * 2 + 0.5).to(dtype)
    w = (torch.randn(cols, device=device) * 0.1 + 1).to(dtype)
    dy = torch.randn(rows, cols, device=device).to(dtype)
    if layer:   # (mean and rstd in the dtype eager's native_layer_norm gives them)
        _, mean, rstd = torch.native_layer_norm(x, (cols,), w, w, 1e-5)
        return [x, w, dy, mean, rstd]
    return [x, w, dy, torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("fn", [ln_backward, rms_backward], ids=["layer_norm", "rms_norm"])
def test_norm_backward_over_few_long_rows_writes_only_its_results(fn, dtype):
    """[128, 262144] on the H100 (split rows, too few for looped partials): the normalised
    input (x - mean) * rstd, dy * it and the float32 copy of dy * w are chains of one
    full-size source and broadcast per-row values, computed by each reader; only dx and
    the column sums go to memory, and the two column sums of dy share a kernel.  Layer
    norm bf16 970 -> 472 MB modelled, fp32 1576 -> 944; RMSNorm bf16 720 -> 471."""
    meta = _norm_inputs(128, 262144, dtype, "meta", layer=fn is ln_backward)
    with config.override(device="H100"):
        plan = plan_of(fn, *meta)
    g = plan.graph
    full = [o for k in plan.kernels for o in k.outputs if g[o].numel == 128 * 262144]
    assert [g[o].dtype for o in full] == [dtype]   # dx alone
    column = [k for k in plan.kernels if any(g[o].numel == 262144 for o in k.outputs)]
    assert len(column) == 1
    written = sum(k.bytes_written for k in plan.kernels)
    assert written < 128 * 262144 * dtype.itemsize * 1.05


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("fn", [ln_backward, rms_backward], ids=["layer_norm", "rms_norm"])
def test_norm_backward_over_split_rows_matches_eager(fn, dtype):
    """The same at [16, 1152] planned for the H100 (16 rows: split, as 128 rows of 262144
    are), run under the interpreter: values against eager (bf16: against float64)."""
    inputs = _norm_inputs(16, 1152, dtype, layer=fn is ln_backward)
    with config.override(**SPLIT, device="H100"):
        if dtype == torch.bfloat16:
            c, verdict = compare_against_float64(fn, inputs, backward=False)
            verdict.assert_ok(fn.__name__)
        else:
            c = compare_with_eager(fn, inputs, backward=False)
    plan = c.backend.records[0].plan
    g = plan.graph
    assert any(n.attr("split_of") is not None for n in g.nodes)   # (the rows were split)
    full = [o for k in plan.kernels for o in k.outputs if g[o].numel == 16 * 1152]
    assert [g[o].dtype for o in full] == [dtype]


def _first_row_offset(x):
    m = x.sum(1)
    return (m - m[:1]) * 3 + m


def test_a_reduction_read_at_other_rows_is_not_computed_again():
    """`m - m[:1]` with m a reduction: in m's kernel, every program would need the first
    row's m, which code generation gets by summing that row's input again in every
    program (the batch-norm chunk kernel read x twice: `Grouper._rereads_reduction`).
    The element-wise consumer gets a kernel of its own, which reads m written; the
    refusal says why; the results are as close to float64 as eager's."""
    plan = plan_of(_first_row_offset, torch.empty(64, 40, 24))
    g = plan.graph
    (red,) = [k for k in plan.kernels if any(g[m].op == "sum" for m in k.members)]
    assert all(g[m].op == "sum" for m in red.members), sorted(red.members)
    assert any("through a slice at other rows" in r.reason for r in plan.refusals), plan.refusals
    # (judged against float64: m - m[0] cancels, so eager's own rounding is the yardstick)
    c, verdict = compare_against_float64(_first_row_offset, [torch.randn(64, 40, 24) * 2 + 1])
    verdict.assert_ok("m - m[:1]")
    (rec,) = c.backend.records
    assert len(rec.plan.kernels) == 2


def test_an_element_wise_value_read_at_other_rows_still_merges():
    """Element-wise producers stay cheap to recompute at other rows: one kernel."""
    def fn(x):
        e = torch.exp(x)
        return e - e[:1]
    plan = plan_of(fn, torch.empty(64, 40))
    assert len(plan.kernels) == 1 and not any("through a slice" in r.reason for r in plan.refusals)
