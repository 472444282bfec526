"""Lowering rules for element-wise ATen ops: arithmetic, comparisons, math, casts,
constructors.  Operands are cast to one compute dtype and broadcast to the output
shape here, so the code generator sees same-shaped, same-typed operands only.
"""
from __future__ import annotations

import torch

from ..ir import nodes as ir
from ..ir.nodes import Ref, compute_dtype, prod
from .context import FLOAT_TYPES, LowerCtx, static_shape
from .registry import Unsupported, register

aten = torch.ops.aten
prims = torch.ops.prims


def _out(node):
    """Shape and dtype of the node's (first) tensor output."""
    val = node.meta["val"]
    if isinstance(val, (tuple, list)):
        val = val[0]
    return static_shape(val), val.dtype


def _operands(ctx: LowerCtx, args, shape, dtype):
    out = []
    for a in args:
        if isinstance(a, Ref):
            a = ctx.broadcast_to(ctx.cast(a, dtype), shape)
        elif isinstance(a, complex):
            raise Unsupported("complex scalar")
        out.append(a)
    return tuple(out)


def _arith(op):
    def rule(ctx: LowerCtx, node, *args, **kwargs):
        shape, dtype = _out(node)
        return ctx.pointwise(op, _operands(ctx, args[:2], shape, dtype), shape, dtype)
    return rule


for _op, _targets in {
    "add": (aten.add.Tensor, aten.add.Scalar, prims.add.default),
    "sub": (aten.sub.Tensor, aten.sub.Scalar, prims.sub.default),
    "mul": (aten.mul.Tensor, aten.mul.Scalar, prims.mul.default),
    "maximum": (aten.maximum.default, prims.maximum.default),
    "minimum": (aten.minimum.default, prims.minimum.default),
    "bitwise_and": (aten.bitwise_and.Tensor, aten.bitwise_and.Scalar),
    "bitwise_or": (aten.bitwise_or.Tensor, aten.bitwise_or.Scalar),
    "bitwise_xor": (aten.bitwise_xor.Tensor, aten.bitwise_xor.Scalar),
}.items():
    register(*_targets)(_arith(_op))


@register(aten.add.Tensor, aten.sub.Tensor)
def _add_sub(ctx: LowerCtx, node, a, b, *, alpha=1):
    shape, dtype = _out(node)
    op = "add" if node.target is aten.add.Tensor else "sub"
    if dtype == torch.bool and op == "add":
        a, b = _operands(ctx, (a, b), shape, dtype)
        return ctx.pointwise("logical_or", (a, b), shape, dtype)
    a, b = _operands(ctx, (a, b), shape, dtype)
    if alpha != 1:
        b = ctx.pointwise("mul", (b, alpha), shape, dtype) if isinstance(b, Ref) else b * alpha
    if not isinstance(a, Ref) and not isinstance(b, Ref):
        raise Unsupported("scalar-only arithmetic")
    return ctx.pointwise(op, (a, b), shape, dtype)


@register(aten.rsub.Scalar, aten.rsub.Tensor)
def _rsub(ctx, node, a, b, *, alpha=1):
    shape, dtype = _out(node)
    a, b = _operands(ctx, (a, b), shape, dtype)
    if alpha != 1:
        a = ctx.pointwise("mul", (a, alpha), shape, dtype)
    return ctx.pointwise("sub", (b, a), shape, dtype)


@register(aten.div.Tensor, aten.div.Scalar, prims.div.default, aten.true_divide.Tensor, aten.true_divide.Scalar)
def _div(ctx, node, a, b):
    shape, dtype = _out(node)
    if dtype not in FLOAT_TYPES:   # prims.div of integers truncates (C's quotient: `//` in Triton)
        if dtype == torch.bool:
            raise Unsupported("division of bools")
        return ctx.pointwise("tdiv", _operands(ctx, (a, b), shape, dtype), shape, dtype)
    return ctx.pointwise("truediv", _operands(ctx, (a, b), shape, dtype), shape, dtype)


