"""Which reductions of a row-looped kernel share one loop over the row.

A row-looped kernel reads its row once per loop, so the number of loops is the
number of passes over its inputs.  Two rules put several reductions in one loop:

- *siblings*: reductions over the same rows and dims that do not need each other's
  result (a variance's sum of deviations and sum of squares) accumulate side by side;
- *online pairs*: a row maximum `m = amax(x)` and the sum `sum(exp(x - m))` that
  normalises with it (softmax, log-softmax, log-sum-exp, cross-entropy) run as one
  loop with a running maximum and sum per lane (no cross-lane step inside the loop):
  a lane rescales its sum when its maximum grows, and the lanes are combined once at
  the end (`codegen/emit_reduce.py`).  The
  looped softmax thus reads its row twice (statistics, output) instead of three times.

The code generator (`codegen/emit_reduce.py`) emits exactly these loops and the cost
model (`plan/cost.py`) counts them, so the modelled bytes are the bytes of the code.
"""
from __future__ import annotations

from ..ir import nodes as ir
from .graph_view import is_free


def through_views(g: ir.Graph, nid: int) -> int:
    """The node a chain of reshape/expand views reads (a row value broadcast back)."""
    n = g[nid]
    while n.kind == ir.VIEW and n.op in ("reshape", "expand"):
        n = g[n.refs[0]]
    return n.id


def online_partner(g: ir.Graph, s: ir.Node) -> int | None:
    """The amax node whose online pair `s` is: `s = sum(exp(x - m))` with
    `m = amax(x)` over the same dims, broadcast back by views; else None."""
    if s.kind != ir.REDUCE or s.op != "sum" or s.attr("split_chunks"):
        return None
    e = g[s.refs[0]]
    if e.kind != ir.POINTWISE or e.op != "exp" or e.dtype != s.dtype:
        return None
    d = g[e.refs[0]]
    if d.kind != ir.POINTWISE or d.op != "sub" or len(d.refs) != 2 or not all(isinstance(a, ir.Ref) for a in d.args):
        return None
    x, mb = d.refs
    m = g[through_views(g, mb)]
    if (m.kind != ir.REDUCE or m.op != "amax" or m.refs[0] != x or m.attr("split_chunks")
            or m.attr("dims") != s.attr("dims") or m.shape != s.shape or m.dtype != s.dtype
            or not m.dtype.is_floating_point or g[x].dtype != m.dtype):
        return None
    return m.id


def _needs(g: ir.Graph, members: frozenset, a: int, b: int, memo: dict) -> bool:
    """Does node `a` read node `b` (through the kernel's members and free nodes)?"""
    if (a, b) not in memo:
        seen, stack, found = set(), [a], False
        while stack and not found:
            for r in g[stack.pop()].refs:
                if r == b:
                    found = True
                    break
                if r not in seen and (r in members or is_free(g[r])):
                    seen.add(r)
                    stack.append(r)
        memo[(a, b)] = found
    return memo[(a, b)]


def loop_groups(g: ir.Graph, members: tuple[int, ...] | frozenset) -> list[tuple[int, ...]]:
    """The kernel's combinable reductions partitioned into loops (ids in each loop in
    increasing order; an online pair shares its loop with independent siblings).
    Greedy in id order: each reduction joins the first loop whose reductions it is
    compatible with and independent of."""
    mset = frozenset(members)
    memo: dict = {}
    reduces = [g[m] for m in sorted(mset) if g[m].kind == ir.REDUCE and g[m].op in ir.COMBINABLE_REDUCES]
    paired: dict[int, int] = {}
    for s in reduces:
        m = online_partner(g, s)
        if m is not None and m in mset and m not in paired:
            paired[m], paired[s.id] = s.id, m
    groups: list[list[ir.Node]] = []
    for n in reduces:
        if n.id in paired:
            if n.op == "amax":
                groups.append([n, g[paired[n.id]]])
            continue
        src_shape = g[n.refs[0]].shape
        for grp in groups:
            first = grp[0]
            if (n.attr("split_chunks") or first.attr("split_chunks")
                    or first.shape != n.shape or first.attr("dims") != n.attr("dims")
                    or g[first.refs[0]].shape != src_shape):
                continue
            if any(_needs(g, mset, n.id, o.id, memo) or _needs(g, mset, o.id, n.id, memo) for o in grp):
                continue
            grp.append(n)
            break
        else:
            groups.append([n])
    return [tuple(sorted(x.id for x in grp)) for grp in groups]


__all__ = ["loop_groups", "online_partner", "through_views"]
