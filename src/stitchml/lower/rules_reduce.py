"""Reductions: sum, mean, prod, amax, amin, argmax, argmin, max/min with indices."""
from __future__ import annotations

import torch

from ..ir.nodes import Ref, prod
from .context import FLOAT_TYPES, LowerCtx, static_shape
from .registry import Unsupported, register

aten = torch.ops.aten
prims = torch.ops.prims


def _dims(ctx, x, dim):
    nd = len(ctx.shape(x))
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return tuple(range(nd))
    if isinstance(dim, int):
        dim = (dim,)
    return tuple(d % max(nd, 1) for d in dim)


def _scalar_input(ctx, x, node):
    # reductions of 0-d tensors are identities in eager
    val = node.meta["val"]
    return ctx.pointwise("identity", (ctx.cast(x, val.dtype),), static_shape(val), val.dtype)


@register(aten.sum.dim_IntList, aten.sum.default, prims.sum.default)
def _sum(ctx: LowerCtx, node, x, dim=None, keepdim=False, *, dtype=None, output_dtype=None):
    out_dtype = node.meta["val"].dtype
    if not ctx.shape(x):
        return _scalar_input(ctx, x, node)
    dims = _dims(ctx, x, dim)
    repeated = _sum_of_repeats(ctx, node, x, dims, keepdim, out_dtype)
    if repeated is not None:
        return repeated
    return ctx.reduce("sum", ctx.cast(x, out_dtype), dims, keepdim, out_dtype)


def _sum_of_repeats(ctx: LowerCtx, node, x, dims: tuple[int, ...], keepdim: bool, out_dtype: torch.dtype):
    """A sum over dims along which its operand only repeats one value (an `expand` of
    size-1 dims: the backward of a sum or a mean, a layer norm's gradient summed over
    the row it was broadcast along) is that value times the count, rounded once.  It
    also keeps `N·dy − Σdy` in a layer norm's backward (torch's decomposition) exactly
    zero for such a gradient, where summing N copies rounded differently from the one
    product and left a per-row offset (fuzz seed 39721, reduced: a gradient that is 0
    in exact arithmetic was 6.1e-3 off, eager's 1.5e-4, now 1.4e-5).  None otherwise."""
    from ..ir import nodes as ir
    n = ctx.node(x)
    perms = []   # permutes between the expand and the sum (a `movedim`), outermost first
    while n.kind == ir.VIEW and n.op == "permute":
        perm = tuple(n.attr("dims"))
        perms.append(perm)
        dims = tuple(perm[d] for d in dims)
        x = Ref(n.refs[0])
        n = ctx.node(x)
    if n.kind != ir.VIEW or n.op != "expand" or out_dtype == torch.bool:
        return None
    src = Ref(n.refs[0])
    shape, src_shape = ctx.shape(x), ctx.shape(src)
    if len(src_shape) > len(shape):
        return None
    aligned = (1,) * (len(shape) - len(src_shape)) + tuple(src_shape)   # (expand aligns trailing dims)
    if any(aligned[d] != 1 for d in dims):
        return None
    count = prod(shape[d] for d in dims)
    if count == 0:   # (an empty sum is 0, and 0 · inf is not)
        return None
    kept = tuple(1 if d in dims else s for d, s in enumerate(shape))
    src = ctx.cast(src, out_dtype)
    if aligned != tuple(src_shape):
        src = ctx.reshape(src, aligned)
    scaled = ctx.pointwise("mul", (ctx.broadcast_to(src, kept), float(count) if out_dtype.is_floating_point
                                   else count), kept, out_dtype)
    for perm in reversed(perms):   # back to the sum's operand's dim order
        kept = tuple(kept[d] for d in perm)
        scaled = ctx.view("permute", scaled, kept, (("dims", perm),))
    return scaled if keepdim else ctx.reshape(scaled, static_shape(node.meta["val"]))


@register(aten.mean.dim, aten.mean.default)
def _mean(ctx, node, x, dim=None, keepdim=False, *, dtype=None):
    out_dtype = node.meta["val"].dtype
    if out_dtype not in FLOAT_TYPES:
        raise Unsupported("mean of an integer tensor")
    if not ctx.shape(x):
        return _scalar_input(ctx, x, node)
    dims = _dims(ctx, x, dim)
    n = prod(ctx.shape(x)[d] for d in dims)
    s = ctx.reduce("sum", ctx.cast(x, out_dtype), dims, keepdim, out_dtype)
    return ctx.pointwise("truediv", (s, float(n)), static_shape(node.meta["val"]), out_dtype)


