"""Complex numbers as pairs of reals (issue 19.4).

Kernels have no complex type, so a complex value is lowered as a real value with one
more trailing dim of size 2 (real part, imaginary part): exactly `view_as_real`'s
layout, so `view_as_complex` / `view_as_real` cost nothing.  In the lowering
environment such a value is a `Pair` (not a `Ref`), so no real rule can mistake it for
a real tensor: every FX node with a complex input or output comes here
(`lower.Lowerer._call`).  Rules: `view_as_complex`, `view_as_real`, `complex`,
`polar`, `real`/`imag`, `abs`, `angle` (complex64), `mul`, `add`, `sub`, `neg`, the
conjugate, copies, fills, the view ops, and what surrounds an FFT in its graphs: zero
padding and cropping (`constant_pad_nd`, `slice_backward`), `copy` into a new tensor,
`diagonal` and its backward.  This is what rotary embeddings written with complex
numbers (the original LLaMA code) use, forward and backward.

Where a complex value meets something without a rule (FFT: a library op), the value
becomes a genuine complex tensor again through an eager `view_as_complex` (a view, no
copy), and a complex tensor that a kernel reads (a graph input, an FFT's result) is
read through an eager `view_as_real`.  Those two conversions are not fallbacks: they
are views, recorded as eager steps without a reason.
"""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import torch

from ..ir import nodes as ir
from ..ir.nodes import Ref, prod
from .context import LowerCtx, static_shape
from .registry import Unsupported
from .rules_views import _concat

if TYPE_CHECKING:
    from .lower import Lowerer

aten = torch.ops.aten
prims = torch.ops.prims

REAL_OF = {torch.complex32: torch.float16, torch.complex64: torch.float32, torch.complex128: torch.float64}
COMPLEX_OF = {v: k for k, v in REAL_OF.items()}

# complex ops left to the library on purpose, with why
LIBRARY = ("_fft_", "fft_")
LIBRARY_REASON = "library op: FFTs are a vendor-library kernel (cuFFT), not a stitched kernel form"


class Pair:
    """A complex value held as a real tensor `ref` of shape (*shape, 2); `conj`: the
    value is the conjugate of that (applied lazily, where the parts are read, so that
    the negation is computed in the consumer's kernel at the consumer's shape)."""

    def __init__(self, ref: Ref, conj: bool = False):
        self.ref = ref
        self.conj = conj

    def __repr__(self) -> str:
        return f"Pair({self.ref}{', conj' if self.conj else ''})"


def involves_complex(node: torch.fx.Node) -> bool:
    """Whether an FX node reads or produces a complex tensor."""
    vals = [node.meta.get("val")] + [a.meta.get("val") for a in node.all_input_nodes]
    for v in vals:
        for t in (v if isinstance(v, (tuple, list)) else (v,)):
            if isinstance(t, torch.Tensor) and t.dtype.is_complex:
                return True
    return False


RULES: dict[Any, Any] = {}


def _register(*targets):
    def deco(fn):
        for t in targets:
            RULES[t] = fn
        return fn
    return deco


# -- conversions between pairs and complex tensors ----------------------------------------

def _eager_view(lw, op, src: Ref, shape, dtype, stride) -> Ref:
    """An eager view op (no reason: not a fallback) producing a new value."""
    g = lw.g
    nid = g.add(ir.OPAQUE, str(op), (src,), shape, dtype, stride,
                (("reason", ""), ("multi", False), ("fx_name", f"{op.__name__}_{src.id}")))
    g.eager_calls[nid] = (op, (src,), {})
    return Ref(nid)


