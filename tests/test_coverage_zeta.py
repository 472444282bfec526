"""polygamma(n, x) for n >= 1 and the Hurwitz zeta function stitch (codegen `_zeta_pos`,
`_zeta`, `_trigamma`; lower/rules_special.py): forward and backward, no op left eager.

Eager computes polygamma(n >= 2) as (-1)^(n+1) n! zeta(n + 1, x) and polygamma(1) by its
own trigamma (a reflection below 0 with sin(pi x) of the rounded product: finite values at
the poles -1, -2, ..); the kernels do the same.  zeta is a direct sum of a few terms and
the Euler-Maclaurin remainder, checked against a float64 run over a wide range of (s, q),
and against eager position by position at its special values (NaN and infinities where
eager has them).  Half types compute in float32 and round once."""
import math

import pytest
import torch

from stitchml import StitchBackend
from stitchml.fallback import NO_RULE
from stitchml.testing import compare_against_float64, compare_with_eager
from launches import count_launches

EPS32 = torch.finfo(torch.float32).eps
EPS64 = torch.finfo(torch.float64).eps


def _log_uniform(lo, hi, *shape, transposed=False):
    """10**U(lo, hi), fresh; transposed: a non-contiguous view of the transposed shape."""
    def make(dtype):
        if transposed:
            t = (10 ** torch.empty(*reversed(shape), dtype=torch.float64).uniform_(lo, hi)).to(dtype).t()
            assert not t.is_contiguous()
            return t
        return (10 ** torch.empty(*shape, dtype=torch.float64).uniform_(lo, hi)).to(dtype)
    return make


def _uniform(lo, hi, *shape):
    return lambda dtype: torch.empty(*shape, dtype=torch.float64).uniform_(lo, hi).to(dtype)


# name -> (function, input makers, differentiable: True, False or the inputs that are)
OPS = {
    **{f"polygamma_{n}": ((lambda n: lambda x: torch.polygamma(n, x))(n),
                          [_log_uniform(-1.5, 1.5, 7, 33, transposed=True)], True) for n in (1, 2, 3, 4)},
    # (no gradient with respect to s in torch: "the derivative for 'zeta' is not implemented")
    "zeta": (torch.special.zeta, [_uniform(1.2, 9.0, 7, 33), _log_uniform(-1, 1.5, 7, 33, transposed=True)], (1,)),
    "zeta_scalars": (lambda q: torch.special.zeta(3.0, q) - torch.special.zeta(q.detach() + 1.5, 2.5),
                     [_log_uniform(-1, 1.5, 5, 29)], True),
    # their backward graphs hold polygamma(1, x) and polygamma(2, x): eager before
    "digamma_lgamma": (lambda x: torch.digamma(x) * torch.lgamma(x) + torch.polygamma(1, x),
                       [_log_uniform(-1, 1.2, 7, 33, transposed=True)], True),
}
NO_HALF_IN_TORCH = {"zeta", "zeta_scalars"}  # eager's CPU zeta has no half-precision kernel
CASES = [pytest.param(name, dtype, id=f"{name}-{tag}") for name in sorted(OPS)
         for dtype, tag in ((torch.float32, "fp32"), (torch.bfloat16, "bf16"))
         if not (dtype == torch.bfloat16 and name in NO_HALF_IN_TORCH)]


def _fallbacks(backend):
    return [(f.op, f.reason) for r in backend.records if r.graph is not None for f in r.graph.fallbacks]


def _assert_all_stitched(cmp, launches):
    records = cmp.backend.records
    assert all(r.eager_reason is None for r in records), [r.eager_reason for r in records]
    eager = _fallbacks(cmp.backend)
    assert not [op for op, reason in eager if reason.startswith(NO_RULE)], eager  # (every overload has a rule)
    assert not eager, eager
    assert launches["n"] >= 1 and all(k >= 1 for k in cmp.launches_per_graph), cmp.launches_per_graph


