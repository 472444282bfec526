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

from ..ir import index as ix
from ..ir import nodes as ir
from .emit_core import COL, KernelBuilder, Val
from .triton_ops import TL_DTYPE, compute_dtype, literal

# the combine of two partial results, as a @triton.jit function of triton_ops' prelude
_COMBINE = {"sum": "_add", "prod": "_mul", "logsumexp": "_logaddexp"}


def _identity(op: str, cd) -> str:
    return literal({"sum": 0, "prod": 1, "logsumexp": float("-inf")}[op], cd)


def _scan_expr(op: str, x: str, reverse: bool) -> str:
    rev = ", reverse=True" if reverse else ""
    if op == "sum":
        return f"tl.cumsum({x}, 1{rev})"
    if op == "prod":
        return f"tl.cumprod({x}, 1{rev})"
    return f"tl.associative_scan({x}, 1, _logaddexp{rev})"


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


def scan(b: KernelBuilder, n: ir.Node, index) -> Val:
    reverse = _direction(b, n, index)
    outer, b.cond = b.cond, tuple(c for c in b.cond if COL not in c[1])  # the whole prefix is needed
    try:
        v = b.value(n.refs[0], index)
    finally:
        b.cond = outer
    cd = compute_dtype(n.dtype)
    ident = _identity(n.op, cd)
    scope = b.scopes[-1]
    assert scope.has_col, "scan pulled outside a column scope (emitter bug)"
    # the scan varies along the columns, and along the rows only where its operand does
    # (one row under a dynamic-shape row block: the store's pointer has no row axis)
    axes = set(v.axes) | {COL}
    lanes = b.emit(scope, f"tl.where({b.mask(axes)}, {v.name}, {ident})", axes, cd)
    if not b.looped:
        return b.emit(scope, _scan_expr(n.op, lanes.name, reverse), axes, cd)
    # one row per program walked in column blocks: the loop runs from the row's end for
    # a scan read backwards (`KernelBuilder.close_loop`), so in lane order every scan is
    # forward; carry the combination of the blocks before this one (initialised before
    # the loop: `close_loop` places the loop after every line of the top scope)
    want = "reverse" if reverse else "forward"
    if scope.direction not in (None, want):
        raise ix.IndexMismatch("scans read in opposite directions in one column loop")
    scope.direction = want
    blk = b.emit(scope, _scan_expr(n.op, lanes.name, False), axes, cd)
    comb = _COMBINE[n.op]
    carry = b.new("carry")
    b.top.lines.append(f"{carry} = tl.full([{b.m.block_r}, 1], {ident}, {TL_DTYPE[cd]})")
    out = b.emit(scope, f"{comb}({blk.name}, {carry})", axes, cd)
    total = f"tl.sum({lanes.name}, 1)" if n.op == "sum" else f"tl.reduce({lanes.name}, 1, {comb})"
    scope.lines.append(f"{carry} = {comb}({carry}, {total}[:, None])")
    return out


__all__ = ["scan"]