@register(aten.div.Tensor_mode, aten.div.Scalar_mode)
def _div_mode(ctx, node, a, b, *, rounding_mode=None):
    shape, dtype = _out(node)
    if rounding_mode is None:
        return _div(ctx, node, a, b)
    if dtype not in FLOAT_TYPES:
        # integers: C's truncating quotient, or Python's floor from it (rules_intdiv); a zero
        # divisor is undefined in a kernel, where eager raises
        if dtype == torch.bool or rounding_mode not in ("trunc", "floor"):
            raise Unsupported(f"division of {dtype} with rounding_mode={rounding_mode}")
        if rounding_mode == "floor":
            from .rules_intdiv import floor_divide_ints
            return floor_divide_ints(ctx, a, b, shape, dtype)
        return ctx.pointwise("tdiv", _operands(ctx, (a, b), shape, dtype), shape, dtype)
    ops = _operands(ctx, (a, b), shape, dtype)
    if rounding_mode == "floor":
        # not floor(a / b): the rounded quotient can be an integer above the true one
        return ctx.pointwise("floordiv", ops, shape, dtype)
    if rounding_mode != "trunc":
        raise Unsupported(f"rounding_mode={rounding_mode!r}")
    if dtype in (torch.float16, torch.bfloat16) and isinstance(b, Ref) and prod(ctx.shape(b)) > 1:
        # eager (CPU and CUDA) truncates a half-type quotient of two tensors after rounding it
        # to the half type; a scalar divisor (or a one-element tensor) is divided in float32
        q = ctx.pointwise("truediv", _operands(ctx, (a, b), shape, torch.float32), shape, torch.float32)
        return ctx.pointwise("trunc", (ctx.cast(q, dtype),), shape, dtype)
    q = ctx.pointwise("truediv", ops, shape, dtype)
    return ctx.pointwise("trunc", (q,), shape, dtype)


@register(aten.floor_divide.default, aten.floor_divide.Scalar)
def _floor_divide(ctx, node, a, b):
    return _div_mode(ctx, node, a, b, rounding_mode="floor")


def _compare(op):
    def rule(ctx: LowerCtx, node, a, b):
        shape, dtype = _out(node)
        ta = node.args[0].meta["val"]
        tb = node.args[1].meta["val"] if hasattr(node.args[1], "meta") else b
        common = torch.result_type(ta, tb)
        return ctx.pointwise(op, _operands(ctx, (a, b), shape, common), shape, dtype)
    return rule


for _op in ("eq", "ne", "lt", "le", "gt", "ge"):
    _packet = getattr(aten, _op)
    register(_packet.Tensor, _packet.Scalar)(_compare(_op))


def _logical(op):
    def rule(ctx, node, *args):
        shape, dtype = _out(node)
        ops = _operands(ctx, args, shape, torch.bool)
        out = ctx.pointwise(op, ops, shape, torch.bool)
        return ctx.cast(out, dtype)
    return rule


for _op in ("logical_and", "logical_or", "logical_xor", "logical_not"):
    register(getattr(aten, _op).default)(_logical(_op))

# unary math: computed in the output dtype (ints promote to float where eager does)
UNARY = {
    "exp": aten.exp, "exp2": aten.exp2, "log": aten.log, "log2": aten.log2, "log1p": aten.log1p,
    "expm1": aten.expm1, "sqrt": aten.sqrt, "rsqrt": aten.rsqrt, "sin": aten.sin, "cos": aten.cos,
    "tanh": aten.tanh, "sigmoid": aten.sigmoid, "erf": aten.erf, "abs": aten.abs, "neg": aten.neg,
    "reciprocal": aten.reciprocal, "floor": aten.floor, "ceil": aten.ceil, "round": aten.round,
    "trunc": aten.trunc, "sign": aten.sign, "bitwise_not": aten.bitwise_not, "relu": aten.relu,
    "isnan": aten.isnan, "isinf": aten.isinf, "lgamma": aten.lgamma, "digamma": aten.digamma,
    "asin": aten.asin, "acos": aten.acos, "atan": aten.atan, "asinh": aten.asinh, "acosh": aten.acosh,
    "atanh": aten.atanh, "sinh": aten.sinh, "cosh": aten.cosh, "tan": aten.tan, "log10": aten.log10,
}


def _unary(op):
    def rule(ctx, node, x, *rest, **kwargs):
        if rest or kwargs:
            raise Unsupported(f"{op} with extra arguments")
        shape, dtype = _out(node)
        if op in ("isnan", "isinf"):
            return ctx.pointwise(op, (x,), shape, dtype)
        if op == "bitwise_not" and dtype == torch.bool:
            return ctx.pointwise("logical_not", (x,), shape, dtype)
        if op in ("floor", "ceil", "round", "trunc") and dtype not in FLOAT_TYPES:
            return ctx.pointwise("identity", (x,), shape, dtype)
        if op in ("lgamma", "digamma") and dtype not in FLOAT_TYPES:
            raise Unsupported(f"{op} of an integer tensor")
        return ctx.pointwise(op, (ctx.cast(x, dtype),), shape, dtype)
    return rule


