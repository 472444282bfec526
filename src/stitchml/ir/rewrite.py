"""Copying an IR graph node by node into a renumbered graph (the building blocks of
graph rewrites: dead-node elimination, task splitting)."""
from __future__ import annotations

from typing import Any, Callable

from .nodes import Graph, Node, Ref


def remap_refs(a: Any, remap: dict[int, int]) -> Any:
    """`a` with every Ref renumbered through `remap` (nested tuples, lists, dicts)."""
    if isinstance(a, Ref):
        return Ref(remap[a.id])
    if isinstance(a, (tuple, list)):
        return type(a)(remap_refs(x, remap) for x in a)
    if isinstance(a, dict):
        return {k: remap_refs(v, remap) for k, v in a.items()}
    return a


def copy_node(new: Graph, g: Graph, n: Node, remap: dict[int, int]) -> int:
    """Append node `n` of `g` to the rewritten graph `new` (with its eager call or
    constant), record its new id in `remap` and return it."""
    nid = new.add(n.kind, n.op, remap_refs(n.args, remap), n.shape, n.dtype, n.stride, n.attrs)
    remap[n.id] = nid
    if n.id in g.eager_calls:
        target, args, kwargs = g.eager_calls[n.id]
        new.eager_calls[nid] = (target, remap_refs(args, remap), remap_refs(kwargs, remap))
    if n.id in g.constants:
        new.constants[nid] = g.constants[n.id]
    return nid


def finish_copy(new: Graph, g: Graph, remap: dict[int, int]) -> None:
    new.inputs = [remap[i] for i in g.inputs]
    new.outputs = [remap_refs(o, remap) for o in g.outputs]
    new.input_writes = list(g.input_writes)


def rebuild(g: Graph, replace: dict[int, Callable[[Graph, Node, dict[int, int]], int]],
            drop: set[int] | frozenset = frozenset()) -> Graph:
    """A renumbered copy of `g` in which each node of `replace` is built by its function
    (`fn(new, node, remap)` appends what stands for it and returns the id), the nodes in
    `drop` are left out (nothing kept may read them) and every other node is copied."""
    new = Graph(inputs=[], outputs=[], fallbacks=list(g.fallbacks))
    remap: dict[int, int] = {}
    for n in g.nodes:
        if n.id in replace:
            remap[n.id] = replace[n.id](new, n, remap)
        elif n.id not in drop:
            copy_node(new, g, n, remap)
    finish_copy(new, g, remap)
    return new


__all__ = ["copy_node", "finish_copy", "rebuild", "remap_refs"]
