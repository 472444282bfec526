"""Issue 18: cumsum / cumprod / logcumsumexp / cummax / cummin as a scan kernel form (lower/rules_scan.py,
codegen/emit_scan.py), stitched with their neighbours.

Every case runs against eager on fresh random inputs (odd sizes, a non-contiguous
input), forward and backward, in float32 and bfloat16 (judged against a float64 run),
and in all three mappings of a scanned row: whole rows per program, packed rows, and
column blocks with a running carry (long rows; `loop_block_cols` made small so the
carry crosses many blocks).  Kernel counts are asserted: a scan and its element-wise
neighbours are one kernel, and a scan's gradient (flip, scan, flip) is one kernel too.
"""
import re

import pytest
import torch

from stitchml import StitchBackend, config
from stitchml.ir import nodes as ir
from stitchml.testing import compare_against_float64, compare_with_eager
from launches import count_launches
from seeds import stable_seed

OPS = {"cumsum": torch.cumsum, "cumprod": torch.cumprod, "logcumsumexp": torch.logcumsumexp}
# (shape, knobs): rows of 37 whole in one program (64 lanes, one row per block); 3 rows of 5 packed per program;
# rows of 301 walked in blocks of 16 columns (19 blocks, the last one partial)
FORMS = {
    "persistent": ((3, 37), {"block_elems": 64}),
    "packed": ((9, 5), {}),
    "looped": ((2, 301), {"persistent_max_cols": 64, "loop_block_cols": 16}),
}


def _input(shape, dtype, op):
    # transposed buffer: a non-contiguous input, seeded by the test's parameters; for
    # cumprod, values that the tests' `x * 1.5` brings near 1, so that a product over 301
    # columns stays finite (factors near 1.5 overflowed there, and whether a value near the
    # largest bfloat16 rounded to it or to inf decided a run: a flaky failure)
    g = torch.Generator().manual_seed(stable_seed(shape, str(dtype), op))
    t = torch.randn(shape[1], shape[0], dtype=torch.float64, generator=g).t()
    if op == "cumprod":
        t = (1 + 0.05 * t) / 1.5
    return t.to(dtype).requires_grad_()


def _sources(cmp):
    return "\n".join(k.source for r in cmp.backend.records for k in r.kernels.values())


def _forms(cmp, scans_only=False):
    return {k.mapping.form for r in cmp.backend.records for k in r.plan.kernels
            if not scans_only or any(r.plan.graph[m].kind == ir.SCAN for m in k.members)}


@pytest.mark.parametrize("form", sorted(FORMS))
@pytest.mark.parametrize("name", sorted(OPS))
def test_scan_forward_and_backward_match_eager_fp32(name, form):
    shape, knobs = FORMS[form]
    op = OPS[name]

    def f(x):
        return op(x * 1.5, 1) + 1
    x = _input(shape, torch.float32, name)
    with config.override(strict=True, **knobs), count_launches() as launches:
        cmp = compare_with_eager(f, [x], rtol=1e-4, atol=1e-4)
    assert [r.kind for r in cmp.backend.records] == ["forward", "backward"]
    # the scan, its producer and consumer: one kernel; its gradient (flip, scan, flip,
    # and for cumprod / logcumsumexp the element-wise work around them) too — except
    # cumprod's over long rows: its gradient reads one scan forwards and another one
    # backwards, and a column loop walks the row one way (the planner splits it)
    kernels = [len(r.plan.kernels) for r in cmp.backend.records]
    if (name, form) == ("cumprod", "looped"):
        assert kernels[0] == 1 and kernels[1] <= 5, kernels
    else:
        assert kernels == [1, 1], kernels
        assert launches["n"] == 2
    want = {"persistent": {"row_persistent"}, "packed": {"packed_rows"}, "looped": {"row_looped"}}[form]
    if (name, form) == ("cumprod", "looped"):
        # (its split gradient also sums over the few leading rows of a transposed value, twice,
        # one sum reading the other: with knob `chained_columns` on, a row kernel read transposed)
        assert _forms(cmp, scans_only=True) == want
    else:
        assert _forms(cmp) == want
    src = _sources(cmp)
    expr = {"cumsum": "tl.cumsum(", "cumprod": "tl.cumprod(", "logcumsumexp": "tl.associative_scan("}[name]
    assert expr in src
    if form == "looped":
        assert "carry" in src     # the running combination of earlier column blocks
    if form != "looped" and name == "cumsum":
        assert "reverse=True" in src  # the gradient reads the scan backwards: scanned in reverse


