"""torch.special's orthogonal polynomials stitch (codegen `_ortho_poly`, lower/rules_special.py
ORTHO_POLYS): Chebyshev T/U/V/W and their shifted forms, Hermite H/He, Laguerre L, Legendre P.

Eager evaluates each by its own special points, closed forms (Chebyshev, |y| < 1 past a
degree) and three-term recurrence; the kernel does the same steps in the same order, so
float64 agrees with eager to rounding and float32 to eager's own tolerance at the degrees
op_db draws.  At high degrees both lose digits in float32 (n times the rounding of acos
and of n * acos), so there the judge is a float64 run.  Not compared: NaN x at degree >= 2,
where eager's CPU kernel returns an uninitialised value for U/V/W/L/P (we return NaN)."""
import pytest
import torch

from stitchml import StitchBackend
from stitchml.testing import compare_against_float64, compare_with_eager
from launches import count_launches

NAMES = ["chebyshev_polynomial_t", "chebyshev_polynomial_u", "chebyshev_polynomial_v", "chebyshev_polynomial_w",
         "shifted_chebyshev_polynomial_t", "shifted_chebyshev_polynomial_u", "shifted_chebyshev_polynomial_v",
         "shifted_chebyshev_polynomial_w", "hermite_polynomial_h", "hermite_polynomial_he", "laguerre_polynomial_l",
         "legendre_polynomial_p"]
SPECIAL_X = [-1.0, 1.0, 0.0, 0.5, 2.0, -2.0, 0.25, 0.75]


def _points(dtype, n_lo, n_hi, count=120):
    """x uniform in [-2, 2] plus the families' special points (each at several degrees),
    n integers in [n_lo, n_hi] (some given with a fraction: eager truncates)."""
    xs = torch.cat([torch.rand(count, dtype=torch.float64) * 4 - 2,
                    torch.tensor(SPECIAL_X, dtype=torch.float64).repeat(4)])
    ns = torch.randint(n_lo, n_hi + 1, xs.shape).double()
    ns[: count // 4] += 0.7 * torch.sign(ns[: count // 4])
    return xs.to(dtype), ns.to(dtype)


def _no_fallbacks(backend):
    return not [f for r in backend.records for f in r.graph.fallbacks]


@pytest.mark.parametrize("name", NAMES)
def test_polynomial_float64_matches_eager(name):
    """Degrees -2 .. 20 (negative: 0), special points, truncated fractional degrees; a
    non-contiguous x."""
    fn = getattr(torch.special, name)
    x, n = _points(torch.float64, -2, 20)
    x = x.view(8, -1).t()
    cmp = compare_with_eager(lambda x, n: fn(x, n) * 1.0, [x, n.view(8, -1).t()], backward=False)
    assert _no_fallbacks(cmp.backend)
    assert cmp.num_kernels == 1


@pytest.mark.parametrize("name", NAMES)
def test_polynomial_float32_matches_eager_at_op_db_degrees(name):
    fn = getattr(torch.special, name)
    x, n = _points(torch.float32, -2, 9)
    cmp = compare_with_eager(lambda x, n: fn(x, n) + 0.0, [x, n], backward=False)
    assert _no_fallbacks(cmp.backend)


@pytest.mark.parametrize("name", ["chebyshev_polynomial_t", "chebyshev_polynomial_u", "shifted_chebyshev_polynomial_w",
                                  "legendre_polynomial_p", "laguerre_polynomial_l"])
def test_polynomial_float32_high_degree_is_as_close_to_float64_as_eager(name):
    """Degrees 20 .. 60 inside [-1, 1] (closed forms and long recurrences): stitch's
    error from a float64 run within the judge's allowance over eager's."""
    fn = getattr(torch.special, name)
    x = torch.rand(200) * 2 - 1
    n = torch.randint(20, 61, (200,)).float()
    _, verdict = compare_against_float64(lambda x, n: fn(x, n) * 1.0, [x, n], backward=False)
    verdict.assert_ok()


def test_scalar_degree_and_scalar_argument_overloads():
    """x_scalar and n_scalar overloads; several polynomials of one input are one kernel."""
    x = torch.rand(7, 9, dtype=torch.float64) * 2 - 1
    n = torch.randint(0, 12, (7, 9)).double()

    def f(x, n):
        return (torch.special.chebyshev_polynomial_t(x, 7), torch.special.legendre_polynomial_p(x, 3),
                torch.special.hermite_polynomial_he(0.3, n), torch.special.laguerre_polynomial_l(x, n))
    with count_launches() as launches:
        cmp = compare_with_eager(f, [x, n], backward=False)
    assert _no_fallbacks(cmp.backend)
    assert launches["n"] == 1


@pytest.mark.parametrize("dtype,limit", [(torch.float32, 128), (torch.float64, 512)])
def test_hermite_beyond_eagers_degree_limit_is_nan(dtype, limit):
    x = torch.rand(6, dtype=dtype) * 0.1
    n = torch.tensor([limit - 1, limit, limit + 1, limit + 50, 0, 1], dtype=dtype)
    backend = StitchBackend()
    for fn in (torch.special.hermite_polynomial_h, torch.special.hermite_polynomial_he):
        got = torch.compile(lambda x, n: fn(x, n) * 1.0, backend=backend)(x, n)
        want = fn(x, n)
        assert torch.equal(got.isnan(), want.isnan()) and got[2:4].isnan().all()
        torch.testing.assert_close(got, want, equal_nan=True, rtol=1e-4, atol=0)
        torch._dynamo.reset()
    assert _no_fallbacks(backend)


AOT_SCRIPT = '''
import json, torch
from stitchml.tools.aot_check import check

def polys(x, n, xd, nd):
    s = torch.special
    return (s.chebyshev_polynomial_t(x, n), s.shifted_chebyshev_polynomial_v(x, n), s.hermite_polynomial_h(x, n),
            s.laguerre_polynomial_l(xd, nd), s.legendre_polynomial_p(xd, nd), s.chebyshev_polynomial_w(xd, 12))

def bessel64(x):   # (the float64 branch of the Bessel form: 60 + 20 unrolled terms)
    return torch.i0(x) + torch.special.i1e(x)

out = {"polys": check(polys, torch.rand(40) * 2 - 1, torch.randint(0, 20, (40,)).float(),
                      torch.rand(40, dtype=torch.float64), torch.randint(0, 20, (40,)).double()),
       "bessel64": check(bessel64, torch.randn(40, dtype=torch.float64) * 30)}
print(json.dumps({k: [r.__dict__ for r in v] for k, v in out.items()}))
'''


def test_polynomials_compile_for_sm90():
    """The recurrence's while loop and the constexpr family branches (and the float64
    Bessel branch) compile for an H100."""
    from test_aot_gpu import compiled_for_sm90
    _, kernels = compiled_for_sm90(AOT_SCRIPT)
    assert {name for name, _ in kernels} == {"polys", "bessel64"}
