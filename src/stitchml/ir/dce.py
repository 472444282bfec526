"""Dead-node elimination on the stitch IR.

aot_autograd graphs can hold values nobody reads: the unused indices of `max.dim`,
the `tangent * 2` of a piecewise-constant op whose gradient is zero.  Planned as they
are, such a value forms a kernel with no outputs.  We drop every node that no output
depends on, before planning.  Graph inputs and eager (opaque) calls stay: an input's
position is part of the calling convention and an eager call may have side effects.
"""
from __future__ import annotations

from .nodes import CAT, GATHER, INPUT, ITEM, OPAQUE, POINTWISE, REDUCE, SCAN, VIEW, Graph, Node, Ref
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




def mutates(g: Graph, n: Node) -> bool:
    """Whether eager node `n` writes one of its operands (a mutable ATen schema)."""
    schema = getattr(g.eager_calls.get(n.id, (None,))[0], "_schema", None)
    return bool(schema is not None and schema.is_mutable)


# pure nodes: their value is a function of their operands and attributes alone
_PURE = frozenset({POINTWISE, VIEW, REDUCE, SCAN, CAT, GATHER})


def merge_duplicates(g: Graph) -> Graph:
    """`g` with each pure node that repeats an earlier one (same kind, op, operands after
    merging, attributes, shape, dtype and strides) replaced by that earlier node, or `g`
    itself when none repeats.  Lowering can leave such twins (the embedding backward's
    rule casts the incoming gradient once per table: BERT's last layer-norm backward
    wrote the same float32 [tokens, hidden] cast twice); a kernel then writes both.  Two
    graph outputs are never merged into one tensor (an output aliasing another is not
    what the traced graph returned); a later twin of an output reads that output.  An
    eager op that writes a buffer (a mutation fence, as `plan/graph_view.py` orders
    them) ends the run of nodes a twin may be merged into."""
    outputs = set(g.output_ids())
    first: dict[str, int] = {}
    same: dict[int, int] = {}
    carries: set[int] = set()   # kept nodes that a graph output is (or was merged into)

    def canon(a):   # operands by the node they stand for after merging
        if isinstance(a, Ref):
            return ("%", same.get(a.id, a.id))
        if isinstance(a, (tuple, list)):
            return tuple(canon(x) for x in a)
        return a

    for n in g.nodes:
        if n.kind == OPAQUE and mutates(g, n):
            first.clear()   # an eager op writes a buffer here: a twin after it may read new values
            continue
        if n.kind not in _PURE:
            continue
        key = repr((n.kind, n.op, canon(n.args), n.attrs, n.shape, n.dtype, n.stride))
        f = first.get(key)
        if f is not None and not (n.id in outputs and f in carries):
            same[n.id] = f
            if n.id in outputs:
                carries.add(f)       # f now stands for a graph output: no second one joins it
        else:
            first.setdefault(key, n.id)
            if n.id in outputs:
                carries.add(n.id)
    return _renumbered(g, same)


# kinds whose value a kernel computes into a buffer of its own (not a graph input, not an
# eager op's result that may alias another tensor, not a view of something else)
_COMPUTED = frozenset({POINTWISE, REDUCE, SCAN, CAT, GATHER})


def fold_copies(g: Graph) -> Graph:
    """`g` with each element-wise copy (`clone`, a dropout of probability 0) of a computed
    value in the same dtype and layout replaced by that value, or `g` itself when none is.
    A kernel wrote both buffers: Swin-T's attention probabilities, saved for the backward
    and copied for the next matrix product, 140 MB a step.  Kept: a copy of a graph input
    or of an eager op's result, a copy in another layout (eager's strides), a copy that is
    a graph output where its value is one too (two outputs would share a tensor), and a
    copy of a value that an eager op writes (the copy must keep the old values)."""
    outputs = set(g.output_ids())
    written: set[int] = set()
    for n in g.nodes:
        if n.kind == OPAQUE and mutates(g, n):
            for r in n.refs:
                while g[r].kind == VIEW:
                    written.add(r)
                    r = g[r].refs[0]
                written.add(r)
    same: dict[int, int] = {}
    carries = set(outputs)      # values a graph output is (or, after a fold, stands for)
    for n in g.nodes:
        if n.kind != POINTWISE or n.op != "identity" or n.attrs or len(n.refs) != 1:
            continue
        x = g[same.get(n.refs[0], n.refs[0])]
        if x.kind not in _COMPUTED or x.dtype != n.dtype or x.shape != n.shape or x.stride is None \
                or x.stride != n.stride or x.id in written or n.id in written:
            continue
        if n.id in outputs:
            if x.id in carries:
                continue
            carries.add(x.id)
        same[n.id] = x.id
    return _renumbered(g, same)


def _renumbered(g: Graph, same: dict[int, int]) -> Graph:
    """A renumbered copy of `g` in which node `a` of each pair `a -> b` of `same` is `b`
    (`g` itself when `same` is empty)."""
    if not same:
        return g
    new = Graph(inputs=[], outputs=[], fallbacks=list(g.fallbacks))
    remap: dict[int, int] = {}
    for n in g.nodes:
        if n.id in same:
            remap[n.id] = remap[same[n.id]]
        else:
            copy_node(new, g, n, remap)
    finish_copy(new, g, remap)
    return new


__all__ = ["eliminate_dead", "fold_copies", "live_nodes", "merge_duplicates", "mutates"]