for _op, _packet in UNARY.items():
    register(_packet.default)(_unary(_op))


@register(aten.polygamma.default)
def _polygamma(ctx, node, n, x):
    if n < 0:
        raise Unsupported("polygamma of a negative order (eager raises)")
    if n >= 1:  # zeta-based (lower/rules_special.py; imported here: it imports this module)
        from .rules_special import polygamma_ge1
        return polygamma_ge1(ctx, node, int(n), x)
    return _unary("digamma")(ctx, node, x)


@register(aten.nan_to_num.default)
def _nan_to_num(ctx, node, x, nan=None, posinf=None, neginf=None):
    shape, dtype = _out(node)
    if dtype not in FLOAT_TYPES:
        return ctx.pointwise("identity", (x,), shape, dtype)
    info = torch.finfo(dtype)
    cd = compute_dtype(dtype)
    v = ctx.cast(x, cd)
    out = ctx.pointwise("where", (ctx.pointwise("isnan", (v,), shape, torch.bool), 0.0 if nan is None else nan, v),
                        shape, cd)
    out = ctx.pointwise("where", (ctx.pointwise("eq", (v, float("inf")), shape, torch.bool),
                                  info.max if posinf is None else posinf, out), shape, cd)
    out = ctx.pointwise("where", (ctx.pointwise("eq", (v, float("-inf")), shape, torch.bool),
                                  info.min if neginf is None else neginf, out), shape, cd)
    return ctx.cast(out, dtype)


register(aten.atan2.default)(_arith("atan2"))


@register(aten.fmod.Tensor, aten.fmod.Scalar)
def _fmod(ctx, node, a, b):
    """C fmod: the remainder of the truncated quotient, with the dividend's sign.  Integer
    division by zero raises in eager (CPU); a kernel cannot raise, so a zero divisor
    element gives 0 (a scalar zero divisor is refused: eager raises).  Divisors 0 and -1
    are replaced by 1 before the `%`, which the hardware leaves undefined for them
    (INT_MIN % -1 overflows) and whose result is 0 for -1."""
    shape, dtype = _out(node)
    if dtype == torch.bool:
        raise Unsupported("fmod of bools")
    a, b = _operands(ctx, (a, b), shape, dtype)
    if dtype in FLOAT_TYPES:
        return ctx.pointwise("fmod", (a, b), shape, dtype)
    if not isinstance(b, Ref):
        if b == 0:
            raise Unsupported("integer fmod by a zero scalar (eager raises ZeroDivisionError)")
        return ctx.pointwise("fmod", (a, 1 if b in (-1, 1) else int(b)), shape, dtype)
    bad = ctx.pointwise("eq", (b, 0), shape, torch.bool)
    if dtype.is_signed:
        bad = ctx.pointwise("logical_or", (bad, ctx.pointwise("eq", (b, -1), shape, torch.bool)), shape, torch.bool)
    return ctx.pointwise("fmod", (a, ctx.pointwise("where", (bad, 1, b), shape, dtype)), shape, dtype)


def _shift(left: bool):
    """Eager's shifts (CPU and CUDA): a count outside [0, bits) gives 0 for a left shift
    and the sign fill a >> (bits - 1) for a right shift (0 when unsigned); in range, the
    left shift wraps.  The kernel's raw shift only ever sees counts in range."""
    op = "lshift" if left else "rshift"

    def rule(ctx: LowerCtx, node, a, b):
        shape, dtype = _out(node)
        if dtype in FLOAT_TYPES or dtype == torch.bool:
            raise Unsupported(f"shift of {dtype}")
        bits = torch.iinfo(dtype).bits
        fill = bits - 1 if (not left and dtype.is_signed) else None  # right shift by >= bits, signed
        a, b = _operands(ctx, (a, b), shape, dtype)
        if not isinstance(b, Ref):
            if 0 <= b < bits:
                return ctx.pointwise(op, (a, int(b)), shape, dtype)
            if fill is not None:
                return ctx.pointwise(op, (a, fill), shape, dtype)
            return ctx.full(shape, 0, dtype)
        bad = ctx.pointwise("ge", (b, bits), shape, torch.bool)
        if dtype.is_signed:
            bad = ctx.pointwise("logical_or", (bad, ctx.pointwise("lt", (b, 0), shape, torch.bool)), shape, torch.bool)
        if fill is not None:
            return ctx.pointwise(op, (a, ctx.pointwise("where", (bad, fill, b), shape, dtype)), shape, dtype)
        out = ctx.pointwise(op, (a, ctx.pointwise("where", (bad, 0, b), shape, dtype)), shape, dtype)
        return ctx.pointwise("where", (bad, 0, out), shape, dtype)
    return rule