@pytest.mark.parametrize("name,dtype", CASES)
def test_op_stitched_forward_and_backward(name, dtype):
    fn, makers, grad = OPS[name]
    inputs = [m(dtype) for m in makers]
    for i, x in enumerate(inputs):
        x.requires_grad_(grad is True or (grad is not False and i in grad))
    with count_launches() as launches:
        if dtype == torch.bfloat16:
            # bfloat16 judged against a float64 run: eager rounds its intermediates to
            # bfloat16 (digamma * lgamma), the kernel computes in float32 and rounds once
            cmp, judgement = compare_against_float64(fn, inputs)
            judgement.assert_ok(name)
        else:
            cmp = compare_with_eager(fn, inputs)
    assert [r.kind for r in cmp.backend.records] == ["forward", "backward"]
    _assert_all_stitched(cmp, launches)


def test_zeta_against_float64_over_a_wide_range():
    """s in [1.01, 60], q in [1e-3, 1e4] (log-uniform), float32 and float64, against
    torch's float64 zeta.  Bound: the powers are exp2(-s log2 x), whose relative error is
    that of their exponent, ~ |s ln q| units of roundoff: exactly the sensitivity of
    zeta(s, q) ~ q^-s to the last bit of s (|d ln zeta / d ln s| = s |ln q| where the first
    term dominates): within 4 (1 + s |ln q|) eps in float32, 6 in float64 (measured: 1.7-2.1
    and 2.8-3.5 over two grids; eager's float32, summed in double, is within 1 eps).  Results beyond
    float32's range overflow to inf and underflow below its normal range as the reference does."""
    gen = torch.Generator().manual_seed(11)
    n = 30000
    s = torch.cat([1.01 + 58.99 * torch.rand(n // 2, generator=gen, dtype=torch.float64),
                   1 + 10 ** (-2 + 3.78 * torch.rand(n // 2, generator=gen, dtype=torch.float64))])
    q = 10 ** (-3 + 7 * torch.rand(n, generator=gen, dtype=torch.float64))
    s = torch.cat([s, torch.tensor([1.01, 60.0, 1.01, 60.0, 2.0, 2.0], dtype=torch.float64)])
    q = torch.cat([q, torch.tensor([1e-3, 1e-3, 1e4, 1e4, 1e-3, 1e4], dtype=torch.float64)])
    for dtype, eps, tiny, big, factor in ((torch.float32, EPS32, 1.2e-38, 3.4e38, 4),
                                          (torch.float64, EPS64, 1e-300, 1e300, 6)):
        sd, qd = s.to(dtype), q.to(dtype)
        backend = StitchBackend()
        got = torch.compile(torch.special.zeta, backend=backend)(sd, qd).double()
        assert not _fallbacks(backend)
        ref = torch.special.zeta(sd.double(), qd.double())
        normal = (ref > tiny) & (ref < big)
        cond = 1 + sd.double() * qd.double().log().abs()
        rel = (got - ref).abs() / ref
        worst = (rel / cond)[normal].max().item() / eps
        assert worst < factor, (dtype, worst, rel[normal].max().item())
        if dtype == torch.float32:
            assert normal.sum() > 0.6 * len(s) and (ref >= big).any() and (ref <= tiny).any()
            assert got[ref >= big].isinf().all()
            assert (got[ref <= tiny] - ref[ref <= tiny]).abs().max() < 1e-43  # (subnormal results)


SPECIAL_S = [1.0, 0.5, 0.0, -1.0, -2.0, -math.inf, math.inf, math.nan, 1.0001, 1.5, 2.0, 3.0, 4.0, 2.5, 7.0, 60.0]
SPECIAL_Q = [0.0, -0.0, -1.0, -2.0, -7.0, -math.inf, math.inf, math.nan, -0.5, -1.3, -2.5, -5.7, -0.001, 0.5, 1.0,
             2.0, 1e-3, 1e4, 1e-30, 3e38, 1.5]


def _same_specials(got, want, rtol):
    """NaN where eager has NaN, the same infinity where it has one, finite where it is
    finite and then within rtol."""
    nan = got.isnan() == want.isnan()
    inf = (got.isinf() == want.isinf()) & (~want.isinf() | (got == want))
    fin = ~torch.isfinite(want) | torch.isclose(got, want, rtol=rtol, atol=0)
    return nan & inf & fin


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
def test_zeta_special_values_match_eager_position_by_position(dtype):
    """Every (s, q) pair of the lists: s = 1 (inf), s < 1 and -inf (NaN), s = inf (eager's
    inf below q = 1, 1 at 1, NaN above), NaN s; q = 0, -0, negative integers and -inf
    (inf), negative non-integers (NaN for non-integer s, the alternating sum for integer s),
    +inf and NaN (NaN), tiny q (overflow to inf), huge q (underflow); all in one kernel."""
    vals_s = torch.tensor(SPECIAL_S, dtype=dtype)
    vals_q = torch.tensor(SPECIAL_Q, dtype=dtype)
    s = vals_s.repeat_interleave(len(SPECIAL_Q))
    q = vals_q.repeat(len(SPECIAL_S))
    backend = StitchBackend()
    with count_launches() as launches:
        got = torch.compile(torch.special.zeta, backend=backend)(s, q)
    assert launches["n"] == 1 and not _fallbacks(backend)
    want = torch.special.zeta(s, q)
    # (float64: eager's alternating sum at odd s, negative q keeps its rounding, 4e-11 at
    # zeta(7, -2.5): the kernel's halves cancel exactly, leaving zeta(7, 3.5))
    ok = _same_specials(got, want, rtol=1e-5 if dtype == torch.float32 else 1e-9)
    assert ok.all(), list(zip(s[~ok].tolist(), q[~ok].tolist(), got[~ok].tolist(), want[~ok].tolist()))[:8]
    # the classes of the lists really occur: NaN, +inf, finite negative values
    assert want.isnan().sum() > 50 and (want == math.inf).sum() > 50 and (want < 0).any()


POLYGAMMA_X = [0.0, -0.0, -1.0, -2.0, -3.0, -7.0, -math.inf, math.inf, math.nan, -0.5, -1.3, -2.5, -5.7, -0.001, 1e-3,
               0.5, 1.0, 2.0, 1e4, 1e-30, 1e-19, -1e6 - 0.5, 3e38, -3e38, 1e-40, -7828795.5, -16777215.0, -1e20]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16],
                         ids=["fp32", "fp64", "bf16"])
def test_polygamma_special_values_match_eager_position_by_position(dtype):
    """polygamma(1..4) at the poles 0, -1, -2, .. (n >= 2: +-inf; n = 1: eager's trigamma is
    finite at the negative poles, pi^2 over the error of its rounded pi x squared, and
    inf at 0), at +-inf (n = 1: 0 and NaN; n >= 2: NaN and +-inf), NaN, tiny and huge x:
    NaN, infinities and finite values where eager has them, the four in one kernel.
    The negative half-integers -1e6 - 0.5 and -7828795.5 are left to the accuracy test
    below for n = 2, 4: there eager's sum of millions of alternating terms loses digits the
    kernel keeps (its halves cancel exactly)."""
    x = torch.tensor(POLYGAMMA_X, dtype=torch.float64).to(dtype)

    def fn(t):
        return [torch.polygamma(n, t) for n in (1, 2, 3, 4)]
    backend = StitchBackend()
    with count_launches() as launches:
        got = torch.compile(fn, backend=backend)(x)
    assert launches["n"] == 1 and not _fallbacks(backend)
    rtol = {torch.float32: 1e-4, torch.float64: 1e-9, torch.bfloat16: 1.6e-2}[dtype]
    far = (x.double() == -1e6 - 0.5) | (x.double() == -7828795.5)
    for n, g, e in zip((1, 2, 3, 4), got, fn(x)):
        ok = _same_specials(g.double(), e.double(), rtol) | (far & (n % 2 == 0))
        assert ok.all(), (n, x[~ok].tolist(), g[~ok].tolist(), e[~ok].tolist())
    assert torch.isfinite(got[0][x == -2.0]).all() and (got[1][x == -2.0] == -math.inf).all()


def test_negative_arguments_against_float64():
    """Random negative non-integer x (and q): polygamma(2..4, x), zeta(integer s, q).  The
    negative terms are summed by reflection, zeta(s, 1 - g) + (-1)^s (zeta(s, g) -
    zeta(s, 1 + |q|)), g = frac(|q|); for odd s the halves cancel near the function's
    zeros (in exact arithmetic too), so the error is bounded by the magnitudes summed,
    M = sum |q + k|^-s, times the powers' own error: within 4 (1 + s |ln min(g, 1 - g)|)
    eps M of float64 (measured: 1.0).  polygamma(1) follows eager's trigamma: eager's
    float32 value itself, also where eager's rounded pi x loses digits next to a pole."""
    gen = torch.Generator().manual_seed(5)
    x = -30 * torch.rand(6000, generator=gen)
    x = torch.cat([x[x != x.floor()], torch.tensor([-2.5, -0.5, -1e6 - 0.5, -3.25])])
    z = torch.special.zeta
    backend = StitchBackend()
    got = torch.compile(lambda t: [torch.polygamma(n, t) for n in (1, 2, 3, 4)]
                        + [z(torch.full_like(t, 3.0), t), z(torch.full_like(t, 6.0), t)], backend=backend)(x)
    assert not _fallbacks(backend)
    x64 = x.double()
    g = x64.abs() - x64.abs().floor()
    for i, (n, s) in enumerate([(2, 3.0), (3, 4.0), (4, 5.0), (0, 3.0), (0, 6.0)]):
        sv = torch.full_like(x64, s)
        ref = torch.polygamma(n, x64) if n else z(sv, x64)
        mag = math.factorial(n) * (z(sv, 1 - g) + z(sv, g) - z(sv, 1 + x64.abs()))
        bound = 4 * EPS32 * (1 + s * torch.minimum(g, 1 - g).log().abs()) * mag
        err = (got[i + 1].double() - ref).abs()
        assert (err <= bound).all(), (n, s, x[err > bound].tolist()[:5], (err / bound).max().item())
    # trigamma: eager's own float32 values (within 8 ulps: its sum for zeta(2, 1 - x) is another)
    torch.testing.assert_close(got[0], torch.polygamma(1, x), rtol=8 * EPS32, atol=0)
    # odd s at a negative half-integer: the terms of -q - j and q + j cancel in pairs, leaving
    # zeta(s, |q| + 1) exactly (eager's direct sum in double keeps only its rounding there)
    last = got[4][x == -1e6 - 0.5].double()
    exact = z(torch.tensor([3.0], dtype=torch.float64), torch.tensor([1e6 + 1.5], dtype=torch.float64))
    assert torch.allclose(last, exact, rtol=1e-5, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
def test_trigamma_matches_eager_at_negative_arguments_of_every_size(dtype):
    """Eager's trigamma below 0 is pi^2 / sin^2(PI x) - trigamma(1 - x) with PI x rounded:
    next to the poles, and wherever the rounded product nears a multiple of pi (large
    half-integers too), that value hangs on the product's rounding error.  The kernel
    reduces the rounded product exactly (its parts cancel there), so it lands on eager's
    value: within 8 float32 ulps, and 1e-9 in float64 (eager's own float64 trigamma sums a
    shorter series: 5e-11 off), from -1 to -2^24 and beyond (sin of the product itself)."""
    gen = torch.Generator().manual_seed(3)
    x = torch.cat([-30 * torch.rand(4000, generator=gen, dtype=torch.float64),
                   -(10 ** (7.2 * torch.rand(4000, generator=gen, dtype=torch.float64))),
                   -torch.arange(1, 2000, dtype=torch.float64),
                   -torch.arange(1, 3000, dtype=torch.float64) * 2801 - 0.5,
                   torch.tensor([-6733604.5, -7828795.5, -13591.9990234375, -8388607.0, -16777215.0, -16777216.0,
                                 -3e7, -1e20])]).to(dtype)
    backend = StitchBackend()
    got = torch.compile(lambda t: torch.polygamma(1, t), backend=backend)(x)
    assert not _fallbacks(backend)
    want = torch.polygamma(1, x)
    assert torch.isfinite(want).all()
    torch.testing.assert_close(got, want, rtol=8 * EPS32 if dtype == torch.float32 else 1e-9, atol=0)


def test_negative_arguments_in_a_few_blocks_only():
    """The reflection's two extra sums run only in blocks that hold a negative q: a long
    tensor with negative non-integers in some blocks and none in others."""
    q = torch.rand(9000) * 20 + 0.01
    q[[17, 4100, 8999]] = torch.tensor([-0.75, -12.5, -3.3])
    s = torch.full_like(q, 4.0)
    s[4100] = 3.0
    backend = StitchBackend()
    got = torch.compile(torch.special.zeta, backend=backend)(s, q)
    assert not _fallbacks(backend)
    torch.testing.assert_close(got, torch.special.zeta(s, q), rtol=2e-5, atol=0)


def test_polygamma_and_zeta_chain_into_one_kernel():
    """Element-wise through and through: one launch, nothing eager."""
    x = torch.cat([torch.rand(17, 29) * 6 - 1, torch.tensor([[0.0, -2.0, -2.5] + [1.5] * 26])])

    def fn(x):
        return torch.polygamma(1, x) * 2 + torch.special.zeta(x, 2)
    backend = StitchBackend()
    with count_launches() as launches:
        got = torch.compile(fn, backend=backend)(x)
    torch.testing.assert_close(got, fn(x), rtol=1e-5, atol=1e-5, equal_nan=True)
    assert launches["n"] == 1 and backend.records[0].plan.num_kernels == 1 and not _fallbacks(backend)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_half_precision_computes_in_float32_and_rounds_once(dtype):
    """A half-precision zeta (which eager's CPU kernel lacks) and polygamma: the float32
    kernel's result rounded once, bit for bit."""
    s = _uniform(1.1, 8.0, 5, 31)(torch.float64).to(dtype)
    q = _log_uniform(-1, 1.5, 5, 31)(torch.float64).to(dtype)

    def fn(s, q):
        return torch.special.zeta(s, q), torch.polygamma(3, q), torch.polygamma(1, -q)
    got = torch.compile(fn, backend=StitchBackend())(s, q)
    ref = torch.compile(fn, backend=StitchBackend())(s.float(), q.float())
    for g, r in zip(got, ref):
        assert g.dtype == dtype and torch.equal(g, r.to(dtype))


def test_large_orders_follow_eagers_overflowing_factorial():
    """n! overflows float32 from n = 35: eager's factor is inf, so its result is +-inf, or
    NaN where zeta(n + 1, x) underflows to 0."""
    x = torch.tensor([0.5, 1.0, 3.0, 50.0, 1e3])
    for n in (20, 34, 35, 40):
        got = torch.compile(lambda t: torch.polygamma(n, t), backend=StitchBackend())(x)
        assert _same_specials(got, torch.polygamma(n, x), rtol=1e-4).all(), (n, got, torch.polygamma(n, x))
        torch._dynamo.reset()


AOT_SCRIPT = '''
import json, torch
from stitchml.tools.aot_check import check

def fn(x, s, q):
    return torch.special.zeta(s, q) + torch.polygamma(1, x) + torch.polygamma(3, x)

out = {}
for dt in (torch.float32, torch.float64, torch.bfloat16):
    x, s, q = torch.randn(7, 33, dtype=dt), torch.rand(7, 33, dtype=dt) + 1, torch.randn(7, 33, dtype=dt)
    out[str(dt)] = check(fn, x, s, q)
print(json.dumps({k: [r.__dict__ for r in v] for k, v in out.items()}))
'''


def test_zeta_helpers_compile_for_sm90():
    """`_zeta` (its block-level branch for negative q included), `_zeta_pos` and
    `_trigamma` (an fma, constexpr dtype branches) compile ahead of time for an H100 in
    float32, float64 and bfloat16, in one kernel each, within 255 registers."""
    from test_aot_gpu import compiled_for_sm90
    results, kernels = compiled_for_sm90(AOT_SCRIPT)
    assert len(results) == 3 and all(len(rs) == 1 for rs in results.values()), results
