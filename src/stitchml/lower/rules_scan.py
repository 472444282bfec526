"""Scans (issue 18): cumsum, cumprod and logcumsumexp become one SCAN node each.

A scan is a row operation like a reduction: its kernel walks the scanned dim along the
program's column axis (`plan/grouping.py`), so it stitches with element-wise producers
and consumers and with reductions over the same rows.  The code generator
(`codegen/emit_scan.py`) emits `tl.cumsum` / `tl.cumprod` / `tl.associative_scan` over
a row held in registers, or over column blocks with a running carry for long rows;
read backwards (the flip ... flip of every scan's gradient) it scans in reverse.
"""
from __future__ import annotations

import torch

from ..ir import nodes as ir
from ..ir.nodes import Ref
from .context import FLOAT_TYPES, LowerCtx, static_shape
from .registry import Unsupported, register

aten = torch.ops.aten


def _scan(ctx: LowerCtx, node, x, dim: int, op: str) -> Ref:
    val = node.meta["val"]
    shape, dtype = static_shape(val), val.dtype
    if op == "logsumexp" and dtype not in FLOAT_TYPES:
        raise Unsupported("logcumsumexp of an integer tensor")
    # eager scans integer and bool inputs in int64 (or in the `dtype` asked for): the
    # result's dtype says which
    x = ctx.cast(x, dtype)
    d = dim % max(len(shape), 1)
    if not shape or shape[d] == 1:
        # a scan of one element is the element (0-d tensors included)
        return ctx.pointwise("identity", (x,), shape, dtype)
    ctx._check_dtype(dtype)
    return Ref(ctx.g.add(ir.SCAN, op, (x,), shape, dtype, ir.contiguous_strides(shape), (("dim", d),)))


@register(aten.cumsum.default)
def _cumsum(ctx, node, x, dim, *, dtype=None):
    return _scan(ctx, node, x, dim, "sum")


@register(aten.cumprod.default)
def _cumprod(ctx, node, x, dim, *, dtype=None):
    return _scan(ctx, node, x, dim, "prod")


@register(aten.logcumsumexp.default)
def _logcumsumexp(ctx, node, x, dim):
    return _scan(ctx, node, x, dim, "logsumexp")
