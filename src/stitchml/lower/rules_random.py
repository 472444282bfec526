"""Random numbers inside kernels: counter-based Philox keyed by the element's linear
index and a per-call seed drawn from torch's default generator, so `torch.manual_seed`
makes runs reproducible (not bit-equal to eager's own generator, which no compiler can
match).  Element i takes word i & 3 of the Philox block at i >> 2 (`codegen/triton_ops.py`:
`_rand4`, `_randn4`), so one Philox call serves four neighbouring elements."""
from __future__ import annotations

import torch

from ..ir import nodes as ir
from ..ir.nodes import Ref, contiguous_strides
from .context import FLOAT_TYPES, LowerCtx, static_shape
from .registry import Unsupported, register

aten = torch.ops.aten


def _random(ctx: LowerCtx, node, op: str) -> Ref:
    val = node.meta["val"]
    shape = static_shape(val)
    if val.dtype not in FLOAT_TYPES:
        raise Unsupported("random integers run eagerly")
    u = Ref(ctx.g.add(ir.RAND, op, (), shape, torch.float32, contiguous_strides(shape)))
    return ctx.cast(u, val.dtype)


@register(aten.rand.default, aten.rand_like.default)
def _rand(ctx, node, *args, generator=None, **kwargs):
    if generator is not None:
        raise Unsupported("an explicit torch.Generator runs eagerly")
    return _random(ctx, node, "uniform")


@register(aten.randn.default, aten.randn_like.default)
def _randn(ctx, node, *args, generator=None, **kwargs):
    if generator is not None:
        raise Unsupported("an explicit torch.Generator runs eagerly")
    return _random(ctx, node, "normal")


@register(aten.bernoulli.p)
def _bernoulli(ctx, node, x, p=0.5, *, generator=None):
    if generator is not None:
        raise Unsupported("an explicit torch.Generator runs eagerly")
    val = node.meta["val"]
    shape = static_shape(val)
    u = Ref(ctx.g.add(ir.RAND, "uniform", (), shape, torch.float32, contiguous_strides(shape)))
    hit = ctx.pointwise("lt", (u, float(p)), shape, torch.bool)
    return ctx.cast(hit, val.dtype)


@register(aten.bernoulli.default)
def _bernoulli_tensor(ctx, node, probs, *, generator=None):
    if generator is not None:
        raise Unsupported("an explicit torch.Generator runs eagerly")
    val = node.meta["val"]
    shape = static_shape(val)
    if val.dtype not in FLOAT_TYPES:
        raise Unsupported("bernoulli of a non-float tensor")
    u = Ref(ctx.g.add(ir.RAND, "uniform", (), shape, torch.float32, contiguous_strides(shape)))
    hit = ctx.pointwise("lt", (u, ctx.cast(probs, torch.float32)), shape, torch.bool)
    return ctx.cast(hit, val.dtype)


def _affine_fill(op: str):
    """`empty(...).uniform_(low, high)` / `.normal_(mean, std)` after functionalisation
    (aten.uniform / aten.normal_functional): low + (high - low)·U, mean + std·N."""
    def rule(ctx, node, x, a=0.0, b=1.0, *, generator=None):
        if generator is not None:
            raise Unsupported("an explicit torch.Generator runs eagerly")
        val = node.meta["val"]
        r = _random(ctx, node, op)
        shape = static_shape(val)
        shift, scale = (float(a), float(b) - float(a)) if op == "uniform" else (float(a), float(b))
        if (shift, scale) == (0.0, 1.0):
            return r
        return ctx.pointwise("add", (ctx.pointwise("mul", (r, scale), shape, val.dtype), shift), shape, val.dtype)
    return rule


register(aten.uniform.default)(_affine_fill("uniform"))
register(aten.normal_functional.default)(_affine_fill("normal"))