register(aten.bitwise_left_shift.Tensor, aten.bitwise_left_shift.Tensor_Scalar, aten.bitwise_left_shift.Scalar_Tensor,
         aten.__lshift__.Tensor, aten.__lshift__.Scalar)(_shift(True))
register(aten.bitwise_right_shift.Tensor, aten.bitwise_right_shift.Tensor_Scalar,
         aten.bitwise_right_shift.Scalar_Tensor, aten.__rshift__.Tensor, aten.__rshift__.Scalar)(_shift(False))


@register(aten.pow.Tensor_Scalar, aten.pow.Tensor_Tensor, aten.pow.Scalar)
def _pow(ctx, node, a, b):
    shape, dtype = _out(node)
    if dtype == torch.bool:
        raise Unsupported("pow of bools (eager has no kernel for them)")
    # (integers: codegen's square-and-multiply `_ipow`, eager's rules for negative exponents)
    return ctx.pointwise("pow", _operands(ctx, (a, b), shape, dtype), shape, dtype)


@register(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
def _where(ctx, node, c, a, b):
    shape, dtype = _out(node)
    c = ctx.broadcast_to(ctx.cast(c, torch.bool), shape)
    a, b = _operands(ctx, (a, b), shape, dtype)
    return ctx.pointwise("where", (c, a, b), shape, dtype)


@register(aten.clamp.default, aten.clamp.Tensor, aten.clamp_min.default, aten.clamp_max.default,
          aten.clamp_min.Tensor, aten.clamp_max.Tensor, aten.hardtanh.default)
def _clamp(ctx, node, x, lo=None, hi=None):
    shape, dtype = _out(node)
    if node.target in (aten.clamp_max.default, aten.clamp_max.Tensor):
        lo, hi = None, lo
    if node.target is aten.hardtanh.default:
        lo, hi = (-1.0 if lo is None else lo), (1.0 if hi is None else hi)
    (out,) = _operands(ctx, (x,), shape, dtype)
    if lo is not None:
        (lo,) = _operands(ctx, (lo,), shape, dtype)
        out = ctx.pointwise("clamp_min", (out, lo), shape, dtype)
    if hi is not None:
        (hi,) = _operands(ctx, (hi,), shape, dtype)
        out = ctx.pointwise("clamp_max", (out, hi), shape, dtype)
    return out


@register(prims.convert_element_type.default, aten._to_copy.default)
def _to_copy(ctx, node, x, dtype=None, *args, **kwargs):
    val = node.meta["val"]
    src = node.args[0].meta["val"]
    if val.device != src.device:
        raise Unsupported("device transfer runs eagerly")
    # (a memory_format is only the result's strides, which every node takes from eager's
    # metadata: a channels_last copy is an identity written in that layout)
    if val.dtype != src.dtype:
        return ctx.cast(x, val.dtype)
    return ctx.pointwise("identity", (x,), static_shape(val), val.dtype)


@register(aten.alias.default, aten.detach.default)
def _alias(ctx, node, x):
    # a view of the same memory: the value itself (an output of the graph is then the
    # very tensor, with its layout, e.g. the stride-0 dims of an expanded input)
    return x


@register(aten.clone.default, aten.lift_fresh_copy.default, aten.contiguous.default, prims.copy_strided.default)
def _clone(ctx, node, x, *args, memory_format=None):
    # (prims.copy_strided(x, stride): a copy with the given strides, from torch's references
    # of element-wise ops such as lerp in float16 over a transposed operand)
    # a copy is a new buffer: model it as an identity op so it materialises with eager's strides
    shape, dtype = _out(node)
    return ctx.pointwise("identity", (x,), shape, dtype)


@register(aten.full.default, aten.scalar_tensor.default, aten.zeros.default, aten.ones.default,
          aten.full_like.default, aten.zeros_like.default, aten.ones_like.default, aten.empty_like.default,
          aten.new_zeros.default, aten.new_ones.default, aten.new_full.default, aten.empty.memory_format,
          aten.new_empty.default, aten.empty_strided.default, aten.new_empty_strided.default, aten.zero.default)
def _full(ctx, node, *args, **kwargs):
    shape, dtype = _out(node)
    t = node.target
    if t in (aten.full.default,):
        value = args[1]
    elif t is aten.scalar_tensor.default:
        value = args[0]
    elif t is aten.full_like.default:
        value = args[1]
    elif t is aten.new_full.default:
        value = args[2]
    elif t in (aten.ones.default, aten.ones_like.default, aten.new_ones.default):
        value = 1
    else:
        value = 0  # (the empty constructors too: any content is theirs, zeros are the cheapest)
    if isinstance(value, Ref):
        raise Unsupported("fill value is a tensor")
    return ctx.full(shape, value, dtype)


@register(aten.arange.default, aten.arange.start, aten.arange.start_step)
def _arange(ctx, node, *args, **kwargs):
    """start + i * step from an index iota.  Integer results, and float results whose
    values are exact integers (so no rounding order can differ from eager's)."""
    shape, dtype = _out(node)
    nums = [a for a in args if not isinstance(a, torch.dtype)][:3]
    start, step = (0, 1) if len(nums) == 1 else (nums[0], nums[2] if len(nums) == 3 else 1)
    if any(isinstance(v, Ref) for v in (start, step)):
        raise Unsupported("arange bounds are tensors")
    exact = all(float(v).is_integer() for v in (start, step)) and abs(start) + abs(step) * shape[0] < 2 ** 24
    idx = Ref(ctx.g.add(ir.POINTWISE, "iota", (), shape, torch.int64, ir.contiguous_strides(shape), (("dim", 0),)))
    if dtype.is_floating_point and not exact:
        # fractional: start + i * step in float64, rounded once to the result type (eager
        # computes it in its accumulation type; the two agree to within one rounding)
        val = ctx.pointwise("mul", (ctx.cast(idx, torch.float64), float(step)), shape, torch.float64)
        return ctx.cast(ctx.pointwise("add", (val, float(start)), shape, torch.float64), dtype)
    val = idx
    if step != 1:
        val = ctx.pointwise("mul", (val, int(step)), shape, torch.int64)
    if start != 0:
        val = ctx.pointwise("add", (val, int(start)), shape, torch.int64)
    return ctx.cast(val, dtype)


@register(aten.tril_indices.default, aten.triu_indices.default)
def _triangle_indices(ctx, node, row, col, offset=0, **kwargs):
    """tril_indices / triu_indices: values that depend on their integer arguments alone,
    computed once here and held by the graph as a constant, which a kernel copies (each
    call returns a new tensor, as eager's does; a consumer reads the constant in its own
    kernel).  (Their closed form would invert triangular numbers through a square root.)"""
    val = node.meta["val"]
    if not all(type(v) is int for v in (row, col, offset)):
        raise Unsupported(f"{node.target.__name__.split('.')[0]} of symbolic sizes")
    fn = torch.tril_indices if node.target is aten.tril_indices.default else torch.triu_indices
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    with unset_fake_temporarily():   # (lowering runs under the capture's fake mode: a real tensor)
        value = fn(row, col, offset, dtype=val.dtype, device=val.device)
    shape = tuple(value.shape)
    nid = ctx.g.add(ir.INPUT, f"{fn.__name__}({row}, {col}, {offset})", (), shape, value.dtype,
                    tuple(int(s) for s in value.stride()), (("constant", True),))
    ctx.g.constants[nid] = value
    return ctx.pointwise("identity", (Ref(nid),), shape, value.dtype)


@register(aten.fill.Scalar, aten.fill.Tensor)
def _fill(ctx, node, x, value):
    """x's shape filled with a scalar, or with a 0-d tensor's value (Swin's attention
    mask is built with fill.Tensor) broadcast and cast to x's dtype."""
    shape, dtype = _out(node)
    if isinstance(value, Ref):
        if ctx.shape(value):
            raise Unsupported("fill with a tensor of more than one element")
        v = ctx.broadcast_to(ctx.reshape(ctx.cast(value, dtype), (1,) * len(shape)), shape) if shape else \
            ctx.cast(value, dtype)
        return ctx.pointwise("identity", (v,), shape, dtype)
    return ctx.full(shape, value, dtype)


@register(aten.native_dropout.default)
def _dropout(ctx, node, x, p, train):
    shape, dtype = _out(node)
    if not train or p == 0:
        return (ctx.pointwise("identity", (x,), shape, dtype), ctx.full(shape, True, torch.bool))
    if p >= 1:
        return (ctx.full(shape, 0, dtype), ctx.full(shape, False, torch.bool))
    from ..ir import nodes as ir
    u = Ref(ctx.g.add(ir.RAND, "uniform", (), shape, torch.float32, ir.contiguous_strides(shape)))
    keep = ctx.pointwise("lt", (u, 1.0 - p), shape, torch.bool)
    scaled = ctx.pointwise("mul", (x, 1.0 / (1.0 - p)), shape, dtype)
    out = ctx.pointwise("where", (keep, scaled, 0.0), shape, dtype)
    return (out, keep)


# -- backward of activations whose forward our decomposition table expands -------------
# (torch's references, computed in float32 for half types like `pw_cast_for_opmath`)

def _opmath(ctx: LowerCtx, node, *xs):
    """Output shape and dtype, the compute dtype, and `xs` cast/broadcast to it."""
    shape, dtype = _out(node)
    cdt = compute_dtype(dtype)
    if cdt not in FLOAT_TYPES:
        raise Unsupported("activation backward of a non-float tensor")
    return shape, dtype, cdt, _operands(ctx, xs, shape, cdt)


@register(aten.hardsigmoid_backward.default)
def _hardsigmoid_backward(ctx, node, grad, x):
    shape, dtype, cdt, (g, x) = _opmath(ctx, node, grad, x)
    inside = ctx.pointwise("logical_and", (ctx.pointwise("gt", (x, -3.0), shape, torch.bool),
                                           ctx.pointwise("lt", (x, 3.0), shape, torch.bool)), shape, torch.bool)
    out = ctx.pointwise("where", (inside, ctx.pointwise("mul", (g, 1.0 / 6.0), shape, cdt), 0.0), shape, cdt)
    return ctx.cast(out, dtype)


@register(aten.hardswish_backward.default)
def _hardswish_backward(ctx, node, grad, x):
    shape, dtype, cdt, (g, x) = _opmath(ctx, node, grad, x)
    slope = ctx.pointwise("add", (ctx.pointwise("truediv", (x, 3.0), shape, cdt), 0.5), shape, cdt)
    mid = ctx.pointwise("where", (ctx.pointwise("lt", (x, 3.0), shape, torch.bool),
                                  ctx.pointwise("mul", (g, slope), shape, cdt), g), shape, cdt)
    out = ctx.pointwise("where", (ctx.pointwise("le", (x, -3.0), shape, torch.bool), 0.0, mid), shape, cdt)
    return ctx.cast(out, dtype)


@register(aten.softplus_backward.default)
def _softplus_backward(ctx, node, grad, x, beta, threshold):
    shape, dtype, cdt, (g, x) = _opmath(ctx, node, grad, x)
    xb = ctx.pointwise("mul", (x, beta), shape, cdt)
    z = ctx.pointwise("exp", (xb,), shape, cdt)
    soft = ctx.pointwise("truediv", (ctx.pointwise("mul", (g, z), shape, cdt),
                                     ctx.pointwise("add", (z, 1.0), shape, cdt)), shape, cdt)
    out = ctx.pointwise("where", (ctx.pointwise("gt", (xb, threshold), shape, torch.bool), g, soft), shape, cdt)
    return ctx.cast(out, dtype)


@register(aten.mish_backward.default)
def _mish_backward(ctx, node, grad, x):
    shape, dtype, cdt, (g, x) = _opmath(ctx, node, grad, x)
    sp = ctx.pointwise("where", (ctx.pointwise("gt", (x, 20.0), shape, torch.bool), x,
                                 ctx.pointwise("log1p", (ctx.pointwise("exp", (x,), shape, cdt),), shape, cdt)),
                       shape, cdt)
    t = ctx.pointwise("tanh", (sp,), shape, cdt)
    s = ctx.pointwise("sigmoid", (x,), shape, cdt)
    one_m = ctx.pointwise("sub", (1.0, ctx.pointwise("mul", (t, t), shape, cdt)), shape, cdt)
    inner = ctx.pointwise("mul", (ctx.pointwise("mul", (x, s), shape, cdt), one_m), shape, cdt)
    out = ctx.pointwise("mul", (g, ctx.pointwise("add", (t, inner), shape, cdt)), shape, cdt)
    return ctx.cast(out, dtype)
