"""Triton helpers for the Bessel functions J0, J1, Y0, Y1, K0, K1 (plain and exponentially
scaled) and the Airy function Ai (issue 19: op_db ran them eagerly for "no lowering rule").

All work in float64 (the rules round the result once to its dtype) from the Chebyshev
tables of `special_fits.py` (fitted by `stitchml.tools.fit_special`), in two regions each:
- near zero, the functions are entire in y = x^2 once their logarithmic part is taken out
  analytically: Y0 = (2/pi) log(x) J0 + R(y), Y1 = (2/pi) (log(x) J1 - 1/x) + x R(y),
  K0 = -log(x) I0 + R(y), K1 = 1/x + x (log(x) I1/x + R(y)); Ai is entire in x;
- far from it, the amplitude/phase forms with smooth series in 1/x^2 (J, Y: Hankel's P and
  Q, |x| >= 8), 1/x (K, x >= 2) or 1/zeta (Ai, |x| >= 2, zeta = 2/3 |x|^(3/2)).
The oscillating factors are taken from cos and sin of x (or zeta) itself, never of x
minus a rounded multiple of pi/4.  Values at the domain's edges are eager's: J and Y are
NaN at +-inf, Y is -inf at 0 and NaN below it, K is inf at 0, NaN below it and 0 at +inf,
Ai is NaN at +-inf.
"""
from __future__ import annotations

from .special_fits import FITS

SQRT1_2 = 0.7071067811865476
TWO_OVER_PI = 0.6366197723675814
ZETA_AT_2 = 1.8856180831641267  # 2/3 * 2^(3/2): where Ai's far forms start


def _clenshaw(name: str, cs: tuple[float, ...]) -> str:
    """One helper `_fit_<name>(s)`: the series sum c_k T_k(s) by Clenshaw's recurrence."""
    lines = ["@triton.jit", f"def _fit_{name}(s):", "    s2 = s + s", "    b0 = s * 0.0", "    b1 = s * 0.0"]
    lines += [f"    b0, b1 = {c!r} + s2 * b0 - b1, b0" for c in reversed(cs[1:])]
    lines.append(f"    return {cs[0]!r} + s * b0 - b1")
    return "\n".join(lines) + "\n"


HELPERS = f'''
@triton.jit
def _bessel_jy(x, NU: tl.constexpr, Y: tl.constexpr):
    # J_nu(x) (Y = False) or Y_nu(x) (Y = True) for nu = 0, 1; x float64
    a = tl.abs(x)
    s = tl.minimum(a * a * 0.03125 - 1.0, 1.0)  # y = x^2 over (0, 64]
    if NU == 0:
        jn = _fit_j0_small(s)
    else:
        jn = a * _fit_j1_small(s)
    if Y:
        if NU == 0:
            near = {TWO_OVER_PI} * tl.log(a) * jn + _fit_y0_small(s)
        else:
            near = {TWO_OVER_PI} * (tl.log(a) * jn - 1.0 / a) + a * _fit_y1_small(s)
    elif NU == 0:
        near = jn
    else:
        near = x * _fit_j1_small(s)  # odd, and -0.0 at -0.0 as eager
    z = tl.maximum(a, 8.0)
    u = 128.0 / (z * z) - 1.0  # t = 64 / x^2 over (0, 1]
    if NU == 0:
        p = _fit_p0_large(u)
        q = _fit_q0_large(u) / z
    else:
        p = _fit_p1_large(u)
        q = _fit_q1_large(u) / z
    c = tl.cos(z)
    sn = tl.sin(z)
    if NU == 0:  # chi = z - pi/4
        cc = (c + sn) * {SQRT1_2}
        sc = (sn - c) * {SQRT1_2}
    else:  # chi = z - 3 pi/4
        cc = (sn - c) * {SQRT1_2}
        sc = -(sn + c) * {SQRT1_2}
    amp = tl.sqrt({TWO_OVER_PI} / z)
    if Y:
        far = amp * (p * sc + q * cc)
    else:
        far = amp * (p * cc - q * sc)
        if NU == 1:
            far = tl.where(x < 0, -far, far)
    r = tl.where(a <= 8.0, near, far)
    if Y:
        r = tl.where(x == 0, float("-inf"), r)
        r = tl.where(x < 0, float("nan"), r)
    return tl.where(x != x, x, r)


@triton.jit
def _bessel_k(x, NU: tl.constexpr, SCALED: tl.constexpr):
    # K_nu(x), or e^x K_nu(x) (SCALED), for nu = 0, 1; x float64
    s = tl.minimum(x * x * 0.5 - 1.0, 1.0)  # y = x^2 over (0, 4]
    lg = tl.log(x)
    if NU == 0:
        near = _fit_k0_small(s) - lg * _fit_i0_small(s)
    else:
        near = 1.0 / x + x * (lg * _fit_i1_small(s) + _fit_k1_small(s))
    if SCALED:
        near = near * tl.exp(x)
    z = tl.maximum(x, 2.0)
    u = 4.0 / z - 1.0  # t = 2 / x over (0, 1]
    if NU == 0:
        far = tl.sqrt(1.5707963267948966 / z) * _fit_k0_large(u)
    else:
        far = tl.sqrt(1.5707963267948966 / z) * _fit_k1_large(u)
    if not SCALED:
        far = far * tl.exp(-z)
    r = tl.where(x <= 2.0, near, far)
    r = tl.where(x == 0, float("inf"), r)
    r = tl.where(x < 0, float("nan"), r)
    return tl.where(x != x, x, r)


@triton.jit
def _airy_ai(x):
    # Ai(x); x float64
    mid = _fit_ai_mid(tl.minimum(tl.maximum(x * 0.5, -1.0), 1.0))
    a = tl.maximum(tl.abs(x), 2.0)
    sq = tl.sqrt(a)
    zeta = a * sq * (2.0 / 3.0)
    u = {2 * ZETA_AT_2!r} / zeta - 1.0  # t = zeta(2) / zeta over (0, 1]
    q4 = tl.sqrt(sq)
    pos = tl.exp(-zeta) * _fit_ai_pos(u) / (3.5449077018110318 * q4)
    c = tl.cos(zeta)
    sn = tl.sin(zeta)
    sphi = (sn + c) * {SQRT1_2}  # phi = zeta + pi/4
    cphi = (c - sn) * {SQRT1_2}
    neg = (sphi * _fit_ai_neg_p(u) - cphi * _fit_ai_neg_q(u)) / (1.7724538509055159 * q4)
    r = tl.where(x > 2.0, pos, tl.where(x < -2.0, neg, mid))
    return tl.where((x != x) | (tl.abs(x) == float("inf")), float("nan"), r)
'''

SOURCE = "\n\n".join(_clenshaw(n, cs) for n, cs in FITS.items()) + "\n" + HELPERS

# pointwise op -> expression (the rules hand these float64 operands)
UNARY = {
    "bessel_j0": "_bessel_jy({0}, 0, False)", "bessel_j1": "_bessel_jy({0}, 1, False)",
    "bessel_y0": "_bessel_jy({0}, 0, True)", "bessel_y1": "_bessel_jy({0}, 1, True)",
    "bessel_k0": "_bessel_k({0}, 0, False)", "bessel_k1": "_bessel_k({0}, 1, False)",
    "bessel_k0e": "_bessel_k({0}, 0, True)", "bessel_k1e": "_bessel_k({0}, 1, True)",
    "airy_ai": "_airy_ai({0})",
}
