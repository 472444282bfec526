"""Element-wise ops that torch's decompositions (capture/decomp.py) leave as `prims`
calls, and the IEEE helpers behind them (issue 19, op_db coverage): signbit, copysign
(through prims), fmax/fmin, hypot, nextafter, round with decimals (prims.round), frexp,
erfc, erfcx, erfinv, ndtri (the normal quantile), the modified Bessel functions I0/I1, plain and exponentially scaled,
the Bessel functions J0/J1/Y0/Y1/K0/K1 and Airy's Ai (float64 Chebyshev forms), and
the Hurwitz zeta function (with polygamma of order >= 1 built on it), the regularised
incomplete gamma functions igamma/igammac, and the orthogonal polynomials of torch.special.
Each is built from element-wise nodes the code generator already knows, or from one
helper of `codegen/triton_ops.py` where a bit pattern or a series is needed.
"""
from __future__ import annotations

import math

import torch

from ..ir.nodes import Ref, compute_dtype
from .context import FLOAT_TYPES, LowerCtx
from .registry import Unsupported, register
from .rules_pointwise import _operands, _out, _unary, _where

aten = torch.ops.aten
prims = torch.ops.prims

# prims twins of element-wise ATen ops (copysign lands on abs, neg, signbit and where;
# round with decimals on prims.round)
for _op in ("abs", "neg", "round"):
    register(getattr(prims, _op).default)(_unary(_op))
register(prims.where.default)(_where)


@register(prims.signbit.default, aten.signbit.default)
def _signbit(ctx: LowerCtx, node, x):
    """The sign bit itself (bit pattern), so -0.0 and negative NaNs count as eager's do."""
    shape, dtype = _out(node)
    return ctx.pointwise("signbit", (x,), shape, dtype)


def _fminmax(op: str):
    def rule(ctx: LowerCtx, node, a, b):
        """fmax/fmin: a NaN operand yields the other one (maximum/minimum propagate it);
        between equal operands (+0.0 and -0.0) the first, as eager's std::fmax/fmin."""
        shape, dtype = _out(node)
        a, b = _operands(ctx, (a, b), shape, dtype)
        if dtype not in FLOAT_TYPES:
            return ctx.pointwise(op, (a, b), shape, dtype)
        first = ctx.pointwise("ge" if op == "maximum" else "le", (a, b), shape, torch.bool)
        m = ctx.pointwise("where", (first, a, b), shape, dtype)
        a_nan = ctx.pointwise("isnan", (a,), shape, torch.bool)
        b_nan = ctx.pointwise("isnan", (b,), shape, torch.bool)
        m = ctx.pointwise("where", (b_nan, a, m), shape, dtype)
        return ctx.pointwise("where", (a_nan, b, m), shape, dtype)
    return rule


register(prims.fmax.default, aten.fmax.default)(_fminmax("maximum"))
register(prims.fmin.default, aten.fmin.default)(_fminmax("minimum"))


@register(prims.hypot.default, aten.hypot.default)
def _hypot(ctx: LowerCtx, node, a, b):
    """m * sqrt(1 + (n / m)^2) with m = max(|a|, |b|), n = min: no overflow or underflow
    where sqrt(a^2 + b^2) would have one; an infinite operand gives inf even beside a NaN
    (C's hypot)."""
    shape, dtype = _out(node)
    cd = compute_dtype(dtype)
    a, b = (ctx.pointwise("abs", (v,), shape, cd) for v in _operands(ctx, (a, b), shape, cd))
    hi = ctx.pointwise("maximum", (a, b), shape, cd)
    lo = ctx.pointwise("minimum", (a, b), shape, cd)
    q = ctx.pointwise("truediv", (lo, hi), shape, cd)
    r = ctx.pointwise("mul", (hi, ctx.pointwise("sqrt", (ctx.pointwise(
        "add", (ctx.pointwise("mul", (q, q), shape, cd), 1.0), shape, cd),), shape, cd)), shape, cd)
    r = ctx.pointwise("where", (ctx.pointwise("eq", (hi, 0.0), shape, torch.bool), 0.0, r), shape, cd)
    inf = ctx.pointwise("logical_or", (ctx.pointwise("eq", (a, float("inf")), shape, torch.bool),
                                       ctx.pointwise("eq", (b, float("inf")), shape, torch.bool)), shape, torch.bool)
    r = ctx.pointwise("where", (inf, float("inf"), r), shape, cd)
    return ctx.cast(r, dtype)


@register(prims.nextafter.default, aten.nextafter.default)
def _nextafter(ctx: LowerCtx, node, a, b):
    """The neighbour of a towards b by one step of the result type's bit pattern: float32
    and float64 directly, bfloat16 on its float32 bits (one bfloat16 step is 2**16 there),
    float16 on its own 16 bits."""
    shape, dtype = _out(node)
    if dtype not in FLOAT_TYPES:
        raise Unsupported("nextafter of integers")
    a, b = _operands(ctx, (a, b), shape, dtype)
    return ctx.pointwise("nextafter", (a, b), shape, dtype)


