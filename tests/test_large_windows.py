"""Large pooling windows and values read through many window maps (forty-fourth session).

timm cspnext's SPPF block max-pools one batch norm + SiLU output with 5x5, 9x9 and 13x13
stride-1 windows.  Unrolled (one strided slice per window offset) and with the producer
fused, its kernel evaluated the producer at 275 offsets: 7900 lines that Triton 3.6
compiled for minutes.  Two changes, tested here:

- windows of more than `decomp_window.UNROLL_MAX_WINDOW` elements are reductions over
  (kh, kw) window axes of overlapping views, with eager's index rules (first maximum,
  last NaN, first inside position of an all -inf window); their backward sums each
  residue class's window the same way;
- a value a kernel would evaluate at many window maps (`plan/window_reads.py`, knob
  `window_recompute_ops`) is written once and read by its own kernel's readers.

Interpreter tier (against eager on fresh random inputs, outputs poisoned by the harness)
and plan tier (plans only)."""
import sys

import pytest
import torch
import torch.nn.functional as F

from stitchml import config
from stitchml.capture.decomp_window import UNROLL_MAX_WINDOW
from stitchml.ir import nodes as ir
from stitchml.plan import window_reads
from stitchml.plan.data import EagerStep
from stitchml.testing import compare_against_float64, compare_with_eager

sys.path.insert(0, "tests")
from planning import graph_of  # noqa: E402

aten = torch.ops.aten


def _x(shape, dtype=torch.float32):
    return (torch.randn(shape) * 2 + 0.3).to(dtype).requires_grad_()


def _assert_stitched(c) -> None:
    """Every op of every graph in a kernel: no eager step (an `as_strided` of an
    overlapping view would run eagerly and materialise every window)."""
    for r in c.backend.records:
        assert r.eager_reason is None
        eager = [(s.op, s.reason) for s in r.plan.steps if isinstance(s, EagerStep)]
        assert not eager, eager


def _window_reductions(plan) -> list[tuple[int, ...]]:
    """The window shapes of the plan's reductions over trailing window axes."""
    g = plan.graph
    return sorted({g[g[m].refs[0]].shape[-2:] for k in plan.kernels for m in k.members
                   if g[m].kind == ir.REDUCE and len(g[g[m].refs[0]].shape) >= 6})


# (the interpreter runs a program per row of these windows, 13x13 max-pooling taking one
# a row: its input the smallest of these, CI time)
LARGE = [
    ("max13s1p6", lambda x: F.max_pool2d(x, 13, 1, 6)),
    ("max9x11_s12_dil", lambda x: F.max_pool2d(x, (9, 11), (1, 2), (4, 5), dilation=(1, 2))),
    ("max7s3_ceil", lambda x: F.max_pool2d(x, 7, 3, 3, ceil_mode=True)),
    ("avg11s2p5_nopad", lambda x: F.avg_pool2d(x, 11, 2, 5, count_include_pad=False)),
    ("avg9s1p4", lambda x: F.avg_pool2d(x, 9, 1, 4)),
]


@pytest.mark.parametrize("name,fn", LARGE, ids=[p[0] for p in LARGE])
def test_a_large_window_is_a_reduction_and_matches_eager(name, fn):
    x = _x((1, 2, 13, 9) if name == "max13s1p6" else (1, 3, 15, 17))
    c = compare_with_eager(fn, [x])
    (fwd,) = [r.plan for r in c.backend.records if r.kind == "forward"]
    assert _window_reductions(fwd), "the window was unrolled"
    _assert_stitched(c)


def test_a_small_window_stays_unrolled():
    x = _x((2, 3, 15, 17))
    c = compare_with_eager(lambda x: F.max_pool2d(x, 5, 1, 2), [x])
    assert 5 * 5 <= UNROLL_MAX_WINDOW
    assert not any(_window_reductions(r.plan) for r in c.backend.records)


