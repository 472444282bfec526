"""Buffer placement: kernels write the parts of a concatenation straight into its slices.

A concatenation whose parts are all computed by kernels was one more kernel: it read every
part back and wrote the concatenation (a GRU's step backward concatenates its three gate
gradients for the matrix products of the next step and of the weight gradient: DIEN's
training step had 100 such copies, a launch each).  Placed, the concatenation's buffer is
allocated before its first part is written; each part is a view of its slice, written by
its own kernel at the concatenation's strides, and read there by everyone else; the
concatenation itself needs no step.

The candidates come from a plan (`candidates`: a kernel writes the concatenation from parts
other kernels write anyway), the decision is recorded in the graph, and the graph is planned
again: the concatenation carries `placed`, each part `placed_in` = (concatenation, element
offset of its slice) and the concatenation's strides.  Planning then treats a placed concatenation as a value no
kernel computes (`graph_view.is_member` / `is_placed`), ordered after the kernels that write
its parts (`GraphView.users`); its parts must be written (`GraphView.escapes`); the wrapper
allocates it and makes the parts views of it (`runtime/wrapper.py`).

Only where it cannot cost bytes: every part computed element-wise or by a reduction in a
kernel (not an input, an eager result, a free view or a value recomputed by its readers),
of the concatenation's dtype, not a graph output, read by eager ops only where its slice is
one dense block and never written by one, placed once, and laid out in runs of at least
`MIN_RUN_BYTES` in the concatenation (narrower parts would be written in partial sectors).
A part may be a placed concatenation itself: then its parts are written one level down, all
in the outermost concatenation's buffer (a recurrence's per-step concatenation, read by
that step's matrix product, is a slice of the concatenation of all steps that one product
of the weight gradient reads: `ir/product_sums.py`).  Not under dynamic shapes
(`PlanOptions.fixed_row_blocks`: the wrapper's templates take views at fixed offsets only).
"""
from __future__ import annotations

import copy
from dataclasses import replace
from typing import TYPE_CHECKING

from ..ir import nodes as ir

if TYPE_CHECKING:
    from .data import Plan

MIN_RUN_BYTES = 64   # two 32-byte sectors: a part's contiguous run in the concatenation


def is_placed(n: ir.Node) -> bool:
    """A concatenation whose parts are written into its buffer (no kernel computes it)."""
    return n.kind == ir.CAT and bool(n.attr("placed"))


def contiguous_run(shape: tuple[int, ...], stride: tuple[int, ...]) -> int:
    """Elements of the longest run that a view of `shape` and `stride` holds contiguously
    in memory (from its innermost dim in memory outwards)."""
    run = 1
    for size, st in sorted(((s, t) for s, t in zip(shape, stride) if s > 1), key=lambda x: x[1]):
        if st != run:
            break
        run *= size
    return run


def _enclosing(g: ir.Graph, nid: int):
    """(placed concatenation, element offset in it) for each one value `nid` is written
    into, innermost first."""
    while (placed := g[nid].attr("placed_in")) is not None:
        yield placed
        nid = placed[0]


def containers(g: ir.Graph, nid: int) -> list[int]:
    """The placed concatenations value `nid` is written into, innermost first."""
    return [c for c, _ in _enclosing(g, nid)]


def placed_offset(g: ir.Graph, nid: int) -> int:
    """Elements from the start of the outermost placed concatenation's buffer to where
    value `nid` is written (0 for a value with a buffer of its own)."""
    return sum(off for _, off in _enclosing(g, nid))


def written_parts(g: ir.Graph, cat: int) -> list[int]:
    """The values kernels write into a placed concatenation, through nested ones."""
    out, stack = [], list(g[cat].refs)
    while stack:
        p = stack.pop()
        if is_placed(g[p]):
            stack.extend(g[p].refs)
        else:
            out.append(p)
    return out


