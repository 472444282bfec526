"""Reversals as index maps (issue 18): `flip` (and prims.rev) is a slice view with step
-1 per flipped dim, so it costs nothing inside a kernel (the load address runs backwards)."""
from __future__ import annotations

import torch

from .context import LowerCtx, static_shape
from .registry import Unsupported, register

aten = torch.ops.aten
prims = torch.ops.prims


@register(aten.flip.default, prims.rev.default)
def _flip(ctx: LowerCtx, node, x, dims):
    shape = ctx.shape(x)
    if not shape:
        raise Unsupported("flip of a 0-d tensor")
    out = x
    for d in sorted({d % len(shape) for d in dims}):
        if shape[d] > 1:
            out = ctx.view("slice", out, shape, (("dim", d), ("start", shape[d] - 1), ("step", -1)))
    # flip returns a new tensor: an element-wise copy (free inside a kernel) so that the
    # reversed view never reaches the wrapper, which replays output views with eager
    # ops, and eager has no negative-step slice
    val = node.meta["val"]
    return ctx.pointwise("identity", (out,), static_shape(val), val.dtype)
