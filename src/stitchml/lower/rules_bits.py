"""Bit-level ops: `view(dtype)` between types of one size (a bit-cast) and
`hash_tensor` (the XOR of the values' 64-bit patterns).

Their results may be unsigned types wider than a byte (uint16/32/64), which torch gives
few ops: kernels write them (`UNSIGNED_RESULT_OPS`), view them and bit-cast them back,
but do no arithmetic on them, so any other op that consumes one runs eagerly with the
dtype as its reason (`lower._unsupported_dtype`).
"""
from __future__ import annotations

import torch

from .context import LowerCtx, static_shape
from .registry import Unsupported, register
from .rules_reduce import _dims

aten = torch.ops.aten

UNSIGNED_RESULT_OPS = frozenset({aten.view.dtype, aten.hash_tensor.default})


@register(aten.view.dtype)
def _view_dtype(ctx: LowerCtx, node, x, dtype):
    """x's bits read as `dtype`; between sizes the last dim changes (eager), not a form."""
    out = node.meta["val"]
    if tuple(static_shape(out)) != tuple(ctx.shape(x)):
        raise Unsupported("bit-cast between sizes changes the last dim: not a stitched form")
    return ctx.bitcast(x, out.dtype)


@register(aten.hash_tensor.default)
def _hash_tensor(ctx: LowerCtx, node, x, dim=(), *, keepdim=False, mode=0):
    """hash_tensor (mode 0): the XOR over `dim` of the values' 64-bit patterns, floats
    widened to float64 and integers and bools to int64 first (as eager does), as uint64.
    The XOR runs on int64 (same bits) and the result is bit-cast."""
    if mode != 0:
        raise Unsupported(f"hash_tensor mode {mode} (only 0, xor_sum, exists in eager)")
    src = ctx.dtype(x)
    if src.is_floating_point:
        bits = ctx.bitcast(ctx.cast(x, torch.float64), torch.int64)
    else:
        bits = ctx.cast(x, torch.int64)
    out = node.meta["val"]
    if not ctx.shape(x):  # a 0-d tensor hashes to its own bits
        bits = ctx.pointwise("identity", (bits,), (), torch.int64)
    else:
        bits = ctx.reduce("xor_sum", bits, _dims(ctx, x, dim), keepdim, torch.int64)
    return ctx.bitcast(ctx.reshape(bits, static_shape(out)), torch.uint64)
