"""Scans of the Triton emitter: inclusive cumsum / cumprod / logcumsumexp along the
kernel's column axis.

A scan's kernel walks the scanned dim as its columns (`plan/grouping.py`), so the scan
is asked for either at the column position itself or, when its consumer reads it
backwards (the flip of every scan's gradient: `flip(cumsum(flip(g)))`), at the
mirrored position; any other index is an `IndexMismatch` and the planner keeps the
consumer in another kernel.

- whole rows in registers (`row_persistent`, `packed_rows`): one `tl.cumsum` /
  `tl.cumprod` / `tl.associative_scan` over the row, reversed for a mirrored read
  (the operand is then loaded mirrored too: scanning it from the end gives
  out[n-1-c] at column c);
- `row_looped`: each column block is scanned and combined with a running carry (the
  combination of every earlier block), updated once per block; for a mirrored read the
  column loop walks the row from its end (lane p holds column n-1-p), so the scan is a
  forward one in lane order; one loop cannot serve both directions.
Lanes outside the row hold the combine's identity, which a prefix never reaches (and a
reversed prefix absorbs).
"""
from __future__ import annotations

import torch

from ..ir import index as ix
from ..ir import nodes as ir
from .emit_core import COL, ROW, KernelBuilder, Val
from .triton_ops import REDUCE_COMBINE, TL_DTYPE, compute_dtype, reduce_identity

# the combine of two partial results, as a @triton.jit function of triton_ops' prelude
_COMBINE = {**REDUCE_COMBINE, "logsumexp": "_logaddexp"}


def _identity(op: str, cd) -> str:
    """What an empty prefix holds: the reductions' identities (-inf for a log-sum-exp)."""
    return reduce_identity("amax" if op == "logsumexp" else op, cd)


def _scan_expr(op: str, x: str, reverse: bool) -> str:
    rev = ", reverse=True" if reverse else ""
    if op == "sum":
        return f"tl.cumsum({x}, 1{rev})"
    if op == "prod":
        return f"tl.cumprod({x}, 1{rev})"
    return f"tl.associative_scan({x}, 1, _logaddexp{rev})"


def _scan_axes(b: KernelBuilder, v: Val) -> set:
    """The axes a scan's lanes span: the columns, and the rows wherever the tile holds
    several of the domain's rows, even where the operand does not vary along them (a
    constant's prefix sum, positions from a mask of ones): Triton 3.6 (torch 2.11's)
    refused to scan such a [1, C] block laid out for the kernel's [R, C] tiles (an
    assertion in its scan lowering, `ScanOpToLLVM.cpp` AddPartialReduce; timm's
    edgenext_xx_small, bench/NOTES.md, forty-third session).  A domain of one row (under
    a dynamic-shape row block) keeps a [1, C] block: its outputs' pointers have no row
    axis."""
    axes = set(v.axes) | {COL}
    if b.m.block_r > 1 and b.dom.rows > 1:
        axes.add(ROW)
    return axes


def _direction(b: KernelBuilder, n: ir.Node, index) -> bool:
    """True when the scan is read backwards; raise IndexMismatch when it is read at a
    position that is not its column (another row's values, a shifted column)."""
    d = n.attr("dim")
    if any(COL in ix.axes(e) for i, e in enumerate(index) if i != d):
        raise ix.IndexMismatch("scan requested with a column-dependent row position")
    pos, size = index[d], n.shape[d]
    if pos == b.col_flat:
        return False
    if pos == b.col_flat * -1 + (size - 1) and b.dom.cols == size:
        return True
    raise ix.IndexMismatch("scan requested off its column axis")