def _series_form(op: str):
    def rule(ctx: LowerCtx, node, x):
        """A one-operand helper of codegen (a series or rational form), with a float32 body
        and a float64 branch of its own (more terms, or Newton steps in float64)."""
        shape, dtype = _out(node)
        if dtype not in FLOAT_TYPES:
            raise Unsupported(f"{op} of an integer tensor")
        return ctx.pointwise(op, (ctx.cast(x, dtype),), shape, dtype)
    return rule


# float64 branches: erfcx's Chebyshev form under erfc and erfcx, erfinv and ndtri refined by
# Newton steps in float64 (`_inv_erf`); the Bessel forms take more terms and switch later
register(prims.erfc.default, aten.erfc.default)(_series_form("erfc"))
register(prims.erf_inv.default, aten.erfinv.default)(_series_form("erfinv"))
register(prims.erfcx.default)(_series_form("erfcx"))
register(aten.special_ndtri.default)(_series_form("ndtri"))
register(prims.bessel_i0.default, aten.special_modified_bessel_i0.default)(_series_form("bessel_i0"))
register(prims.bessel_i1.default, aten.special_modified_bessel_i1.default)(_series_form("bessel_i1"))
register(prims.bessel_i0e.default)(_series_form("bessel_i0e"))
register(prims.bessel_i1e.default)(_series_form("bessel_i1e"))


def _float64_unary(op: str):
    def rule(ctx: LowerCtx, node, x):
        """A one-operand helper that works in float64 whatever the dtype (codegen
        `special_bessel`: Chebyshev tables fitted to float64), its result rounded once;
        integer inputs give the default float type as eager's do."""
        shape, dtype = _out(node)
        if dtype not in FLOAT_TYPES:
            raise Unsupported(f"{op} with a {dtype} result")
        r = ctx.pointwise(op, (ctx.cast(x, torch.float64),), shape, torch.float64)
        return ctx.cast(r, dtype)
    return rule


# Bessel J/Y/K and Airy Ai (codegen/special_bessel.py)
register(prims.bessel_j0.default, aten.special_bessel_j0.default)(_float64_unary("bessel_j0"))
register(prims.bessel_j1.default, aten.special_bessel_j1.default)(_float64_unary("bessel_j1"))
register(aten.special_bessel_y0.default)(_float64_unary("bessel_y0"))
register(aten.special_bessel_y1.default)(_float64_unary("bessel_y1"))
register(aten.special_modified_bessel_k0.default)(_float64_unary("bessel_k0"))
register(aten.special_modified_bessel_k1.default)(_float64_unary("bessel_k1"))
register(aten.special_scaled_modified_bessel_k0.default)(_float64_unary("bessel_k0e"))
register(aten.special_scaled_modified_bessel_k1.default)(_float64_unary("bessel_k1e"))
register(aten.special_airy_ai.default)(_float64_unary("airy_ai"))


@register(prims.scalar_tensor.default)
def _scalar_tensor(ctx: LowerCtx, node, value, **kwargs):
    """A 0-d constant (copysign's decomposition builds its zero with it)."""
    shape, dtype = _out(node)
    return ctx.full(shape, value, dtype)


@register(prims.frexp.default, aten.frexp.Tensor)
def _frexp(ctx: LowerCtx, node, x):
    """(mantissa, exponent) from the bit pattern (codegen `_frexp`); half types are exact
    in the float32 they are held in, so their mantissas round-trip."""
    shape, dtype = _out(node)
    if dtype not in FLOAT_TYPES:
        raise Unsupported("frexp of an integer tensor")
    return (ctx.pointwise("frexp_mantissa", (x,), shape, dtype),
            ctx.pointwise("frexp_exponent", (x,), shape, torch.int32))


@register(prims.spherical_bessel_j0.default, aten.special_spherical_bessel_j0.default)
def _spherical_bessel_j0(ctx: LowerCtx, node, x):
    """sin(x) / x; below |x| = 0.5 its Taylor series to x^8, in float64 to x^12 (the
    series to x^8 leaves 2e-11 at 0.5; sin(x) / x would lose nothing there either, but
    x = 0 must give 1); 0 at +-inf as eager."""
    shape, dtype = _out(node)
    if dtype not in FLOAT_TYPES:
        raise Unsupported("spherical_bessel_j0 of an integer tensor")
    cd = compute_dtype(dtype)
    x = ctx.cast(x, cd)

    def pw(op, *args, dt=cd):
        return ctx.pointwise(op, args, shape, dt)
    x2 = pw("mul", x, x)
    # Horner in x^2: 1 - x^2/3! + x^4/5! - ...
    coeffs = [1.0 / 362880.0, -1.0 / 5040.0, 1.0 / 120.0, -1.0 / 6.0, 1.0]
    if cd == torch.float64:
        coeffs = [1.0 / 6227020800.0, -1.0 / 39916800.0] + coeffs
    series = pw("add", pw("mul", x2, coeffs[0]), coeffs[1])
    for c in coeffs[2:]:
        series = pw("add", pw("mul", series, x2), c)
    ratio = pw("truediv", pw("sin", x), x)
    a = pw("abs", x)
    r = pw("where", pw("lt", a, 0.5, dt=torch.bool), series, ratio)
    r = pw("where", pw("eq", a, float("inf"), dt=torch.bool), 0.0, r)
    return ctx.cast(r, dtype)


