"""The regularised incomplete gamma functions igamma = P(a, x) and igammac = Q(a, x)
(`torch.special.gammainc`/`gammaincc`) stitch: codegen `_igamma` (series below x = a + 1,
Lentz's continued fraction above, in float64 for every float type), lower/rules_special.py.

Eager (SciPy's algorithm) switches to a uniform asymptotic expansion for large a near
x = a; the kernel iterates instead, so large a is checked here against eager directly.
The gradient with respect to x is autograd's formula (element-wise, stitched too); eager
has none with respect to a.  Also bicubic grid_sample's backward compiles for sm_90."""
import pytest
import torch

from stitchml import StitchBackend
from stitchml.testing import compare_with_eager
from launches import count_launches


def _log_uniform(lo, hi, *shape, dtype=torch.float64):
    return (10 ** torch.empty(*shape, dtype=torch.float64).uniform_(lo, hi)).to(dtype)


def _both(a, x):
    return torch.igamma(a, x) * 1.0, torch.special.gammaincc(a, x) + 0.0


def _no_fallbacks(backend):
    return not [f for r in backend.records for f in r.graph.fallbacks]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
def test_igamma_over_a_wide_range_matches_eager(dtype):
    """a and x log-uniform over 1e-3 .. 1e3 (both the series and the fraction, P and Q
    near 0 and near 1), a non-contiguous operand, broadcasting; one kernel for both."""
    a = _log_uniform(-3, 3, 64, 40, dtype=dtype).t()           # non-contiguous (40, 64)
    x = _log_uniform(-3, 3, 40, 64, dtype=dtype)
    row = _log_uniform(-1, 1, 64, dtype=dtype)                 # broadcast a
    with count_launches() as launches:
        # (float64: 1e-7, looser than TOL's; eager's own error in its asymptotic regime is
        # ~1e-9, see the mpmath test below)
        f64 = dtype == torch.float64
        cmp = compare_with_eager(lambda a, x, r: (*_both(a, x), torch.igammac(r, x)), [a, x, row],
                                 backward=False, rtol=1e-7 if f64 else None, atol=1e-9 if f64 else None)
    assert _no_fallbacks(cmp.backend)
    assert launches["n"] == 1


def _mp_reference(a, x):
    mpmath = pytest.importorskip("mpmath")
    with mpmath.workdps(40):
        return [torch.tensor([float(mpmath.gammainc(float(ai), 0, float(xi), regularized=True))
                              for ai, xi in zip(a, x)], dtype=torch.float64),
                torch.tensor([float(mpmath.gammainc(float(ai), float(xi), mpmath.inf, regularized=True))
                              for ai, xi in zip(a, x)], dtype=torch.float64)]


def _rel(got, ref):
    tiny = ref.abs() < 1e-290   # (subnormal results: relative error is meaningless)
    return ((got - ref).abs() / ref.abs()).masked_fill(tiny, 0).max().item()


def test_igamma_float64_is_at_least_as_accurate_as_eager():
    """Against a 40-digit reference (mpmath, installed with torch through sympy), over
    four fixed draws of 200 points (a, x in 1e-3 .. 1e3): the kernel's float64 relative
    error stays below 1e-12 everywhere (what is left is the prefactor x^a e^-x / Gamma(a)
    of P values ~1e-200 at a of a few hundred), and its worst over the draws is below
    eager's worst (eager reaches ~1e-9 near x = a at a of 20 .. 400)."""
    backend = StitchBackend()
    fn = torch.compile(lambda a, x: (torch.igamma(a, x) * 1.0, torch.igammac(a, x) * 1.0), backend=backend)
    worst, eager_worst = 0.0, 0.0
    for seed in range(4):
        g = torch.Generator().manual_seed(seed)
        a = 10 ** torch.empty(200, dtype=torch.float64).uniform_(-3, 3, generator=g)
        x = 10 ** torch.empty(200, dtype=torch.float64).uniform_(-3, 3, generator=g)
        ours = fn(a, x)
        eager = (torch.igamma(a, x), torch.igammac(a, x))
        for got, eag, ref in zip(ours, eager, _mp_reference(a, x)):
            err = _rel(got, ref)
            assert err < 1e-12, (seed, err)
            worst = max(worst, err)
            eager_worst = max(eager_worst, _rel(eag, ref))
    assert worst <= eager_worst, (worst, eager_worst)
    assert _no_fallbacks(backend)


