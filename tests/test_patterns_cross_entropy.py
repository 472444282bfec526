"""Cross-entropy in log-sum-exp form (issue 13.3): the `cross_entropy` rewrite on the
Dynamo graph against eager (fp32 and bf16, loss and gradients, fresh random inputs,
reductions, ignore_index, label smoothing, persistent and looped rows), its refusals,
its kernel counts and modelled bytes (no [R, V] tensor saved for backward); and the
logsumexp decomposition it rests on (an online pair) against eager on special values."""
import sys
import warnings

import pytest
import torch
import torch.fx as fx
import torch.nn.functional as F
from functorch.compile import make_boxed_func
from torch._dynamo.backends.common import aot_autograd

from stitchml import config, patterns
from stitchml.capture import decomp
from stitchml.capture.decomp import decomposition_table
from stitchml.codegen.triton_kernel import generate
from stitchml.ir import nodes as ir
from stitchml.lower.lower import lower
from stitchml.patterns import cross_entropy
from stitchml.patterns.common import Refused
from stitchml.plan.planner import build_plan
from stitchml.plan.row_loops import loop_groups, online_partner
from stitchml.testing import compare_against_float64, compare_with_eager

sys.path.insert(0, "tests")
from planning import plan_of  # noqa: E402
from seeds import stable_seed

LOOPED = dict(persistent_max_cols=64, loop_block_cols=32)   # rows of 301 loop over 10 blocks
R, V = 13, 301


def _records(seen: int, pattern: str = "cross_entropy"):
    return [r for r in patterns.LOG[seen:] if r.pattern == pattern]


def _logits(dtype, rows=R, classes=V):
    return (torch.randn(rows, classes) * 3).to(dtype).requires_grad_()


def _target(ignored=(), ignore_index=-100, rows=R, classes=V):
    t = torch.randint(0, classes, (rows,))
    for i in ignored:
        t[i] = ignore_index
    return t


def _check(fn, inputs, *, applied=True, factor=4.0):
    """Compiled vs eager vs float64, the rewrite's record, ≤ 2 launches per graph."""
    seen = len(patterns.LOG)
    c, judgement = compare_against_float64(fn, inputs, factor=factor)
    judgement.assert_ok()
    recs = _records(seen)
    assert [r.applied for r in recs] == [applied], recs
    eager = fn(*[x.detach() if isinstance(x, torch.Tensor) else x for x in inputs])
    assert c.outputs.dtype == eager.dtype and c.outputs.shape == eager.shape
    assert all(rec.eager_reason is None for rec in c.backend.records)
    assert all(1 <= n <= 2 for n in c.launches_per_graph), c.launches_per_graph
    return c, recs