def scan(b: KernelBuilder, n: ir.Node, index: tuple[ix.Expr, ...]) -> Val:
    # (a segment would scan its own columns only: the planner gives scans whole-row tiles)
    assert not b.segs, "a scan in a kernel of row segments (planner bug)"
    reverse = _direction(b, n, index)
    outer, b.cond = b.cond, tuple(c for c in b.cond if COL not in c[1])  # the whole prefix is needed
    try:
        v = b.value(n.refs[0], index)
    finally:
        b.cond = outer
    scope = b.scopes[-1]
    assert scope.has_col, "scan pulled outside a column scope (emitter bug)"
    if n.op in ("max", "min"):
        return _extreme(b, n, v, reverse, scope)
    cd = compute_dtype(n.dtype)
    ident = _identity(n.op, cd)
    axes = _scan_axes(b, v)
    lanes = b.emit(scope, f"tl.where({b.mask(axes)}, {v.name}, {ident})", axes, cd)
    if not b.looped:
        return b.emit(scope, _scan_expr(n.op, lanes.name, reverse), axes, cd)
    # one row per program walked in column blocks: the loop runs from the row's end for
    # a scan read backwards (`KernelBuilder.close_loop`), so in lane order every scan is
    # forward; carry the combination of the blocks before this one (initialised before
    # the loop: `close_loop` places the loop after every line of the top scope)
    want = "reverse" if reverse else "forward"
    _walk(scope, want)
    blk = b.emit(scope, _scan_expr(n.op, lanes.name, False), axes, cd)
    comb = _COMBINE[n.op]
    carry = b.new("carry")
    b.top.lines.append(f"{carry} = tl.full([{b.m.block_r}, 1], {ident}, {TL_DTYPE[cd]})")
    out = b.emit(scope, f"{comb}({blk.name}, {carry})", axes, cd)
    total = f"tl.sum({lanes.name}, 1)" if n.op == "sum" else f"tl.reduce({lanes.name}, 1, {comb})"
    scope.lines.append(f"{carry} = {comb}({carry}, {total}[:, None])")
    return out


def _walk(scope, want: str) -> None:
    """Claim the column loop's direction for a scan (one loop walks one way)."""
    if scope.direction not in (None, want):
        raise ix.IndexMismatch("scans read in opposite directions in one column loop")
    scope.direction = want


def _extreme(b: KernelBuilder, n: ir.Node, v: Val, reverse: bool, scope) -> Val:
    """cummax / cummin: a scan of (value, column) pairs whose combine keeps the later
    pair when it is NaN or at least as large (small): eager's tie and NaN rules.  The
    value and the index node emit the same scan text, so the kernel scans once."""
    if reverse:
        raise ix.IndexMismatch("cummax / cummin read backwards")
    cd = compute_dtype(v.dtype)
    comb = "_cummax" if n.op == "max" else "_cummin"
    ident = reduce_identity("amax" if n.op == "max" else "amin", cd)
    out_dtype = torch.int64 if n.attr("output") == 1 else cd
    axes = _scan_axes(b, v)
    zero = "zr + zc" if ROW in axes else "zc"
    lanes = b.emit(scope, f"tl.where({b.mask(axes)}, {v.name}, {ident})", axes, cd)
    pos = b.emit(scope, f"({ix.render(b.col_flat)} + {zero}).to(tl.int64)", axes, torch.int64)
    pair = b.emit(scope, f"tl.associative_scan(({lanes.name}, {pos.name}), 1, {comb})", axes, cd)
    if b.looped:
        # one carried pair per scan: the value and the index node share it (the key is
        # no expression text, so nothing else can meet it in the scope's memo)
        key = f"carried {pair.name}"
        if key not in scope.exprs:
            _walk(scope, "forward")
            cv, ci = b.new("carry"), b.new("carry")
            b.top.lines += [f"{cv} = tl.full([{b.m.block_r}, 1], {ident}, {TL_DTYPE[cd]})",
                            f"{ci} = tl.full([{b.m.block_r}, 1], 0, tl.int64)"]
            carried = b.emit(scope, f"{comb}({cv}, {ci}, {pair.name}[0], {pair.name}[1])", axes, cd)
            best = b.emit(scope, f"tl.reduce(({lanes.name}, {pos.name}), 1, {comb})", {ROW}, cd)
            scope.lines.append(f"{cv}, {ci} = {comb}({cv}, {ci}, {best.name}[0][:, None], "
                               f"{best.name}[1][:, None])")
            scope.exprs[key] = carried
        pair = scope.exprs[key]
    return b.emit(scope, f"{pair.name}[{n.attr('output')}]", axes, out_dtype)


__all__ = ["scan"]