def test_igammac_keeps_its_relative_precision_where_it_is_small():
    """Small a, x <= 1.1: Q(a, x) ~ a E1(x) is ~1e-4 while P is ~1 - 1e-4; Q taken as
    1 - P lost ~1e-11 relative (the lgamma near 1 behind P carries ~3e-15 absolute).
    Q is now summed directly (its own series, lgamma(1 + a) by its Taylor series):
    within 4x eager's error plus 1e-14 at every point."""
    g = torch.Generator().manual_seed(7)
    a = 10 ** torch.empty(300, dtype=torch.float64).uniform_(-3, 0, generator=g)
    x = 10 ** torch.empty(300, dtype=torch.float64).uniform_(-3, 0.04, generator=g)
    backend = StitchBackend()
    got = torch.compile(lambda a, x: torch.igammac(a, x) * 1.0, backend=backend)(a, x)
    ref = _mp_reference(a, x)[1]
    err = (got - ref).abs() / ref.abs()
    eager_err = (torch.igammac(a, x) - ref).abs() / ref.abs()
    assert bool((err <= 4 * eager_err + 1e-14).all()), (err.max().item(), eager_err.max().item())
    assert _no_fallbacks(backend)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_igamma_half_types_round_once(dtype):
    """Half types computed in float64 and rounded once: eager computes in float32 and
    rounds once, so the results agree to one rounding of the half type."""
    a, x = _log_uniform(-2, 2, 300, dtype=dtype), _log_uniform(-2, 2, 300, dtype=dtype)
    cmp = compare_with_eager(_both, [a, x], backward=False, rtol=1e-2, atol=1e-3)
    assert _no_fallbacks(cmp.backend)


def test_igamma_for_large_a_near_x_matches_eagers_asymptotic_expansion():
    """Eager's uniform asymptotic regime (a > 20 with |x - a| < 0.3 a, a > 200 with
    |x - a| < 4.5 sqrt(a)) and beyond it; the iteration runs to convergence (~12 sqrt(a)
    steps at a = 2e4: under the interpreter the test's time is that loop's)."""
    a = torch.cat([torch.full((50,), 25.0), torch.full((50,), 1e3), torch.full((50,), 2e4)]).double()
    spread = torch.cat([torch.full((50,), 0.25 * 25), torch.full((50,), 4.0 * 1e3 ** 0.5),
                        torch.full((50,), 4.0 * 2e4 ** 0.5)]).double()
    x = a + spread * (torch.rand(150, dtype=torch.float64) * 2 - 1)
    cmp = compare_with_eager(_both, [a, x], backward=False, rtol=1e-8, atol=1e-11)
    assert _no_fallbacks(cmp.backend)
    cmp = compare_with_eager(_both, [a.float(), x.float()], backward=False)
    assert _no_fallbacks(cmp.backend)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
def test_igamma_edges_are_eagers(dtype):
    """Every pair of special operands (negative, 0, tiny, 1, inf, NaN): the same values,
    NaN where eager has NaN."""
    vals = torch.tensor([-1.0, 0.0, 1e-30, 0.5, 1.0, 7.0, float("inf"), float("nan")], dtype=dtype)
    a = vals.repeat_interleave(len(vals))
    x = vals.repeat(len(vals))
    backend = StitchBackend()
    got = torch.compile(_both, backend=backend)(a, x)
    want = _both(a, x)
    for g, w in zip(got, want):
        assert torch.equal(g.isnan(), w.isnan()), torch.stack([a, x, g, w], 1)[g.isnan() != w.isnan()]
        torch.testing.assert_close(g, w, equal_nan=True, rtol=1e-6, atol=1e-12)
    assert _no_fallbacks(backend)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
def test_igamma_gradient_with_respect_to_x_is_stitched(dtype):
    """d/dx P(a, x) = x^(a-1) e^-x / Gamma(a) (and minus that for Q): forward and
    backward graphs without an eager op."""
    a = _log_uniform(-1, 1, 6, 7, dtype=dtype)
    x = _log_uniform(-1, 1, 7, 6, dtype=dtype).t().requires_grad_()
    cmp = compare_with_eager(lambda a, x: torch.igamma(a, x * 1.5) + torch.igammac(a, x).square(), [a, x])
    assert _no_fallbacks(cmp.backend)
    assert len(cmp.backend.records) == 2


AOT_SCRIPT = '''
import json, torch
import torch.nn.functional as F
from stitchml.tools.aot_check import check

def gammas(a32, x32, a64, x64, ah, xh):
    return (torch.igamma(a32, x32), torch.igammac(a64, x64), torch.igamma(ah, xh) + torch.igammac(ah, xh))

def bicubic(v, g):   # grid_sample bicubic backward (4x4 taps, padding-mapped)
    v, g = v.detach().requires_grad_(), g.detach().requires_grad_()
    out = F.grid_sample(v, g, mode="bicubic", padding_mode="reflection").sum()
    return torch.autograd.grad(out, [v, g])

out = {"gammas": check(gammas, torch.rand(40) * 9, torch.rand(40) * 9, torch.rand(40, dtype=torch.float64) * 9,
                       torch.rand(40, dtype=torch.float64) * 9, (torch.rand(40) * 9).bfloat16(),
                       (torch.rand(40) * 9).bfloat16()),
       "bicubic": check(bicubic, torch.randn(2, 3, 5, 6), torch.rand(2, 4, 5, 2) * 2.6 - 1.3)}
print(json.dumps({k: [r.__dict__ for r in v] for k, v in out.items()}))
'''


def test_igamma_and_bicubic_backward_compile_for_sm90():
    """The while loop of `_igamma` (a data-dependent trip count) and the bicubic backward's
    scatter-adds compile for an H100 ahead of time."""
    from test_aot_gpu import compiled_for_sm90
    results, kernels = compiled_for_sm90(AOT_SCRIPT)
    assert set(results) == {"gammas", "bicubic"}
    assert len(kernels) >= 3