@pytest.mark.parametrize("form", sorted(FORMS))
@pytest.mark.parametrize("name", sorted(OPS))
def test_scan_bf16_is_as_close_to_float64_as_eager(name, form):
    shape, knobs = FORMS[form]
    op = OPS[name]

    def f(x):
        return op(x * 1.5, 1) + 1
    x = _input(shape, torch.bfloat16, name)
    with config.override(strict=True, **knobs):
        cmp, judgement = compare_against_float64(f, [x])
    judgement.assert_ok(name)
    assert [len(r.plan.kernels) for r in cmp.backend.records][0] == 1


def test_scan_along_a_leading_dim_and_into_a_reduction_is_one_kernel():
    """cumsum over dim 0 (the scanned dim is not the contiguous one) and a softmax over
    the scanned dim reading the scan: scan and reductions share one kernel."""
    def f(x):
        c = torch.cumsum(x, 0)
        return torch.softmax(c, 0), c.sum(0)
    x = _input((7, 5), torch.float32, "cumsum")
    with config.override(strict=True):
        cmp = compare_with_eager(f, [x], backward=False)
    assert cmp.num_kernels == 1


def test_scan_read_at_a_shifted_position_is_split_not_wrong():
    """A consumer reading the scan one column later (c[:, 1:] - c[:, :-1]) cannot be
    computed at the scan's own column: the planner's dry run keeps it in another kernel
    (which may still share the launch, behind a grid barrier)."""
    def f(x):
        c = torch.cumsum(x * 2, 1)
        return c[:, 1:] - c[:, :-1]
    x = torch.randn(4, 11)
    with config.override(strict=True):
        cmp = compare_with_eager(f, [x], backward=False)
    assert len(cmp.backend.records[0].plan.kernels) == 2
    torch.testing.assert_close(cmp.outputs, 2 * x[:, 1:], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("form", ["persistent", "looped"])
def test_integer_and_bool_scans_are_exact(form):
    shape, knobs = FORMS[form]

    def f(i, x):
        return torch.cumsum(i, 1), torch.cumsum(x > 0, 1), torch.cumprod(i % 3 - 1, 1), torch.cumsum(x, 1,
                                                                                                    dtype=torch.float64)
    i = torch.randint(-50, 50, shape, dtype=torch.int32)
    x = torch.randn(shape)
    with config.override(strict=True, **knobs):
        cmp = compare_with_eager(f, [i, x], backward=False, rtol=0, atol=0)
    assert [o.dtype for o in cmp.outputs] == [torch.int64, torch.int64, torch.int64, torch.float64]
    assert cmp.num_kernels == 1


@pytest.mark.parametrize("form", ["persistent", "looped"])
def test_logcumsumexp_special_values(form):
    """-inf prefixes stay -inf, +inf wins from its position on, NaN propagates from its
    position on, huge values do not overflow (max + log1p(exp(min - max)))."""
    shape, knobs = FORMS[form]
    x = torch.randn(shape) * 3
    x[0, :4] = float("-inf")
    x[0, 9] = float("inf")
    x[1, 5] = float("nan")
    x[1, 7:] += 1e30
    with config.override(strict=True, **knobs):
        cmp = compare_with_eager(lambda t: torch.logcumsumexp(t, 1), [x], backward=False)
    out = cmp.outputs
    assert torch.isneginf(out[0, :4]).all() and torch.isposinf(out[0, 9:]).all()
    assert torch.isnan(out[1, 5:]).all() and not torch.isnan(out[1, :5]).any()


def test_scan_under_changing_sizes_stitches_every_size():
    """Dynamic shapes: the scanned length changes between calls (positions from an
    attention mask's cumsum in a decoder); each size matches eager, nothing eager."""
    def f(m):
        # (a 1-d scan is one row: under dynamic shapes its row block still holds many
        # rows, and the scan must not widen the stored value past its pointer)
        return (torch.cumsum(m, 1) - 1) * m, torch.cumsum(m[0], 0)
    backend = StitchBackend()
    compiled = torch.compile(f, backend=backend, dynamic=True)
    with config.override(strict=True):
        for n in (7, 12, 33):
            m = (torch.rand(3, n) < 0.8).to(torch.int64)
            for got, want in zip(compiled(m), f(m)):
                torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert backend.records and all(r.eager_reason is None and not r.graph.fallbacks for r in backend.records)
    assert any(r.dynamic is not None for r in backend.records)



@pytest.mark.parametrize("form", sorted(FORMS))
@pytest.mark.parametrize("op", [torch.cummax, torch.cummin], ids=["cummax", "cummin"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_cummax_cummin_match_eager_exactly(op, form, dtype):
    """Values and indices, bit for bit (a selection: nothing is rounded), with ties
    (few distinct values: the later index wins) and NaN (it wins and stays, the later
    NaN's index from there on); the gradient (a scatter-add at the indices) is one
    kernel; values and indices come from one tuple scan."""
    shape, knobs = FORMS[form]
    x = torch.randint(-3, 4, shape).to(dtype)
    x[0, 2] = x[-1, shape[1] // 2] = float("nan")
    x[-1, -2] = float("nan")
    x = x.t().contiguous().t().requires_grad_()     # (non-contiguous: a transposed buffer)

    def f(t):
        v, i = op(t * 2, 1)
        return v, i
    with config.override(strict=True, **knobs):
        cmp = compare_with_eager(f, [x], rtol=0, atol=0)
    assert [len(r.plan.kernels) for r in cmp.backend.records][0] == 1
    src = _sources(cmp)
    # one scan for both outputs (a looped row with a column tail emits its body twice:
    # the whole column blocks, then the partial one)
    assert src.count("tl.associative_scan(") == max(1, src.count("for cbase in range(")), src
    if form == "looped":   # and one carried (value, index) pair shared by both outputs
        assert len(re.findall(r"carry\d+ = tl.full", src)) == 2, src


@pytest.mark.parametrize("form", ["persistent", "looped"])
def test_integer_and_bool_cummax(form):
    shape, knobs = FORMS[form]

    def f(i, x):
        return (*torch.cummax(i, 1), *torch.cummin(x > 0, 1))
    with config.override(strict=True, **knobs):
        cmp = compare_with_eager(f, [torch.randint(-4, 4, shape), torch.randn(shape)], backward=False, rtol=0, atol=0)
    assert [o.dtype for o in cmp.outputs] == [torch.int64, torch.int64, torch.bool, torch.int64]
    assert cmp.num_kernels == 1



@pytest.mark.parametrize("case", ["1d", "leading_dim", "bf16", "int", "prod", "masked_scatter"])
def test_few_long_rows_are_scanned_in_two_levels(case):
    """A scan with fewer rows than SPLIT_MAX_ROWS and rows longer than SPLIT_MIN_COLS
    (a flattened mask: masked_scatter) is split into chunks scanned in parallel, the
    chunk totals scanned, and each chunk combined with the totals before it — not
    walked by one program.  Odd lengths (a padded last chunk), forward and backward."""
    from stitchml.lower import rules_scan
    n = rules_scan.SPLIT_MIN_COLS + 1807
    backward = True
    if case == "1d":
        f, args = (lambda x: torch.cumsum(x * 2, 0)), [torch.randn(n, dtype=torch.float64)]
    elif case == "leading_dim":
        f, args = (lambda x: torch.cumsum(x, 0) + 1), [torch.randn(n, 3, dtype=torch.float64)]
    elif case == "bf16":
        # the chunk scans are kept in float32: the result is rounded to bfloat16 once, as
        # eager's is, so its error against float64 is eager's own (chunk scans stored in
        # bfloat16 measured 1.7x it; the float64 judge's floor is too wide to see that)
        x = torch.randn(n, dtype=torch.float64).to(torch.bfloat16)
        backend = StitchBackend()
        with config.override(strict=True):
            got = torch.compile(lambda t: torch.cumsum(t * 2, 0), backend=backend)(x).double()
        ref = torch.cumsum(x.double() * 2, 0)
        eager = torch.cumsum(x * 2, 0).double()
        assert (got - ref).norm() <= 1.1 * (eager - ref).norm() + 1e-6
        assert any(k.domain.cols == rules_scan.SPLIT_CHUNK for k in backend.records[0].plan.kernels)
        return
    elif case == "int":
        f, args, backward = (lambda i: torch.cumsum(i, 0)), [torch.randint(-9, 9, (n,))], False
    elif case == "prod":
        f, args = (lambda x: torch.cumprod(x, 0)), [1 + 1e-4 * torch.randn(n, dtype=torch.float64)]
        args[0][100] = 0.0                      # (a zero: the offsets are shifted, never divided)
    else:
        m = torch.rand(n) < 0.4
        f, args, backward = (lambda x, s, m: x.masked_scatter(m, s)), [torch.randn(n), torch.randn(n), m], False
    if backward:
        args = [a.requires_grad_() for a in args]
    with config.override(strict=True):
        # (float64 or integers: exact enough to compare sums of 10^4 terms at 1e-6; eager
        # accumulates float32 sums in float64 on the CPU, the bf16 case is judged above)
        cmp = compare_with_eager(f, args, backward=backward, rtol=1e-6, atol=1e-6)
    fwd = cmp.backend.records[0].plan
    assert any(k.domain.cols == rules_scan.SPLIT_CHUNK for k in fwd.kernels), [k.domain for k in fwd.kernels]
    assert len(fwd.kernels) <= 4


@pytest.mark.parametrize("op", ["cumsum", "cumprod", "cumsum_bf16", "cumsum_dim0"])
def test_two_level_scan_of_whole_chunks_reduces_then_scans(op):
    """Rows a whole number of chunks long: the chunk totals come from a reduction, and the
    last kernel scans each chunk again beside its offset (a per-row value of that kernel),
    so no chunk scan goes to memory: x is read twice, the result written once (bf16 at
    [64, 131072] on the H100: 100.8 -> 50.5 MB modelled, the floor 33.6)."""
    from stitchml.lower import rules_scan
    n = 4 * rules_scan.SPLIT_CHUNK * 4   # 16 chunks
    dtype = torch.bfloat16 if op == "cumsum_bf16" else torch.float64
    if op == "cumprod":
        x = 1 + 1e-3 * torch.randn(3, n, dtype=dtype)
        f = lambda t: torch.cumprod(t, 1)   # noqa: E731
    elif op == "cumsum_dim0":
        x = torch.randn(n, 2, dtype=dtype)
        f = lambda t: torch.cumsum(t, 0)   # noqa: E731
    else:
        x = torch.randn(3, n, dtype=torch.float64).to(dtype)
        f = lambda t: torch.cumsum(t * 2, 1)   # noqa: E731
    with config.override(strict=True):
        if dtype == torch.bfloat16:
            cmp, verdict = compare_against_float64(f, [x], backward=False)
            verdict.assert_ok(op)
        else:
            cmp = compare_with_eager(f, [x], backward=False, rtol=1e-9, atol=1e-9)
    plan = cmp.backend.records[0].plan
    g = plan.graph
    chunked = [k for k in plan.kernels if k.domain.cols == rules_scan.SPLIT_CHUNK]
    written = [o for k in plan.kernels for o in k.outputs if g[o].kind == "scan" and g[o].numel == x.numel()]
    if op == "cumsum_dim0":   # (scanned along a leading dim: the chunk scans go through memory)
        assert chunked and len(plan.kernels) <= 4
    else:
        assert len(chunked) == 2   # the totals' reduction, the final scan
        assert not written   # no chunk scan written


def test_full_size_long_row_cumsum_reads_twice_writes_once():
    from stitchml.bench.micro import cases
    from stitchml.plan.devices import get_device
    from stitchml.plan.options import PlanOptions
    from stitchml.tools import predict
    (spec,) = [s for s in cases(quick=False) if s.name == "cumsum_long_rows[64x131072]"]
    for dtype, bound in (("bf16", 1.55), ("fp32", 1.55)):
        pred = predict.predict_case(spec, dtype, PlanOptions.from_config(get_device("H100")))
        assert pred.modelled_bytes <= bound * pred.floor_bytes, (dtype, pred)


AOT_SCRIPT = '''
import json, torch
from stitchml import config
from stitchml.tools.aot_check import check

def scans(x):
    return (torch.cumsum(x, 1), torch.cumprod(x, 1), torch.logcumsumexp(x, 1), torch.cumsum(x.flip(1), 1).flip(1),
            *torch.cummax(x, 1), *torch.cummin(x * 2, 0))

def index_ops(x, m, s, i, v):
    return (x.masked_scatter(m, s), v.index_put((i,), v * 3, accumulate=True),
            x.scatter_reduce(0, i[:5, None].expand(5, 9) % 5, x * 2, "amin"),
            v.to(torch.int32).scatter_reduce(0, i[:, None].expand(6, 9), v.to(torch.int32), "amax"))

def more_ops(w, i, o, x, g, img):
    return (torch.nn.functional.embedding_bag(i, w, o, mode="mean"), torch.cdist(x, x * 2, p=1.5), torch.pdist(x),
            torch.nn.functional.grid_sample(img, g, padding_mode="reflection"))

def backward(img, g, w, x):   # the gradients, traced through autograd (joint graph)
    img, g, w, x = (t.detach().requires_grad_() for t in (img, g, w, x))
    nnf = torch.nn.functional
    out = (nnf.grid_sample(img, g).sum() + nnf.embedding_bag(torch.tensor([1, 2, 4, 5]), w, torch.tensor([0, 2]),
                                                              mode="mean").sum()
           + torch.cdist(x, x * 2, p=1.5).sum() + torch.pdist(x).sum() + torch.cumprod(x, 1).sum())
    return torch.autograd.grad(out, [img, g, w, x])

out = {}
for dt in (torch.float32, torch.bfloat16):
    out[f"scan {dt}"] = check(scans, torch.randn(7, 333, dtype=dt))
    with config.override(persistent_max_cols=64, loop_block_cols=64):
        out[f"looped {dt}"] = check(scans, torch.randn(7, 333, dtype=dt))
out["index"] = check(index_ops, torch.randn(5, 9), torch.rand(5, 9) < 0.5, torch.randn(50),
                     torch.randint(0, 6, (6,)), torch.randint(0, 9, (6, 9)))
out["more"] = check(more_ops, torch.randn(11, 5), torch.randint(0, 11, (13,)), torch.tensor([0, 4, 4, 9]),
                    torch.randn(7, 3), torch.rand(2, 4, 6, 2) * 2 - 1, torch.randn(2, 3, 5, 7))
out["backward"] = check(backward, torch.randn(2, 3, 5, 7), torch.rand(2, 4, 6, 2) * 2 - 1, torch.randn(11, 5),
                        torch.randn(7, 3))
import sys
sys.path.insert(0, "tests")
from test_scan import _row_invariant_scans
out["one row"] = check(_row_invariant_scans, torch.randn(2, 32, 32, dtype=torch.bfloat16))
print(json.dumps({k: [r.__dict__ for r in v] for k, v in out.items()}))
'''


def test_scan_and_index_kernels_compile_for_sm90():
    """The scan forms (persistent, reversed, looped with a carry, the logaddexp combine,
    cummax/cummin's tuple scan and tuple carry),
    the int64 atomics of integer accumulates and of scatter amax/amin keys, the kernels of masked_scatter,
    embedding_bag, cdist/pdist and grid_sample, forward and backward, compile for an
    H100 ahead of time."""
    from test_aot_gpu import compiled_for_sm90
    results, kernels = compiled_for_sm90(AOT_SCRIPT)
    assert len(kernels) >= 5 and set(results) == {"scan torch.float32", "scan torch.bfloat16", "looped torch.float32",
                                                  "looped torch.bfloat16", "index", "more",
                                                  "backward", "one row"}


def _row_invariant_scans(x):
    # along dim 1 of [2, 32, 32]: the scanned axis is not the innermost in memory (timm's
    # edgenext_xx_small scans positions this way; the form Triton 3.6 refused)
    pos = torch.ones_like(x).cumsum(1)                         # a constant's prefix sum (positions from ones)
    run = torch.cummax(torch.cos(pos), 1)                      # (value, index) pairs of a row-invariant value
    return x * pos + run.values + run.indices + torch.logcumsumexp(torch.sin(pos), 1)


def test_a_scan_of_one_row_in_a_taller_tile_is_scanned_over_the_whole_tile():
    """A scan whose operand does not vary along the rows of a multi-row tile is a [1, C]
    block: Triton 3.6 (torch 2.11's) asserted in its scan lowering on it (timm's
    edgenext_xx_small: every graph with such a scan ran eagerly on a GPU), so it is
    scanned over the whole [R, C] tile (`emit_scan._scan_axes`); results as eager's.  (This
    suite's Triton compiles either form for sm_90; Triton 3.6 refused the [1, C] one for
    each of these three scans and compiles the [R, C] one, checked by hand: hence the
    kernel text is asserted.)"""
    cmp = compare_with_eager(_row_invariant_scans, [torch.randn(2, 32, 32)], backward=False)
    assert _forms(cmp, scans_only=True) == {"packed_rows"}
    src = _sources(cmp)
    scanned = dict(re.findall(r"^\s*(\w+) = tl\.where\((.*?), \w+, .*\)$", src, re.M))
    lanes = re.findall(r"tl\.(?:cumsum|associative_scan)\(\(?(\w+)", src)
    assert len(lanes) >= 3, src                                         # cumsum, cummax's pairs, logaddexp
    assert all("rmask" in scanned[name] for name in lanes), (lanes, src)    # the whole tile's rows