def pair_of(lw: Lowerer, x: Any) -> Ref:
    """The real (…, 2) tensor of a complex operand: a Pair's own (its conjugate
    computed if it is a lazy one), or an eager `view_as_real` of a complex tensor
    (graph input, library op's result)."""
    if isinstance(x, Pair):
        if not x.conj:
            return x.ref
        ctx = lw.ctx
        shape = ctx.shape(x.ref)[:-1]
        re, im = _parts(lw, ctx, x, shape)
        return _pack(ctx, re, im, shape, ctx.dtype(x.ref)).ref
    if not isinstance(x, Ref):
        raise Unsupported(f"complex operand of type {type(x).__name__}")
    n = lw.g[x.id]
    if n.dtype not in REAL_OF:
        raise Unsupported(f"complex dtype {n.dtype} is not supported in kernels")
    seen = lw.__dict__.setdefault("_complex_as_real", {})  # one view per complex tensor
    if x.id in seen and seen[x.id] < len(lw.g.nodes):
        return Ref(seen[x.id])
    stride = None if n.stride is None else tuple(2 * s for s in n.stride) + (1,)
    out = _eager_view(lw, aten.view_as_real.default, x, n.shape + (2,), REAL_OF[n.dtype], stride)
    seen[x.id] = out.id
    return out


def laid_out(lw: Lowerer, z: Pair, val: torch.Tensor) -> Pair:
    """Pair `z` with its buffer in the layout eager gives the complex value `val`, as
    `view_as_real` of it sees it (strides doubled, the (re, im) dim last), where that
    layout is dense: a later graph (the backward reading a saved complex value, a polar
    of a transposed input) views it with those strides (fuzz seed 44635: a copy at every
    call, and a warning, where the buffer was contiguous).  A kernel's buffer takes the
    strides; a view or a value computed elsewhere is copied by a kernel into them."""
    from .lower import _dense
    p = pair_of(lw, z)
    n = lw.g[p.id]
    stride = tuple(2 * int(s) for s in val.stride()) + (1,)
    if n.shape is None or n.stride == stride or len(stride) != len(n.shape) or not _dense(n.shape, stride):
        return Pair(p)
    if n.kind in (ir.VIEW, ir.INPUT, ir.OPAQUE, ir.ITEM):
        p = lw.ctx.pointwise("identity", (p,), n.shape, n.dtype)
        n = lw.g[p.id]
    lw.g.nodes[p.id] = dataclasses.replace(n, stride=stride)
    return Pair(p)


def unpair_outputs(lw: Lowerer, outs: Any, fx_outs: Any) -> Any:
    """The graph's outputs with every Pair laid out as eager lays out its complex value
    (`laid_out`, from the output FX node's metadata) and turned into a complex tensor."""
    if isinstance(outs, (tuple, list)):
        outs = type(outs)(laid_out(lw, o, f.meta["val"]) if isinstance(o, Pair) and isinstance(f, torch.fx.Node)
                          and isinstance(f.meta.get("val"), torch.Tensor) else o for o, f in zip(outs, fx_outs))
    return unpair(lw, outs)