def test_large_window_indices_follow_eagers_nan_tie_and_all_minus_inf_rules():
    """Eager's index: the first maximum in row-major window order, the last NaN of a
    window holding several, and for an all -inf window its first position inside the
    input, never the -inf padding."""
    x = torch.randn(2, 4, 13, 9)
    x[0, 0, 3, 3] = x[0, 0, 5, 6] = float("nan")       # two NaNs in one window
    x[0, 1, 4:6, 4:6] = 7.0                              # ties
    x[1, 2] = -float("inf")                              # every window all -inf
    x[1, 3, :, :2] = -float("inf")

    def fn(t):
        return F.max_pool2d(t * 1.0, 13, 1, 6, return_indices=True)
    c = compare_with_eager(fn, [x], backward=False)
    vals, idx = F.max_pool2d(x, 13, 1, 6, return_indices=True)
    assert torch.equal(c.outputs[1], idx)
    assert torch.equal(c.outputs[0].isnan(), vals.isnan())
    (fwd,) = [r.plan for r in c.backend.records]
    assert _window_reductions(fwd) == [(13, 13)]
    _assert_stitched(c)


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "cl"])
def test_large_window_backward_sums_each_class_window_and_matches_eager(channels_last):
    def fn(x):
        return F.max_pool2d(x, 13, 1, 6) * 2, F.avg_pool2d(x, 10, 3, 5)
    x = _x((1, 2, 16, 14))
    if channels_last:
        x = x.detach().to(memory_format=torch.channels_last).requires_grad_()
    c = compare_with_eager(fn, [x])
    (back,) = [r.plan for r in c.backend.records if r.kind == "backward"]
    assert _window_reductions(back), "the backward's class sums were unrolled"
    _assert_stitched(c)


def test_bf16_large_window_is_as_close_to_float64_as_eager():
    def fn(x):
        y = torch.sigmoid(x) * x
        return F.max_pool2d(y, 9, 1, 4) + F.avg_pool2d(y, 13, 1, 6)
    c, verdict = compare_against_float64(fn, [_x((1, 2, 11, 13), torch.bfloat16)])
    verdict.assert_ok("bf16 SiLU + large windows")
    _assert_stitched(c)


# ---------------------------------------------------------------- window reads

def _sppf(x, w, b):
    """An SPPF block's front (cspnext): batch norm (batch statistics) + SiLU read by three
    stride-1 pools."""
    y = F.silu(F.batch_norm(x, None, None, w, b, training=True))
    return torch.cat([y, F.max_pool2d(y, 5, 1, 2), F.max_pool2d(y, 9, 1, 4), F.max_pool2d(y, 13, 1, 6)], 1)


def _sppf_plan(**knobs):
    from stitchml.plan.planner import build_plan
    x, w, b = torch.empty(2, 16, 7, 7), torch.empty(16), torch.empty(16)
    with config.override(device="H200", **knobs):
        return build_plan(graph_of(_sppf, x, w, b))


def _silu_kernels(plan) -> list:
    g = plan.graph
    return [k for k in plan.kernels if any(g[m].op == "sigmoid" for m in k.members)]


def test_a_producer_read_through_many_windows_is_written_once():
    plan = _sppf_plan()
    (k,) = _silu_kernels(plan)
    g = plan.graph
    # the SiLU's kernel computes no window: each pool reads the written value
    assert not any(g[m].kind == ir.REDUCE and len(g[g[m].refs[0]].shape) >= 6 for m in k.members)
    assert not any(g[m].op == "gt" for m in k.members)
    assert any("index maps" in r.reason and "window_recompute_ops" in r.reason for r in plan.refusals)
    # without the limit the producer is evaluated at every window offset of the 5x5 pool
    fused = _sppf_plan(window_recompute_ops=0)
    (kf,) = _silu_kernels(fused)
    f = window_reads.evaluations(fused.graph, kf)
    sig = [m for m in kf.members if fused.graph[m].op == "sigmoid"]
    assert sig and f[sig[0]] > 20
    assert not any("index maps" in r.reason for r in fused.refusals)


def test_sppf_front_matches_eager():
    x, w, b = _x((1, 3, 7, 7)), torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True)
    _assert_stitched(compare_with_eager(_sppf, [x, w, b]))


def test_a_strided_small_window_keeps_its_producer_fused():
    """ResNet-50's stem: batch-norm affine + ReLU read through a 3x3 stride-2 window (~2.3
    evaluations an element): recomputed in the pool kernel, not written."""
    from stitchml.plan.planner import build_plan

    def stem(x, w, b):
        return F.max_pool2d(F.relu(x * w.view(1, -1, 1, 1) + b.view(1, -1, 1, 1)), 3, 2, 1)
    with config.override(device="H200"):
        plan = build_plan(graph_of(stem, torch.empty(8, 64, 112, 112), torch.empty(64), torch.empty(64)))
    (k,) = plan.kernels
    f = window_reads.evaluations(plan.graph, k)
    relu = [m for m in k.members if plan.graph[m].op in ("relu", "clamp_min", "maximum", "where")]
    assert relu and max(f[m] for m in relu) < 3
    assert not window_reads.heavy_window_reads(plan.graph, plan, config.get("window_recompute_ops"))
