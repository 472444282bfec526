"""Scans (issue 18): cumsum, cumprod and logcumsumexp become one SCAN node each;
cummax / cummin two (values and indices: one tuple scan in the kernel).

A scan is a row operation like a reduction: its kernel walks the scanned dim along the
program's column axis (`plan/grouping.py`), so it stitches with element-wise producers
and consumers and with reductions over the same rows.  The code generator
(`codegen/emit_scan.py`) emits `tl.cumsum` / `tl.cumprod` / `tl.associative_scan` over
a row held in registers, or over column blocks with a running carry for long rows;
read backwards (the flip ... flip of every scan's gradient) it scans in reverse.  Few
long rows (a flattened mask) are scanned in two levels (`_two_level`).
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
    rows = ir.prod(shape) // shape[d]
    if op in _TWO_LEVEL and rows < SPLIT_MAX_ROWS and shape[d] > SPLIT_MIN_COLS:
        return _two_level(ctx, x, shape, d, op, dtype)
    return _scan_node(ctx, op, x, d)


def _scan_node(ctx: LowerCtx, op: str, x: Ref, d: int) -> Ref:
    shape, dtype = ctx.shape(x), ctx.dtype(x)
    return Ref(ctx.g.add(ir.SCAN, op, (x,), shape, dtype, ir.contiguous_strides(shape), (("dim", d),)))


# A scan whose rows are few and long would be walked by few programs, one column block
# after another (one program for a flattened mask, masked_scatter's case): split such
# rows into chunks of SPLIT_CHUNK: reduce each chunk to its total in parallel, scan the
# totals, and scan each chunk again combined with the total of the chunks before it.
SPLIT_MAX_ROWS = 128      # fewer rows than this leave most of a GPU's SMs idle
SPLIT_MIN_COLS = 8192     # rows up to this long are one column block or a few
SPLIT_CHUNK = 1024
_TWO_LEVEL = {"sum": ("add", 0), "prod": ("mul", 1)}


def _two_level(ctx: LowerCtx, x: Ref, shape, d: int, op: str, dtype) -> Ref:
    from .rules_views import _concat
    combine, ident = _TWO_LEVEL[op]
    # the chunk scans and their totals are written out: keep them in the compute type
    # (float32 for half types) so the result is rounded once, as a one-level scan's is
    out_dtype, dtype = dtype, ir.compute_dtype(dtype)
    x = ctx.cast(x, dtype)
    nd = len(shape)
    n = shape[d]
    order = tuple(i for i in range(nd) if i != d) + (d,)
    moved = ctx.view("permute", x, tuple(shape[i] for i in order), (("dims", order),)) if d != nd - 1 else x
    rows = ir.prod(shape) // n
    chunks = -(-n // SPLIT_CHUNK)
    flat = ctx.reshape(moved, (rows, n))
    if chunks * SPLIT_CHUNK != n:   # pad each row with the identity up to whole chunks
        pad = ctx.full((rows, chunks * SPLIT_CHUNK - n), ident, dtype)
        flat = _concat(ctx, [flat, pad], (rows, chunks * SPLIT_CHUNK), 1, dtype)
    blocks = ctx.reshape(flat, (rows * chunks, SPLIT_CHUNK))
    # reduce, then scan: the chunks' totals by a reduction (reads x once), and each chunk
    # scanned in the last kernel beside its offset, so the chunk scans never go to memory
    # (scan-then-propagate wrote them in float32 and read them back: 3x the copy floor in
    # bfloat16 against 1.5x)
    totals = ctx.reshape(ctx.reduce(op, blocks, (1,), False, dtype), (rows, chunks))
    before = _scan_node(ctx, op, totals, 1)                                    # inclusive over chunks
    if op == "sum":
        # exclusive = inclusive - own total: the same index as the scan (its kernel); a
        # float prefix is off by one rounding of the prefix, as a sequential scan is
        offset = ctx.pointwise("sub", (before, totals), (rows, chunks), dtype)
    else:   # a product cannot divide its own total out (zeros): shift by a chunk
        first = ctx.full((rows, 1), ident, dtype)
        shifted = ctx.view("slice", before, (rows, chunks - 1), (("dim", 1), ("start", 0), ("step", 1)))
        offset = _concat(ctx, [first, shifted], (rows, chunks), 1, dtype)
    local = _scan_node(ctx, op, blocks, 1)   # each chunk on its own (after the offsets: one kernel with them)
    if chunks * SPLIT_CHUNK == n and d == nd - 1:
        # in the chunk scan's own (rows * chunks, chunk) shape: its offset is a per-row
        # value of that kernel (as a softmax's max is), the result written in place, and
        # the output's shape is a view of it
        per_row = ctx.broadcast_to(ctx.reshape(offset, (rows * chunks, 1)), (rows * chunks, SPLIT_CHUNK))
        out = ctx.cast(ctx.pointwise(combine, (local, per_row), (rows * chunks, SPLIT_CHUNK), dtype), out_dtype)
        return ctx.reshape(out, shape)
    # padded rows, or a scan along another dim than the last: the result in the output's
    # own shape, each element its chunk's scan combined with the chunk's offset, read
    # through index maps (the chunk scans are written once and read back)
    padded = (rows, chunks * SPLIT_CHUNK)
    wide = ctx.reshape(ctx.broadcast_to(ctx.reshape(offset, (rows, chunks, 1)), (rows, chunks, SPLIT_CHUNK)), padded)
    parts = [ctx.view("slice", t, (rows, n), (("dim", 1), ("start", 0), ("step", 1)))
             for t in (ctx.reshape(local, padded), wide)]
    out = ctx.pointwise(combine, tuple(parts), (rows, n), dtype)
    out = ctx.reshape(out, tuple(shape[i] for i in order))
    if d != nd - 1:
        inverse = tuple(order.index(i) for i in range(nd))
        out = ctx.view("permute", out, shape, (("dims", inverse),))
    return ctx.cast(out, out_dtype) if out_dtype != dtype else ctx.pointwise("identity", (out,), shape, dtype)


@register(aten.cumsum.default)
def _cumsum(ctx, node, x, dim, *, dtype=None):
    return _scan(ctx, node, x, dim, "sum")


@register(aten.cumprod.default)
def _cumprod(ctx, node, x, dim, *, dtype=None):
    return _scan(ctx, node, x, dim, "prod")


@register(aten.logcumsumexp.default)
def _logcumsumexp(ctx, node, x, dim):
    return _scan(ctx, node, x, dim, "logsumexp")


def _cumext(op: str):
    """cummax / cummin: (running extreme, index of its latest occurrence); NaN wins and
    stays, ties take the later index (eager's `>=` / `<=`)."""
    def rule(ctx, node, x, dim):
        vals, idx = node.meta["val"]
        shape, dtype = static_shape(vals), vals.dtype
        d = dim % max(len(shape), 1)
        if not shape or shape[d] == 1:
            return (ctx.pointwise("identity", (x,), shape, dtype), ctx.full(shape, 0, torch.int64))
        src = ctx.cast(x, torch.int32) if dtype == torch.bool else x   # (True > False as integers)
        sdt = ctx.dtype(src)
        ctx._check_dtype(sdt)
        v = Ref(ctx.g.add(ir.SCAN, op, (src,), shape, sdt, ir.contiguous_strides(shape), (("dim", d), ("output", 0))))
        i = Ref(ctx.g.add(ir.SCAN, op, (src,), shape, torch.int64, ir.contiguous_strides(shape),
                          (("dim", d), ("output", 1))))
        return (ctx.cast(v, dtype), i)
    return rule


register(aten.cummax.default)(_cumext("max"))
register(aten.cummin.default)(_cumext("min"))