def candidates(g: ir.Graph, plan: Plan) -> set[int]:
    """Concatenations a plan's kernel writes from parts other kernels write anyway: placed,
    the copy is gone and nothing is written that was not before.  (A concatenation whose
    parts its own kernel computes — `planner._parts_of_cats`, a free concatenation read
    where its parts are written — stays: placing it would write parts no plan wrote.)"""
    producer = {o: k.name for k in plan.kernels for o in k.outputs}
    out = set()
    for k in plan.kernels:
        for c in k.members:
            n = g[c]
            if n.kind == ir.CAT and c in k.outputs and all(producer.get(r) not in (None, k.name) for r in n.refs):
                out.add(c)
    return out


def place_cats(g: ir.Graph, only: set[int] | None = None) -> ir.Graph:
    """A copy of `g` with the concatenations that can be placed marked (module doc), of
    `only` where given, or `g` itself where there is none."""
    from .graph_view import GraphView, is_free   # (graph_view asks this module back)
    gv = GraphView(g)
    outputs = set(g.output_ids())

    def movable(nid: int, dense: bool) -> bool:
        """Whether the value may live in another buffer: not a graph output (nor a view
        of one), not written by an eager op, and read by eager ops only where its slice
        is one dense block (an ordinary tensor at an offset)."""
        if nid in outputs:
            return False
        for u in gv.readers(nid):
            n = g[u]
            if u in outputs and n.kind == ir.VIEW:
                return False
            if n.kind in (ir.OPAQUE, ir.ITEM) and (not dense or gv.mutates(n)):
                return False
        return True

    parent: dict[int, tuple[int, int]] = {}   # part -> (concatenation, first index along its dim)
    cats: list[int] = []
    for c in g.nodes:
        if (c.kind != ir.CAT or is_free(c) or c.stride is None or c.shape is None or c.dtype is None
                or only is not None and c.id not in only):
            continue
        dim, sizes = c.attr("dim"), c.attr("sizes")
        if (sizes is None or len(sizes) != len(c.args) or not all(isinstance(a, ir.Ref) for a in c.args)
                or len({a.id for a in c.args}) != len(c.args)):
            continue
        chosen: dict[int, tuple[int, int]] = {}
        start = 0
        for a, size in zip(c.args, sizes):
            p = g[a.id]
            want = tuple(size if d == dim else s for d, s in enumerate(c.shape))
            run = min(p.numel, contiguous_run(want, c.stride))
            # (a part that is a placed concatenation itself: its parts go one level down)
            computed = p.kind in (ir.POINTWISE, ir.REDUCE) and not is_free(p) or p.id in cats
            if (not computed or p.id in parent or p.dtype != c.dtype or tuple(p.shape or ()) != want
                    or p.numel == 0 or run * c.dtype.itemsize < MIN_RUN_BYTES or not movable(p.id, run == p.numel)):
                break
            chosen[p.id] = (c.id, start)
            start += size
        else:
            parent.update(chosen)
            cats.append(c.id)
    if not cats:
        return g

    def root(nid: int) -> int:
        while nid in parent:
            nid = parent[nid][0]
        return nid

    out = copy.copy(g)
    out.nodes = list(g.nodes)
    for nid, (c, start) in parent.items():
        # the whole tree lives in its root's buffer, at the root's strides (a slice keeps
        # them); the offset is the element offset in the parent concatenation's view
        stride = g[root(nid)].stride
        offset = start * stride[g[c].attr("dim")]
        out.nodes[nid] = replace(g[nid], stride=stride, attrs=g[nid].attrs + (("placed_in", (c, offset)),))
    for c in cats:
        n = out.nodes[c]
        out.nodes[c] = replace(n, stride=g[root(c)].stride, attrs=n.attrs + (("placed", True),))
    return out


__all__ = ["place_cats", "is_placed", "contiguous_run", "containers", "placed_offset", "written_parts",
           "candidates", "MIN_RUN_BYTES"]
