"""runtime/interpreter_tree.py: the interpreter's custom-combine reductions and scans run
as vectorised trees; the values are those of Triton's own element loop (order kept:
non-commutative combines), on odd lengths, both axes, tuple operands and keep_dims."""
import os

import pytest
import torch
import triton
import triton.language as tl

from stitchml.runtime import interpreter_tree

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET", "0") in ("", "0"),
                                reason="the interpreter's reductions: under TRITON_INTERPRET=1 only")


@triton.jit
def _affine(a1, b1, a2, b2):
    # x -> a1 x + b1, then a2 x + b2: associative, not commutative
    return a1 * a2, b1 * a2 + b2


@triton.jit
def _first_max(v1, i1, v2, i2):
    # (value, index) max, NaN wins, the lower index on ties
    take2 = (v2 > v1) | ((v2 != v2) & (v1 == v1)) | ((v2 == v1) & (i2 < i1))
    return tl.where(take2, v2, v1), tl.where(take2, i2, i1)


@triton.jit
def _kernel(a_ptr, b_ptr, ra_ptr, rb_ptr, sa_ptr, sb_ptr, mv_ptr, mi_ptr, k_ptr,
            R: tl.constexpr, C: tl.constexpr, AXIS: tl.constexpr):
    r = tl.arange(0, R)[:, None]
    c = tl.arange(0, C)[None, :]
    a = tl.load(a_ptr + r * C + c)
    b = tl.load(b_ptr + r * C + c)
    ra, rb = tl.reduce((a, b), AXIS, _affine)
    sa, sb = tl.associative_scan((a, b), AXIS, _affine)
    idx = (r * C + c).to(tl.int32)
    mv, mi = tl.reduce((b, idx), AXIS, _first_max)
    k = tl.reduce(b, AXIS, _nanmax, keep_dims=True)
    out = tl.arange(0, C if AXIS == 0 else R)
    tl.store(ra_ptr + out, ra)
    tl.store(rb_ptr + out, rb)
    tl.store(sa_ptr + r * C + c, sa)
    tl.store(sb_ptr + r * C + c, sb)
    tl.store(mv_ptr + out, mv)
    tl.store(mi_ptr + out, mi)
    if AXIS == 0:
        tl.store(k_ptr + c, k)
    else:
        tl.store(k_ptr + r, k)


@triton.jit
def _nanmax(x, y):
    return tl.where((x > y) | (x != x), x, y)


def _run(rows: int, cols: int, axis: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(rows * 100 + cols + axis)
    a = torch.rand(rows, cols, generator=g, dtype=torch.float64) + 0.5
    b = torch.randn(rows, cols, generator=g, dtype=torch.float64)
    b[0, cols // 2] = float("nan")
    b[rows - 1, 0] = b[rows - 1, cols - 1]   # a tie
    n = cols if axis == 0 else rows
    outs = [torch.full((n,), 7.0, dtype=torch.float64) for _ in range(2)] + \
           [torch.full((rows, cols), 7.0, dtype=torch.float64) for _ in range(2)] + \
           [torch.full((n,), 7.0, dtype=torch.float64), torch.full((n,), -1, dtype=torch.int32),
            torch.full((n,), 7.0, dtype=torch.float64)]
    _kernel[(1,)](a, b, *outs, R=rows, C=cols, AXIS=axis)
    return outs


@pytest.mark.parametrize("rows,cols,axis", [(4, 8, 1), (8, 4, 0), (2, 16, 1), (16, 2, 0), (1, 32, 1)])
def test_tree_forms_give_the_element_loops_values(rows, cols, axis):
    assert interpreter_tree.install()
    before = dict(interpreter_tree.STATS)
    tree = _run(rows, cols, axis)
    # all four custom combines ran as trees, none fell back to the element loop
    assert interpreter_tree.STATS["tree"] - before["tree"] == 4 and interpreter_tree.STATS["loop"] == before["loop"]
    interpreter_tree.uninstall()
    try:
        loop = _run(rows, cols, axis)
    finally:
        assert interpreter_tree.install()
    for t, l in zip(tree, loop):
        assert not (t == 7.0).all()
        torch.testing.assert_close(t, l, rtol=1e-12, atol=1e-12, equal_nan=True)


def test_the_tree_calls_the_combine_log2_times():
    calls = {"n": 0}
    fn = _nanmax.fn

    def counted(x, y):
        calls["n"] += 1
        return fn(x, y)
    _nanmax.fn = counted
    try:
        _run(4, 32, 1)   # rows of 32 columns: 32 -> 16 -> 8 -> 4 -> 2 -> 1
    finally:
        _nanmax.fn = fn
    assert calls["n"] == 5   # (the element loop: 31 a row, 124)


@triton.jit
def _branchy_max(x, y):
    # Python control flow on a value: legal on a GPU (one element at a time), but a block
    # has no single truth value under the interpreter
    if x > y:
        return x
    return y


@triton.jit
def _branchy_kernel(x_ptr, out_ptr, C: tl.constexpr):
    c = tl.arange(0, C)
    tl.store(out_ptr, tl.reduce(tl.load(x_ptr + c), 0, _branchy_max))


def test_a_combine_with_control_flow_keeps_the_element_loop():
    x = torch.randn(16, dtype=torch.float64)
    out = torch.full((1,), 7.0, dtype=torch.float64)
    assert interpreter_tree.install()
    before = dict(interpreter_tree.STATS)
    _branchy_kernel[(1,)](x, out, C=16)
    assert interpreter_tree.STATS["loop"] == before["loop"] + 1 and interpreter_tree.STATS["tree"] == before["tree"]
    assert out.item() == x.max().item()


@pytest.mark.parametrize("op", ["amax", "argmax", "logcumsumexp"])
def test_stitched_kernels_take_the_tree(op):
    """The combines stitchml generates (a NaN-propagating max, an argmax, a log-add-exp
    scan) are found straight-line: each kernel's custom reduction runs as a tree."""
    from stitchml.testing import compare_with_eager
    f = {"amax": lambda t: t.amax(-1), "argmax": lambda t: t.argmax(-1),
         "logcumsumexp": lambda t: torch.logcumsumexp(t, -1)}[op]
    x = torch.randn(8, 64)
    x[2, 5] = float("nan")
    before = dict(interpreter_tree.STATS)
    compare_with_eager(f, [x], backward=False)
    assert interpreter_tree.STATS["tree"] > before["tree"] and interpreter_tree.STATS["loop"] == before["loop"]
