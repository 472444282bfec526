"""Dead-node elimination on the stitch IR.

aot_autograd graphs can hold values nobody reads: the unused indices of `max.dim`,
the `tangent * 2` of a piecewise-constant op whose gradient is zero.  Planned as they
are, such a value forms a kernel with no outputs.  We drop every node that no output
depends on, before planning.  Graph inputs and eager (opaque) calls stay: an input's
position is part of the calling convention and an eager call may have side effects.
"""
from __future__ import annotations

from .nodes import INPUT, ITEM, OPAQUE, Graph, Ref
from .rewrite import copy_node, finish_copy


def live_nodes(g: Graph) -> set[int]:
    roots = [o.id for o in g.outputs if isinstance(o, Ref)]
    roots += [n.id for n in g.nodes if n.kind in (INPUT, OPAQUE, ITEM)]
    live: set[int] = set()
    while roots:
        nid = roots.pop()
        if nid not in live:
            live.add(nid)
            roots.extend(g[nid].refs)
    return live


def eliminate_dead(g: Graph) -> Graph:
    """`g` itself when every node is live, otherwise a renumbered copy without the dead ones."""
    live = live_nodes(g)
    if len(live) == len(g.nodes):
        return g
    new = Graph(inputs=[], outputs=[], fallbacks=list(g.fallbacks))
    remap: dict[int, int] = {}
    for n in g.nodes:
        if n.id in live:
            copy_node(new, g, n, remap)
    finish_copy(new, g, remap)
    return new


__all__ = ["eliminate_dead", "live_nodes"]