# --------------------------------------------------------------------------- against eager

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_cross_entropy_matches_eager_with_ignored_rows(dtype, reduction, smoothing):
    torch.manual_seed(stable_seed(str(dtype), reduction, smoothing))
    x, t = _logits(dtype), _target(ignored=(2, 7))

    def fn(x, t):
        return F.cross_entropy(x, t, reduction=reduction, label_smoothing=smoothing)
    c, (rec,) = _check(fn, [x, t])
    assert f"reduction={reduction}" in rec.detail
    assert [r.kind for r in c.backend.records] == ["forward", "backward"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_looped_rows_read_the_logits_once_forward(dtype, smoothing):
    """V=301 over blocks of 32: the row max, sum of exp (online pair), row sum and the
    target's logit in one loop; a custom ignore_index; no ignored row at all."""
    torch.manual_seed(3)
    x, t = _logits(dtype), _target()

    def fn(x, t):
        return F.cross_entropy(x, t, ignore_index=5 * V, label_smoothing=smoothing)
    with config.override(**LOOPED):
        c, _ = _check(fn, [x, t])
    fwd = next(r for r in c.backend.records if r.kind == "forward")
    (main,) = [k for k in fwd.plan.kernels if k.domain.cols == V]
    assert main.mapping.form == "row_looped"
    assert main.bytes_read < R * V * x.element_size() + 64 * R       # one pass (+ row values)
    bwd = next(r for r in c.backend.records if r.kind == "backward")
    assert sum(k.bytes_read for k in bwd.plan.kernels) < R * V * x.element_size() + 64 * R


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_looped_rows_with_ignored_rows_and_sum(dtype):
    torch.manual_seed(4)
    x, t = _logits(dtype), _target(ignored=(0, 12), ignore_index=-1)
    with config.override(**LOOPED):
        _check(lambda x, t: F.cross_entropy(x, t, ignore_index=-1, reduction="sum", label_smoothing=0.1), [x, t])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_every_row_ignored_gives_nan_mean_like_eager(dtype, smoothing):
    """0 / 0 for the loss; eager's gradient is 0 there (ignored rows get none)."""
    x, t = _logits(dtype), _target(ignored=range(R))
    seen = len(patterns.LOG)
    c = compare_with_eager(lambda x, t: F.cross_entropy(x, t, label_smoothing=smoothing), [x, t])
    assert torch.isnan(c.outputs) and torch.isnan(c.expected)
    assert [r.applied for r in _records(seen)] == [True]


def test_nll_of_log_softmax_and_logits_used_elsewhere():
    """nll_loss(log_softmax(x, -1)) is matched too; x itself may have other users."""
    torch.manual_seed(5)
    x, t = _logits(torch.float32), _target(ignored=(3,))

    def fn(x, t):
        loss = F.nll_loss(F.log_softmax(x, dim=-1), t, reduction="sum")
        return loss + (x * x).mean()
    with config.override(**LOOPED):
        _check(fn, [x, t])


def test_softmax_method_form_and_logits_from_a_product():
    """logits = h @ w returned as well: linear_ce refuses (logits escape), this applies."""
    torch.manual_seed(6)
    h = torch.randn(R, 16, requires_grad=True)
    w = (torch.randn(16, V) / 4).requires_grad_()
    t = _target(ignored=(1,))

    def fn(h, w, t):
        z = h @ w
        return F.nll_loss(z.log_softmax(-1), t), z
    seen = len(patterns.LOG)
    c, judgement = compare_against_float64(fn, [h, w, t])
    judgement.assert_ok()
    assert [(r.pattern, r.applied) for r in patterns.LOG[seen:]] == [("linear_ce", False), ("cross_entropy", True)]


def test_knob_off_leaves_the_loss_alone():
    x, t = _logits(torch.float32), _target(ignored=(2,))
    seen = len(patterns.LOG)
    with config.override(cross_entropy=False):
        compare_with_eager(lambda x, t: F.cross_entropy(x, t), [x, t])
    assert _records(seen) == []


# --------------------------------------------------------------------------- refusals

@pytest.mark.parametrize("case,reason", [
    ("weights", "class weights"),
    ("size_average", "legacy size_average/reduce"),
    ("soft_targets", "probability (soft) targets"),
    ("three_d", "only [rows, classes]"),
    ("log_softmax_reused", "also used elsewhere"),
    ("log_softmax_dim0", "not the class dim"),
])
def test_refusals_say_why_and_still_match_eager(case, reason):
    torch.manual_seed(7)
    x, t = _logits(torch.float32), _target(ignored=(4,))
    inputs = [x, t]
    if case == "weights":
        inputs.append(torch.rand(V) + 0.5)

        def fn(x, t, w):
            return F.cross_entropy(x, t, weight=w)
    elif case == "size_average":
        def fn(x, t):
            return F.cross_entropy(x, t, size_average=False)
    elif case == "soft_targets":
        inputs = [x, torch.softmax(torch.randn(R, V), -1)]

        def fn(x, p):
            return F.cross_entropy(x, p, label_smoothing=0.1)
    elif case == "three_d":
        inputs = [(torch.randn(3, 11, 5) * 3).requires_grad_(), torch.randint(0, 11, (3, 5))]

        def fn(x, t):
            return F.cross_entropy(x, t)
    elif case == "log_softmax_reused":
        def fn(x, t):
            lp = F.log_softmax(x, -1)
            return F.nll_loss(lp, t) + lp.exp().sum()
    else:
        def fn(x, t):
            return F.nll_loss(F.log_softmax(x, 0), t)
    seen = len(patterns.LOG)
    with warnings.catch_warnings():   # size_average's deprecation
        warnings.simplefilter("ignore", UserWarning)
        c, judgement = compare_against_float64(fn, inputs)
    judgement.assert_ok()
    recs = _records(seen)
    assert len(recs) == 1 and not recs[0].applied and reason in recs[0].detail, recs


def test_non_constant_ignore_index_is_refused():
    """An int argument that changes between calls becomes a symbolic graph input."""
    x = _logits(torch.float32)

    def fn(x, t, ii):
        return F.cross_entropy(x, t, ignore_index=ii)
    compiled = torch.compile(fn, backend="stitch")
    seen = len(patterns.LOG)
    for ii in (-100, -7, -9):
        t = _target(ignored=(1,), ignore_index=ii)
        got = compiled(x, t, ii)
        torch.testing.assert_close(got, fn(x, t, ii))
    reasons = [r.detail for r in _records(seen) if not r.applied]
    assert any("not constants" in d for d in reasons), _records(seen)


def _graph_of_loss(x_meta, t_meta, target=F.cross_entropy, **kwargs) -> fx.Node:
    """A Dynamo-like graph: placeholders whose example values are the given tensors."""
    g = fx.Graph()
    x, t = g.placeholder("x"), g.placeholder("t")
    x.meta["example_value"], t.meta["example_value"] = x_meta, t_meta
    loss = g.call_function(target, (x, t), kwargs)
    g.output(loss)
    return loss


@pytest.mark.parametrize("x_dtype,t_dtype,kwargs,reason", [
    (torch.int64, torch.int64, {}, "not floating"),
    (torch.float32, torch.int32, {}, "not int64"),
    (torch.float32, torch.int64, {"reduction": "batchmean"}, "reduction='batchmean'"),
    (torch.float32, torch.int64, {"label_smoothing": 1.5}, "outside [0, 1]"),
    (torch.float32, torch.int64, {"reduce": False}, "legacy"),
])
def test_match_refuses_with_a_reason(x_dtype, t_dtype, kwargs, reason):
    loss = _graph_of_loss(torch.zeros(4, 5, dtype=x_dtype), torch.zeros(4, dtype=t_dtype), **kwargs)
    with pytest.raises(Refused, match=reason.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")):
        cross_entropy.match(loss)


def test_match_refuses_a_log_softmax_in_another_dtype():
    g = fx.Graph()
    x, t = g.placeholder("x"), g.placeholder("t")
    x.meta["example_value"], t.meta["example_value"] = torch.zeros(4, 5, dtype=torch.bfloat16), torch.zeros(4).long()
    lp = g.call_function(F.log_softmax, (x,), {"dim": -1, "dtype": torch.float32})
    loss = g.call_function(F.nll_loss, (lp, t))
    g.output(loss)
    with pytest.raises(Refused, match="a cast copy"):
        cross_entropy.match(loss)


# --------------------------------------------------------------------------- modelled bytes

def _plans_fwd_bwd(fn, *inputs):
    """Forward and backward plans of fn as the backend captures it (pattern rewrites,
    AOTAutograd, our decompositions); no kernel is generated or run."""
    plans = {}

    def planned(kind):
        def compiler(gm, ex):
            plans[kind] = build_plan(lower(gm))
            return make_boxed_func(gm.forward)
        return compiler
    aot = aot_autograd(fw_compiler=planned("forward"), bw_compiler=planned("backward"),
                       decompositions=decomposition_table())

    def backend(gm, ex):
        patterns.rewrite(gm, ex)
        return aot(gm, ex)
    torch.compile(fn, backend=backend)(*inputs).backward()
    return plans


def _total_bytes(plans) -> int:
    return sum(k.bytes_read + k.bytes_written for p in plans.values() for k in p.kernels)


def test_modelled_bytes_are_three_passes_and_nothing_of_rows_by_classes_is_saved():
    rows, classes = 512, 3000
    x = torch.randn(rows, classes, requires_grad=True)
    t = _target(ignored=(5,), rows=rows, classes=classes)

    def fn(x, t):
        return F.cross_entropy(x, t, label_smoothing=0.1)
    rv = rows * classes * 4
    with config.override(device="H100"):
        seen = len(patterns.LOG)
        on = _plans_fwd_bwd(fn, x, t)
        assert [r.applied for r in _records(seen)] == [True]
        with config.override(cross_entropy=False):
            torch._dynamo.reset()
            off = _plans_fwd_bwd(fn, x, t)
    assert _total_bytes(on) <= 3.5 * rv, _total_bytes(on) / rv
    assert _total_bytes(off) >= 4 * rv          # the log-softmax written and read back
    for plans in (on,):
        assert plans["forward"].num_kernels <= 2 and plans["backward"].num_kernels <= 2
    g = on["forward"].graph
    saved = [g[o] for o in g.output_ids() if g[o].numel >= rows * classes]
    assert saved and all(n.kind == ir.INPUT for n in saved), [(n.kind, n.op, n.shape) for n in saved]
    g_off = off["forward"].graph
    assert any(g_off[o].kind != ir.INPUT and g_off[o].numel >= rows * classes for o in g_off.output_ids())


# --------------------------------------------------------------------------- logsumexp decomposition

def _special(shape, dtype):
    """Rows (the last dim) whose maximum arrives late, is -inf throughout, NaN, +inf,
    +inf beside -inf, in the last partial block; -inf for the first blocks then finite."""
    x = torch.randn(shape) * 4
    r = x.reshape(-1, shape[-1])
    n = shape[-1]
    r[1, : n - 40] = float("-inf")
    r[2, :] = float("-inf")
    r[3, 17] = float("nan")
    r[4, n - 40] = float("inf")
    r[5, n - 1] = 40.0
    r[6, 3], r[6, 5] = float("inf"), float("-inf")
    return x.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("dims,keepdim", [((-1,), False), ((-1,), True), ((1, 2), False), ((0, 2), True),
                                          ((), False), ((0, 1, 2), True)])
def test_logsumexp_decomposition_equals_eager_in_eager(dtype, dims, keepdim):
    """The decomposition itself (torch ops, run eagerly): every special row, any dims."""
    x = _special((3, 4, 61), dtype)
    if dims == () and not keepdim:   # eager's logsumexp(x, []) needs keepdim; ours reduces all dims
        torch.testing.assert_close(decomp.logsumexp(x, []), torch.logsumexp(x.flatten(), 0), equal_nan=True)
        return
    got = decomp.logsumexp(x, list(dims), keepdim)
    want = torch.logsumexp(x, list(dims), keepdim)
    assert got.dtype == want.dtype and got.shape == want.shape
    tol = {torch.float16: 2e-3, torch.bfloat16: 2e-2}.get(dtype, 1e-6)
    torch.testing.assert_close(got, want, rtol=tol, atol=tol, equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("looped", [True, False])
def test_logsumexp_kernels_match_eager_on_special_rows(dtype, looped):
    x = _special((8, 301), dtype)
    fn = lambda x: torch.logsumexp(x, -1)  # noqa: E731
    with config.override(**(LOOPED if looped else {})):
        c = compare_with_eager(fn, [x], backward=False)
        plan = plan_of(fn, x)
    assert c.num_kernels == 1
    out = c.outputs
    assert out[2] == float("-inf") and torch.isnan(out[3]) and out[4] == float("inf") and out[6] == float("inf")
    (k,) = plan.kernels
    if looped:
        assert k.mapping.form == "row_looped"
        (grp,) = loop_groups(plan.graph, k.members)          # one pass over the row
        assert online_partner(plan.graph, plan.graph[grp[1]]) == grp[0]
        assert "mrun" in generate(plan.graph, k).source


@pytest.mark.parametrize("keepdim", [False, True])
def test_logsumexp_over_several_dims_forward_backward(keepdim):
    torch.manual_seed(8)
    x = (torch.randn(5, 6, 70) * 3).requires_grad_()
    with config.override(**LOOPED):
        c = compare_with_eager(lambda x: torch.logsumexp(x, (0, 2), keepdim=keepdim) * 2, [x])
    assert c.num_kernels <= 3


def test_logsumexp_backward_keeps_input_and_result():
    """Autograd above the decomposition: the backward reads x and the [R] result only."""
    torch.manual_seed(9)
    x = (torch.randn(6, 301) * 3).bfloat16().requires_grad_()
    with config.override(**LOOPED):
        c = compare_with_eager(lambda x: torch.logsumexp(x, -1), [x], rtol=2e-2, atol=2e-2)
    fwd = next(r for r in c.backend.records if r.kind == "forward")
    g = fwd.plan.graph
    assert all(g[o].kind == ir.INPUT or g[o].numel == 6 for o in g.output_ids())