@register(aten.prod.dim_int, aten.prod.default)
def _prod(ctx, node, x, dim=None, keepdim=False, *, dtype=None):
    out_dtype = node.meta["val"].dtype
    if not ctx.shape(x):
        return _scalar_input(ctx, x, node)
    return ctx.reduce("prod", ctx.cast(x, out_dtype), _dims(ctx, x, dim), keepdim, out_dtype)


def _minmax(op):
    def rule(ctx, node, x, dim=None, keepdim=False):
        out_dtype = node.meta["val"].dtype
        if not ctx.shape(x):
            return _scalar_input(ctx, x, node)
        if out_dtype == torch.bool:  # max of bools is any, min is all: reduced as int32 (issue 19)
            r = ctx.reduce(op, ctx.cast(x, torch.int32), _dims(ctx, x, dim), keepdim, torch.int32)
            return ctx.cast(r, torch.bool)
        return ctx.reduce(op, x, _dims(ctx, x, dim), keepdim, out_dtype)
    return rule


register(aten.amax.default, aten.max.default, prims.amax.default)(_minmax("amax"))
register(aten.amin.default, aten.min.default, prims.amin.default)(_minmax("amin"))


@register(aten.aminmax.default)
def _aminmax(ctx, node, x, *, dim=None, keepdim=False):
    """(amin, amax): two reductions of the same rows (issue 19)."""
    class _nth:  # one output of the node, as `_first` does for the first
        def __init__(self, i):
            self.meta, self.target = {"val": node.meta["val"][i]}, node.target
    return (_minmax("amin")(ctx, _nth(0), x, dim, keepdim), _minmax("amax")(ctx, _nth(1), x, dim, keepdim))


def _arg(op):
    def rule(ctx, node, x, dim=None, keepdim=False):
        if not ctx.shape(x):
            return ctx.full((), 0, torch.int64)
        if ctx.dtype(x) == torch.bool:  # (max.dim of bools: cumprod's gradient) True > False as int32
            x = ctx.cast(x, torch.int32)
        if dim is None:
            flat = ctx.reshape(x, (prod(ctx.shape(x)),))
            out = ctx.reduce(op, flat, (0,), False, torch.int64)
            return ctx.reshape(out, static_shape(node.meta["val"])) if keepdim else out
        return ctx.reduce(op, x, _dims(ctx, x, dim), keepdim, torch.int64)
    return rule


register(aten.argmax.default)(_arg("argmax"))
register(aten.argmin.default)(_arg("argmin"))


@register(aten.max.dim, aten.min.dim)
def _max_dim(ctx, node, x, dim, keepdim=False):
    if not ctx.shape(x):  # a 0-d tensor is its own maximum, at index 0
        return (ctx.pointwise("identity", (x,), (), ctx.dtype(x)), ctx.full((), 0, torch.int64))
    is_max = node.target is aten.max.dim
    vals = _minmax("amax" if is_max else "amin")(ctx, _first(node), x, dim, keepdim)
    idx = _arg("argmax" if is_max else "argmin")(ctx, node, x, dim, keepdim)
    return (vals, idx)


class _first:
    """Adapter presenting the first output of a multi-output node to a rule."""

    def __init__(self, node):
        self.meta = {"val": node.meta["val"][0]}
        self.target = node.target


def _logical(op: str):
    """all / any of a tensor: count the zero (non-zero) elements in int32 and compare
    (bool reductions have no combine of their own)."""
    def rule(ctx, node, x, dim=None, keepdim=False):
        shape = static_shape(node.meta["val"])
        if not ctx.shape(x):
            return ctx.pointwise("ne", (x, 0), shape, torch.bool)
        hit = ctx.pointwise("eq" if op == "all" else "ne", (x, 0), ctx.shape(x), torch.bool)
        count = ctx.reduce("sum", ctx.cast(hit, torch.int32), _dims(ctx, x, dim), keepdim, torch.int32)
        return ctx.pointwise("eq" if op == "all" else "gt", (count, 0), shape, torch.bool)
    return rule


register(aten.all.default, aten.all.dim, aten.all.dims)(_logical("all"))
register(aten.any.default, aten.any.dim, aten.any.dims)(_logical("any"))