@register(prims.zeta.default, aten.special_zeta.default, aten.special_zeta.self_scalar,
          aten.special_zeta.other_scalar)
def _zeta(ctx: LowerCtx, node, s, q):
    """Hurwitz zeta(s, q) (codegen `_zeta`): eager's values at s <= 1, at the poles
    q = 0, -1, .., for negative q; half types computed in float32 and rounded once."""
    return _float_binary(ctx, node, "zeta", s, q)


def _float_binary(ctx: LowerCtx, node, op: str, a, b, compute: torch.dtype | None = None) -> Ref:
    """A two-operand helper of codegen with a float result: operands in `compute` (default:
    the result's compute type), the result rounded once to its dtype."""
    shape, dtype = _out(node)
    if dtype not in FLOAT_TYPES:
        raise Unsupported(f"{op} of an integer tensor")
    cd = compute or compute_dtype(dtype)
    a, b = _operands(ctx, (a, b), shape, cd)
    return ctx.cast(ctx.pointwise(op, (a, b), shape, cd), dtype)


def _incomplete_gamma(op: str):
    def rule(ctx: LowerCtx, node, a, x):
        """Regularised incomplete gamma P(a, x) (`igamma`) or Q(a, x) (`igammac`), codegen
        `_igamma`: computed in float64 for every float type (the prefactor cancels ~a log a)
        and rounded once; eager's values at the edges of the domain."""
        return _float_binary(ctx, node, op, a, x, torch.float64)
    return rule


register(aten.igamma.default)(_incomplete_gamma("igamma"))
register(aten.igammac.default)(_incomplete_gamma("igammac"))


# torch.special's orthogonal polynomials → codegen `_ortho_poly` (eager's special points,
# closed forms and recurrences per family)
ORTHO_POLYS = {
    "chebyshev_polynomial_t": "cheb_t", "chebyshev_polynomial_u": "cheb_u", "chebyshev_polynomial_v": "cheb_v",
    "chebyshev_polynomial_w": "cheb_w", "shifted_chebyshev_polynomial_t": "scheb_t",
    "shifted_chebyshev_polynomial_u": "scheb_u", "shifted_chebyshev_polynomial_v": "scheb_v",
    "shifted_chebyshev_polynomial_w": "scheb_w", "hermite_polynomial_h": "hermite_h",
    "hermite_polynomial_he": "hermite_he", "laguerre_polynomial_l": "laguerre_l", "legendre_polynomial_p": "legendre_p",
}


def _ortho_poly(op: str):
    def rule(ctx: LowerCtx, node, x, n):
        """P_n(x) of one family: x and n in the result's compute type (n is truncated to
        an integer in the kernel, as eager casts it to int64)."""
        return _float_binary(ctx, node, op, x, n)
    return rule


for _name, _op in ORTHO_POLYS.items():
    _packet = getattr(aten, f"special_{_name}")
    register(_packet.default, _packet.x_scalar, _packet.n_scalar)(_ortho_poly(_op))


def polygamma_ge1(ctx: LowerCtx, node: torch.fx.Node, n: int, x: Ref) -> Ref:
    """polygamma(n, x) for n >= 1 as eager computes it: (-1)^(n+1) n! zeta(n + 1, x), and for
    n = 1 eager's trigamma (its reflection below 0: finite at the poles -1, -2, ..)."""
    shape, dtype = _out(node)
    if dtype not in FLOAT_TYPES:
        raise Unsupported("polygamma of an integer result")
    cd = compute_dtype(dtype)
    x = ctx.cast(x, cd)
    if n == 1:
        return ctx.cast(ctx.pointwise("trigamma", (x,), shape, cd), dtype)
    # n! overflows from n = 35 (float32), 171 (float64): inf, as eager's exp(lgamma(n + 1))
    fact = float(math.factorial(n)) if n <= 170 else math.inf
    fact = fact if fact <= torch.finfo(cd).max else math.inf
    z = ctx.pointwise("zeta", (float(n + 1), x), shape, cd)
    return ctx.cast(ctx.pointwise("mul", (z, fact if n % 2 else -fact), shape, cd), dtype)