def unpair(lw: Lowerer, value: Any) -> Any:
    """`value` with every Pair turned into a complex tensor (an eager view_as_complex)."""
    if isinstance(value, Pair):
        ref = pair_of(lw, value)
        n = lw.g[ref.id]
        stride = None if n.stride is None else tuple(s // 2 for s in n.stride[:-1])
        return _eager_view(lw, aten.view_as_complex.default, ref, n.shape[:-1], COMPLEX_OF[n.dtype], stride)
    if isinstance(value, (tuple, list)):
        return type(value)(unpair(lw, v) for v in value)
    if isinstance(value, dict):
        return {k: unpair(lw, v) for k, v in value.items()}
    return value


def lower(lw: Lowerer, node: torch.fx.Node, args: tuple, kwargs: dict) -> Any:
    """Lower an FX node that reads or produces complex values (called by the Lowerer)."""
    rule = RULES.get(node.target)
    if rule is not None and getattr(node.target, "_schema", None) is not None and node.target._schema.is_mutable:
        rule, reason = None, "mutates its input"
    elif rule is None:
        from .lower import COMPUTE_INTENSIVE
        name = str(node.target)
        reason = LIBRARY_REASON if any(k in name for k in LIBRARY) else \
            "compute-intensive: vendor library" if node.target in COMPUTE_INTENSIVE else None
    if rule is not None:
        mark, calls = len(lw.g.nodes), dict(lw.g.eager_calls)
        try:
            out = rule(lw, lw.ctx, node, *args, **kwargs)
            from .lower import _empty_to_constants
            _empty_to_constants(lw.g, mark)
            return out
        except Unsupported as e:
            del lw.g.nodes[mark:]
            lw.g.eager_calls = calls
            seen = lw.__dict__.get("_complex_as_real", {})
            for k in [k for k, v in seen.items() if v >= mark]:
                del seen[k]
            reason = str(e)
    if reason is None:
        from ..fallback import no_rule_reason  # (raises under STITCHML_STRICT)
        reason = no_rule_reason(node.target) + " for complex values"
    return lw._opaque(node, unpair(lw, args), unpair(lw, kwargs), reason)


# -- helpers on pairs -----------------------------------------------------------------------

def _cshape(node) -> tuple[int, ...]:
    val = node.meta["val"]
    if val.dtype not in REAL_OF:
        raise Unsupported(f"complex dtype {val.dtype} is not supported in kernels")
    return static_shape(val)


def _parts(lw, ctx: LowerCtx, z: Any, shape) -> tuple[Ref, Ref]:
    """Real and imaginary parts of complex value `z`, broadcast to `shape` (then a lazy
    conjugate negated: at the consumer's shape, so it fuses into its kernel)."""
    p = z.ref if isinstance(z, Pair) else pair_of(lw, z)
    s = ctx.shape(p)[:-1]
    re = ctx.view("select", p, s, (("dim", len(s)), ("index", 0)))
    im = ctx.broadcast_to(ctx.view("select", p, s, (("dim", len(s)), ("index", 1))), shape)
    if isinstance(z, Pair) and z.conj:
        im = ctx.pointwise("neg", (im,), tuple(shape), ctx.dtype(p))
    return ctx.broadcast_to(re, shape), im


def _raw(lw, z: Any) -> tuple[Ref, bool]:
    """The pair tensor of `z` and whether `z` is its (lazy) conjugate: views commute
    with conjugation, so they carry the flag along."""
    return (z.ref, z.conj) if isinstance(z, Pair) else (pair_of(lw, z), False)


def _pack(ctx: LowerCtx, re, im, shape, rdtype) -> Pair:
    cols = []
    for v in (re, im):
        v = ctx.full(shape, v, rdtype) if not isinstance(v, Ref) else ctx.cast(v, rdtype)
        cols.append(ctx.reshape(v, tuple(shape) + (1,)))
    return Pair(_concat(ctx, cols, tuple(shape) + (2,), len(shape), rdtype))


def _operand(lw, ctx: LowerCtx, x: Any, shape, rdtype):
    """(re, im) of an operand of a complex op, at `shape`: a complex value, a real
    tensor (imaginary part 0) or a Python number."""
    if isinstance(x, Pair) or (isinstance(x, Ref) and ctx.dtype(x).is_complex):
        re, im = _parts(lw, ctx, x, shape)
        return ctx.cast(re, rdtype), ctx.cast(im, rdtype)
    if isinstance(x, Ref):
        return ctx.broadcast_to(ctx.cast(x, rdtype), shape), 0.0
    if isinstance(x, complex):
        return float(x.real), float(x.imag)
    if isinstance(x, (int, float, bool)):
        return float(x), 0.0
    raise Unsupported(f"complex operand of type {type(x).__name__}")


def _pw(ctx, op, a, b, shape, dtype):
    """a `op` b where either may be a Python number (folded when both are)."""
    if not isinstance(a, Ref) and not isinstance(b, Ref):
        return {"add": a + b, "sub": a - b, "mul": a * b}[op]
    if op == "mul" and (a == 0.0 or b == 0.0) and not (isinstance(a, Ref) and isinstance(b, Ref)):
        return 0.0
    if op in ("add", "sub") and not isinstance(b, Ref) and b == 0.0:
        return a
    if op == "add" and not isinstance(a, Ref) and a == 0.0:
        return b
    return ctx.pointwise(op, (a, b), shape, dtype)


# -- rules ------------------------------------------------------------------------------------

@_register(aten.view_as_complex.default)
def _view_as_complex(lw, ctx, node, x):
    _cshape(node)
    if ctx.node(x).kind != ir.VIEW and ctx.node(x).stride is not None and ctx.node(x).stride[-1] != 1:
        raise Unsupported("view_as_complex of a tensor whose last dim is not contiguous")
    return Pair(x)


@_register(aten.view_as_real.default)
def _view_as_real(lw, ctx, node, z):
    return pair_of(lw, z)


@_register(aten.complex.default)
def _complex(lw, ctx, node, re, im):
    shape = _cshape(node)
    rd = REAL_OF[node.meta["val"].dtype]
    return _pack(ctx, ctx.broadcast_to(ctx.cast(re, rd), shape), ctx.broadcast_to(ctx.cast(im, rd), shape),
                 shape, rd)


@_register(aten.polar.default)
def _polar(lw, ctx, node, r, theta):
    shape = _cshape(node)
    rd = REAL_OF[node.meta["val"].dtype]
    r, theta = (ctx.broadcast_to(ctx.cast(t, rd), shape) for t in (r, theta))
    re = ctx.pointwise("mul", (r, ctx.pointwise("cos", (theta,), shape, rd)), shape, rd)
    im = ctx.pointwise("mul", (r, ctx.pointwise("sin", (theta,), shape, rd)), shape, rd)
    return _pack(ctx, re, im, shape, rd)


@_register(aten.real.default, aten.imag.default)
def _real_imag(lw, ctx, node, z):
    p = pair_of(lw, z)  # (a lazy conjugate is computed: imag is a view of eager's result)
    s = ctx.shape(p)[:-1]
    return ctx.view("select", p, s, (("dim", len(s)), ("index", 0 if node.target is aten.real.default else 1)))


@_register(aten.abs.default)
def _abs(lw, ctx, node, z):
    """|z| = m * sqrt(1 + (n/m)^2) with m = max(|re|, |im|): no overflow or underflow
    of the squares (hypot), inf when either part is inf, nan otherwise with a nan."""
    val = node.meta["val"]
    shape, rd = static_shape(val), val.dtype
    re, im = _parts(lw, ctx, z, shape)
    are, aim = (ctx.pointwise("abs", (v,), shape, rd) for v in (re, im))
    m = ctx.pointwise("maximum", (are, aim), shape, rd)
    n = ctx.pointwise("minimum", (are, aim), shape, rd)
    q = ctx.pointwise("truediv", (n, m), shape, rd)
    q = ctx.pointwise("where", (ctx.pointwise("eq", (m, 0.0), shape, torch.bool), 0.0, q), shape, rd)
    h = ctx.pointwise("mul", (m, ctx.pointwise("sqrt", (ctx.pointwise("add", (ctx.pointwise(
        "mul", (q, q), shape, rd), 1.0), shape, rd),), shape, rd)), shape, rd)
    inf = ctx.pointwise("logical_or", (ctx.pointwise("eq", (are, float("inf")), shape, torch.bool),
                                       ctx.pointwise("eq", (aim, float("inf")), shape, torch.bool)), shape, torch.bool)
    return ctx.pointwise("where", (inf, float("inf"), h), shape, rd)


@_register(aten.angle.default)
def _angle(lw, ctx, node, z):
    val = node.meta["val"]
    shape, rd = static_shape(val), val.dtype
    if rd != torch.float32:
        raise Unsupported("angle of complex128: no float64-accurate atan2 kernel form (float32 only)")
    re, im = _parts(lw, ctx, z, shape)
    return ctx.pointwise("atan2", (im, re), shape, rd)


def _binary(lw, ctx, node, a, b, op, alpha=1):
    shape = _cshape(node)
    rd = REAL_OF[node.meta["val"].dtype]
    ar, ai = _operand(lw, ctx, a, shape, rd)
    br, bi = _operand(lw, ctx, b, shape, rd)
    if alpha != 1:
        if isinstance(alpha, complex):
            raise Unsupported("complex alpha")
        br, bi = _pw(ctx, "mul", br, float(alpha), shape, rd), _pw(ctx, "mul", bi, float(alpha), shape, rd)
    if op in ("add", "sub"):
        return _pack(ctx, _pw(ctx, op, ar, br, shape, rd), _pw(ctx, op, ai, bi, shape, rd), shape, rd)
    # (ar + i ai)(br + i bi) = (ar br - ai bi) + i (ar bi + ai br)
    re = _pw(ctx, "sub", _pw(ctx, "mul", ar, br, shape, rd), _pw(ctx, "mul", ai, bi, shape, rd), shape, rd)
    im = _pw(ctx, "add", _pw(ctx, "mul", ar, bi, shape, rd), _pw(ctx, "mul", ai, br, shape, rd), shape, rd)
    return _pack(ctx, re, im, shape, rd)


@_register(aten.mul.Tensor, aten.mul.Scalar)
def _mul(lw, ctx, node, a, b):
    return _binary(lw, ctx, node, a, b, "mul")


@_register(aten.add.Tensor, aten.add.Scalar)
def _add(lw, ctx, node, a, b, *, alpha=1):
    return _binary(lw, ctx, node, a, b, "add", alpha)


@_register(aten.sub.Tensor, aten.sub.Scalar)
def _sub(lw, ctx, node, a, b, *, alpha=1):
    return _binary(lw, ctx, node, a, b, "sub", alpha)


@_register(aten.neg.default)
def _neg(lw, ctx, node, z):
    return _binary(lw, ctx, node, 0.0, z, "sub")


@_register(aten._conj.default, aten.conj_physical.default, aten.conj.default, aten._conj_physical.default)
def _conj(lw, ctx, node, z):
    if isinstance(z, (int, float, complex)):  # the conjugate of a scalar factor (mul's backward)
        return complex(z).conjugate()
    _cshape(node)
    if isinstance(z, Pair):
        return Pair(z.ref, not z.conj)
    return Pair(pair_of(lw, z), True)


@_register(aten.clone.default, aten.resolve_conj.default, aten.resolve_neg.default, aten.alias.default,
           aten.detach.default, aten.lift_fresh_copy.default)
def _copy(lw, ctx, node, z, **kwargs):
    shape = _cshape(node)
    z = z if isinstance(z, Pair) else Pair(pair_of(lw, z))
    if all(u.op != "output" for u in node.users):
        return z  # a copy read only by kernels is the value itself (no buffer of its own)
    p = pair_of(lw, z)
    if node.target in (aten.alias.default, aten.detach.default, aten.resolve_conj.default,
                       aten.resolve_neg.default) or p is not z.ref:
        return Pair(p)
    return Pair(ctx.pointwise("identity", (p,), tuple(shape) + (2,), ctx.dtype(p)))


@_register(aten._to_copy.default, prims.convert_element_type.default)
def _to_copy(lw, ctx, node, x, *args, **kwargs):
    val = node.meta["val"]
    if not val.dtype.is_complex:
        raise Unsupported("complex to real conversion (drops the imaginary part) runs eagerly")
    if val.device != node.args[0].meta["val"].device:
        raise Unsupported("device transfer runs eagerly")
    shape = _cshape(node)
    rd = REAL_OF[val.dtype]
    re, im = _operand(lw, ctx, x, shape, rd)
    return _pack(ctx, re, im, shape, rd)

@_register(aten.div.Tensor, aten.div.Scalar)
def _div(lw, ctx, node, a, b):
    """Complex division by Smith's scaling (no overflow of |b|^2); by a real divisor,
    each part divided."""
    shape = _cshape(node)
    rd = REAL_OF[node.meta["val"].dtype]
    ar, ai = _operand(lw, ctx, a, shape, rd)
    br, bi = _operand(lw, ctx, b, shape, rd)
    ar, ai, br = (ctx.full(shape, v, rd) if not isinstance(v, Ref) else v for v in (ar, ai, br))
    if not isinstance(bi, Ref) and bi == 0.0:
        return _pack(ctx, ctx.pointwise("truediv", (ar, br), shape, rd),
                     ctx.pointwise("truediv", (ai, br), shape, rd), shape, rd)

    def pw(op, x, y):
        return ctx.pointwise(op, (x, y), shape, rd)
    wide = ctx.pointwise("ge", (ctx.pointwise("abs", (br,), shape, rd), ctx.pointwise("abs", (bi,), shape, rd)),
                         shape, torch.bool)
    # |br| >= |bi|: r = bi/br, d = br + bi r, ((ar + ai r) + i (ai - ar r)) / d
    r1 = pw("truediv", bi, br)
    d1 = pw("add", br, pw("mul", bi, r1))
    re1, im1 = pw("truediv", pw("add", ar, pw("mul", ai, r1)), d1), pw("truediv", pw("sub", ai, pw("mul", ar, r1)), d1)
    # else: r = br/bi, d = bi + br r, ((ar r + ai) + i (ai r - ar)) / d
    r2 = pw("truediv", br, bi)
    d2 = pw("add", bi, pw("mul", br, r2))
    re2, im2 = pw("truediv", pw("add", pw("mul", ar, r2), ai), d2), pw("truediv", pw("sub", pw("mul", ai, r2), ar), d2)
    return _pack(ctx, ctx.pointwise("where", (wide, re1, re2), shape, rd),
                 ctx.pointwise("where", (wide, im1, im2), shape, rd), shape, rd)


@_register(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
def _where(lw, ctx, node, c, a, b):
    shape = _cshape(node)
    rd = REAL_OF[node.meta["val"].dtype]
    c = ctx.broadcast_to(ctx.cast(c, torch.bool), shape)
    (ar, ai), (br, bi) = _operand(lw, ctx, a, shape, rd), _operand(lw, ctx, b, shape, rd)
    return _pack(ctx, ctx.pointwise("where", (c, ar, br), shape, rd), ctx.pointwise("where", (c, ai, bi), shape, rd),
                 shape, rd)


@_register(aten.scalar_tensor.default, aten.full.default, aten.zeros_like.default, aten.ones_like.default,
           aten.full_like.default, aten.zeros.default, aten.ones.default, aten.new_zeros.default,
           aten.new_ones.default, aten.new_full.default, aten.fill.Scalar)
def _full(lw, ctx, node, *args, **kwargs):
    t = node.target
    value = (args[0] if t is aten.scalar_tensor.default else
             args[1] if t in (aten.full.default, aten.full_like.default, aten.fill.Scalar) else
             args[2] if t is aten.new_full.default else
             1 if t in (aten.ones_like.default, aten.ones.default, aten.new_ones.default) else 0)
    if not isinstance(value, (int, float, complex, bool)):
        raise Unsupported("fill value is a tensor")
    val = node.meta["val"]
    if not val.dtype.is_complex:   # a real tensor shaped like a complex one (ones_like(z, dtype=float))
        if isinstance(value, complex):
            raise Unsupported("complex fill value of a real tensor")
        return ctx.full(static_shape(val), value, val.dtype)
    shape = _cshape(node)
    v = complex(value)
    return _pack(ctx, v.real, v.imag, shape, REAL_OF[val.dtype])


# view ops: the same view of the pair, with the trailing (re, im) dim carried along
@_register(aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.squeeze.dim,
           aten.squeeze.dims, aten.squeeze.default, aten.unsqueeze.default, aten.flatten.using_ints,
           aten.unflatten.int)
def _reshape(lw, ctx, node, z, *args, **kwargs):
    p, conj = _raw(lw, z)
    return Pair(ctx.reshape(p, _cshape(node) + (2,)), conj)


@_register(aten.expand.default)
def _expand(lw, ctx, node, z, *args, **kwargs):
    p, conj = _raw(lw, z)
    shape = _cshape(node)
    src = ctx.shape(p)[:-1]
    if len(src) < len(shape):
        p = ctx.reshape(p, (1,) * (len(shape) - len(src)) + src + (2,))
    return Pair(ctx.broadcast_to(p, shape + (2,)), conj)


@_register(aten.permute.default, aten.transpose.int, aten.t.default)
def _permute(lw, ctx, node, z, *args):
    p, conj = _raw(lw, z)
    nd = len(ctx.shape(p)) - 1
    if node.target is aten.permute.default:
        dims = tuple(d % nd for d in args[0])
    else:
        d0, d1 = args if args else (0, 1)
        dims = list(range(nd))
        if nd >= 2:
            dims[d0 % nd], dims[d1 % nd] = dims[d1 % nd], dims[d0 % nd]
        dims = tuple(dims)
    return Pair(ctx.view("permute", p, _cshape(node) + (2,), (("dims", dims + (nd,)),)), conj)


@_register(aten.slice.Tensor)
def _slice(lw, ctx, node, z, dim=0, start=None, end=None, step=1):
    p, conj = _raw(lw, z)
    s = ctx.shape(p)[:-1]
    dim %= len(s)
    start = 0 if start is None else start
    start = start + s[dim] if start < 0 else start
    start = min(max(start, 0), s[dim])
    return Pair(ctx.view("slice", p, _cshape(node) + (2,), (("dim", dim), ("start", start), ("step", step))), conj)


@_register(aten.select.int)
def _select(lw, ctx, node, z, dim, index):
    p, conj = _raw(lw, z)
    s = ctx.shape(p)[:-1]
    dim %= len(s)
    index = index + s[dim] if index < 0 else index
    return Pair(ctx.view("select", p, _cshape(node) + (2,), (("dim", dim), ("index", index))), conj)


# -- structural ops on pairs: the real rule's index maps with the (re, im) dim carried along

@_register(aten.copy.default)
def _copy_into(lw, ctx, node, dst, src, non_blocking=False):
    """copy(dst, src): src's value (a complex or real tensor, or a number) broadcast to
    dst's shape and converted to dst's complex dtype."""
    shape = _cshape(node)
    rd = REAL_OF[node.meta["val"].dtype]
    re, im = _operand(lw, ctx, src, shape, rd)
    return _pack(ctx, re, im, shape, rd)


@_register(aten.slice_backward.default)
def _slice_backward(lw, ctx, node, grad, input_sizes, dim, start, end, step):
    """The gradient padded with zeros to the input's size along `dim` (zeros are their
    own conjugate: the lazy flag carries over)."""
    from .rules_views import slice_backward_pad
    if step != 1:
        raise Unsupported("strided slice_backward of complex values")
    p, conj = _raw(lw, grad)
    return Pair(slice_backward_pad(ctx, p, _cshape(node), dim, start, ctx.dtype(p), trailing=(2,)), conj)


@_register(aten.select_backward.default)
def _select_backward(lw, ctx, node, grad, input_sizes, dim, index):
    """The gradient put at `index` of `dim` in zeros of the input's size (as slice_backward)."""
    from .rules_views import select_backward_pad
    p, conj = _raw(lw, grad)
    return Pair(select_backward_pad(ctx, p, _cshape(node), dim, index, ctx.dtype(p), trailing=(2,)), conj)


@_register(aten.constant_pad_nd.default)
def _constant_pad(lw, ctx, node, z, pad, value=0):
    """Zero padding (or cropping) of the complex dims: the real rule on the pair with the
    (re, im) dim left as it is (its pad amounts (0, 0) come first: pads run from the last
    dim backwards)."""
    from .rules_views import constant_pad
    if value != 0:
        raise Unsupported("constant_pad_nd of complex values with a nonzero pad value")
    _cshape(node)
    p, conj = _raw(lw, z)
    return Pair(constant_pad(ctx, p, (0, 0) + tuple(pad), 0, ctx.dtype(p)), conj)


def _pair_last(ctx, p: Ref, at: int) -> Ref:
    """`p` with its (re, im) dim, now at position `at`, moved back to the end."""
    shape = ctx.shape(p)
    nd = len(shape)
    if at == nd - 1:
        return p
    perm = tuple(i for i in range(nd) if i != at) + (at,)
    return ctx.view("permute", p, tuple(shape[i] for i in perm), (("dims", perm),))


@_register(aten.diagonal.default)
def _diagonal(lw, ctx, node, z, offset=0, dim1=0, dim2=1):
    """The real diagonal view of the pair (its (re, im) dim one of the batch dims, which
    the view puts first, in order), then that dim moved back to the end."""
    from .rules_views import diagonal_view
    shape = _cshape(node)
    p, conj = _raw(lw, z)
    nd = len(ctx.shape(p)) - 1
    d1, d2 = dim1 % nd, dim2 % nd
    out = diagonal_view(ctx, p, offset, d1, d2, tuple(shape[:-1]) + (2, shape[-1]))
    return Pair(_pair_last(ctx, out, len(shape) - 1), conj)


@_register(aten.diagonal_backward.default)
def _diagonal_backward(lw, ctx, node, grad, input_sizes, offset, dim1, dim2):
    """Zeros with the gradient on the diagonal: the real form per part, re and im packed."""
    from .rules_views import diag_embed_canonical, diag_perm
    shape = _cshape(node)
    rd = REAL_OF[node.meta["val"].dtype]
    nd = len(shape)
    d1, d2 = dim1 % nd, dim2 % nd
    perm = diag_perm(nd, d1, d2)
    gshape = ctx.shape(_raw(lw, grad)[0])[:-1]
    re, im = _parts(lw, ctx, grad, gshape)
    inv = tuple(perm.index(i) for i in range(nd))
    parts = []
    for v in (re, im):
        out = diag_embed_canonical(ctx, ctx.cast(v, rd), 0.0, shape[d1], shape[d2], offset, rd)
        parts.append(out if perm == tuple(range(nd)) else ctx.view("permute", out, shape, (("dims", inv),)))
    return _pack(ctx, parts[0], parts[1], shape, rd)


@_register(aten.diagonal_scatter.default)
def _diagonal_scatter(lw, ctx, node, x, src, offset=0, dim1=0, dim2=1):
    """`x` with `src` on its diagonal: the real rule per part (each part of `x` permuted
    to (*others, d1, d2), the part of `src` put on the diagonal, permuted back), packed."""
    from .rules_views import diag_embed_canonical, diag_perm
    shape = _cshape(node)
    rd = REAL_OF[node.meta["val"].dtype]
    nd = len(shape)
    d1, d2 = dim1 % nd, dim2 % nd
    perm = diag_perm(nd, d1, d2)
    cshape = tuple(shape[i] for i in perm)
    inv = tuple(perm.index(i) for i in range(nd))
    sshape = tuple(node.args[1].meta["val"].shape)
    parts = []
    for base, v in zip(_parts(lw, ctx, x, shape), _parts(lw, ctx, src, sshape)):
        base = ctx.cast(base, rd)
        if perm != tuple(range(nd)):
            base = ctx.view("permute", base, cshape, (("dims", perm),))
        out = diag_embed_canonical(ctx, ctx.cast(v, rd), base, shape[d1], shape[d2], offset, rd)
        parts.append(out if perm == tuple(range(nd)) else ctx.view("permute", out, shape, (("dims", inv),)))
    return _pack(ctx, parts[0], parts[1], shape, rd)


@_register(aten.sum.dim_IntList, aten.sum.default, aten.mean.dim, aten.mean.default)
def _sum(lw, ctx, node, z, dim=None, keepdim=False, *, dtype=None):
    """The sum (mean) of complex values: the real reduction of the pair over the same
    dims, its (re, im) dim kept (a conjugate's sum is the sum's conjugate: the lazy flag
    carries over).  The gradient of a complex product whose operand was broadcast sums
    over the broadcast dims (rotary angles of one position shared by a batch)."""
    shape = _cshape(node)
    rd = REAL_OF[node.meta["val"].dtype]
    p, conj = _raw(lw, z)
    nd = len(ctx.shape(p)) - 1
    dims = list(range(nd)) if dim is None or (isinstance(dim, (list, tuple)) and not dim) else \
        [d % max(nd, 1) for d in ([dim] if isinstance(dim, int) else dim)]
    if not dims:   # (a 0-d complex value: its sum is itself)
        return Pair(ctx.cast(p, rd), conj)
    out = ctx.reshape(ctx.reduce("sum", ctx.cast(p, rd), dims, keepdim, rd), shape + (2,))
    if node.target in (aten.mean.dim, aten.mean.default):
        out = ctx.pointwise("truediv", (out, float(prod(ctx.shape(p)[d] for d in dims))), shape + (2,), rd)
    return Pair(out, conj)
