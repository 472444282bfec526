"""Dead-node elimination on the stitch IR.

aot_autograd graphs can hold values nobody reads: the unused indices of `max.dim`,
the `tangent * 2` of a piecewise-constant op whose gradient is zero.  Planned as they
are, such a value forms a kernel with no outputs.  We drop every node that no output
depends on, before planning.  Graph inputs and eager (opaque) calls stay: an input's
position is part of the calling convention and an eager call may have side effects.
"""
from __future__ import annotations

from .nodes import INPUT, ITEM, OPAQUE, Graph, Ref


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

    def fix(a):
        if isinstance(a, Ref):
            return Ref(remap[a.id])
        if isinstance(a, (tuple, list)):
            return type(a)(fix(x) for x in a)
        if isinstance(a, dict):
            return {k: fix(v) for k, v in a.items()}
        return a

    for n in g.nodes:
        if n.id not in live:
            continue
        nid = new.add(n.kind, n.op, fix(n.args), n.shape, n.dtype, n.stride, n.attrs)
        remap[n.id] = nid
        if n.id in g.eager_calls:
            target, args, kwargs = g.eager_calls[n.id]
            new.eager_calls[nid] = (target, fix(args), fix(kwargs))
        if n.id in g.constants:
            new.constants[nid] = g.constants[n.id]
    new.inputs = [remap[i] for i in g.inputs]
    new.outputs = [fix(o) for o in g.outputs]
    return new


__all__ = ["eliminate_dead", "live_nodes"]
