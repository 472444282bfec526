"""Integer floor division and remainder with Python's rounding (issue 18): from C's
truncating quotient q and remainder r (sign of the dividend), the floor quotient is
q - 1 and the remainder r + b where r != 0 and r, b differ in sign.  (Float
floor_divide keeps rules_pointwise's rule; float remainder is built the same way from
fmod.)  Division by zero is undefined in a kernel, where eager raises for integers.
Also gcd and lcm, which eager computes with the same C remainder (Euclid's algorithm)."""
from __future__ import annotations

import torch

from ..ir.nodes import Ref
from .context import FLOAT_TYPES, LowerCtx, static_shape
from .registry import RULES, Unsupported, register

aten = torch.ops.aten


def _operands(ctx: LowerCtx, a, b, shape, dtype):
    return tuple(ctx.broadcast_to(ctx.cast(v, dtype), shape) if not isinstance(v, (int, float, bool)) else v
                 for v in (a, b))


def _fix(ctx: LowerCtx, r, b, shape):
    """r != 0 and sign(r) != sign(b): where Python's rounding differs from C's."""
    rz = ctx.pointwise("ne", (r, 0), shape, torch.bool)
    rneg = ctx.pointwise("lt", (r, 0), shape, torch.bool)
    bneg = ctx.pointwise("lt", (b, 0), shape, torch.bool) if not isinstance(b, (int, float)) else b < 0
    differ = ctx.pointwise("ne", (rneg, bneg), shape, torch.bool) if not isinstance(bneg, bool) else (
        rneg if not bneg else ctx.pointwise("logical_not", (rneg,), shape, torch.bool))
    return ctx.pointwise("logical_and", (rz, differ), shape, torch.bool)


_float_floor_divide = {t: RULES[t] for t in (aten.floor_divide.default, aten.floor_divide.Scalar) if t in RULES}


def _floor_divide(ctx, node, a, b):
    val = node.meta["val"]
    if val.dtype in FLOAT_TYPES:
        rule = _float_floor_divide.get(node.target)
        if rule is None:
            raise Unsupported("floor_divide of floats has no rule")
        return rule(ctx, node, a, b)
    if val.dtype == torch.bool:
        raise Unsupported("floor_divide of bools")
    return floor_divide_ints(ctx, a, b, static_shape(val), val.dtype)


def floor_divide_ints(ctx: LowerCtx, a: Ref | int | float, b: Ref | int | float, shape: tuple[int, ...],
                      dtype: torch.dtype) -> Ref:
    """Python's floor quotient of integers (also div with rounding_mode='floor')."""
    a, b = _operands(ctx, a, b, shape, dtype)
    q = ctx.pointwise("tdiv", (a, b), shape, dtype)
    r = ctx.pointwise("fmod", (a, b), shape, dtype)
    return ctx.pointwise("sub", (q, ctx.cast(_fix(ctx, r, b, shape), dtype)), shape, dtype)


def _remainder(ctx, node, a, b):
    val = node.meta["val"]
    if val.dtype == torch.bool:
        raise Unsupported("remainder of bools")
    shape, dtype = static_shape(val), val.dtype
    a, b = _operands(ctx, a, b, shape, dtype)
    r = ctx.pointwise("fmod", (a, b), shape, dtype)
    return ctx.pointwise("where", (_fix(ctx, r, b, shape), ctx.pointwise("add", (r, b), shape, dtype), r),
                         shape, dtype)


register(aten.floor_divide.default, aten.floor_divide.Scalar)(_floor_divide)
register(aten.remainder.Tensor, aten.remainder.Scalar)(_remainder)


def _integer_result(node, op: str) -> tuple[tuple[int, ...], torch.dtype]:
    """Shape and dtype of an op that takes integers only (eager refuses the others)."""
    val = node.meta["val"]
    if val.dtype.is_floating_point or val.dtype.is_complex or val.dtype == torch.bool:
        raise Unsupported(f"{op} of {val.dtype}")
    return static_shape(val), val.dtype


def _gcd(ctx, node, a, b):
    """codegen's `_gcd`: Euclid's loop on |a|, |b|, as eager's; gcd(0, 0) is 0."""
    shape, dtype = _integer_result(node, "gcd")
    return ctx.pointwise("gcd", _operands(ctx, a, b, shape, dtype), shape, dtype)


def _lcm(ctx, node, a, b):
    """|a / gcd * b| (C's quotient, exact: gcd divides a), 0 where gcd is 0 (a and b
    both 0).  Eager's C code computes 8- and 16-bit values in int (the usual promotion),
    takes the absolute value there and wraps only when it stores: |200| stored in int8 is
    -56, not |(int8) 200| = 56; 32- and 64-bit products wrap before the absolute value."""
    shape, dtype = _integer_result(node, "lcm")
    a, b = _operands(ctx, a, b, shape, dtype)
    g = ctx.pointwise("gcd", (a, b), shape, dtype)
    wide = torch.int32 if torch.iinfo(dtype).bits < 32 else dtype
    zero = ctx.pointwise("eq", (g, 0), shape, torch.bool)
    g = ctx.cast(ctx.pointwise("where", (zero, 1, g), shape, dtype), wide)
    q = ctx.pointwise("tdiv", (ctx.cast(a, wide), g), shape, wide)
    r = ctx.pointwise("abs", (ctx.pointwise("mul", (q, ctx.cast(b, wide)), shape, wide),), shape, wide)
    return ctx.cast(ctx.pointwise("where", (zero, 0, r), shape, wide), dtype)


register(aten.gcd.default)(_gcd)
register(aten.lcm.default)(_lcm)
