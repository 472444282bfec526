"""Trees of adds over like leaves: what the step-by-step accumulation of a gradient looks
like (a recurrence adds each step's bias sum, each step's weight product, to the last).
The two folds of such sums (`cat_sums.fold_reduction_sums`, `product_sums.fold_product_sums`)
find them here and differ only in what a leaf is."""
from __future__ import annotations

from typing import Any, Callable

from .nodes import POINTWISE, Graph, Ref


def add_trees(g: Graph, leaf: Callable[[int], tuple[Any, set[int]] | None],
              like: Callable[[Any, list[Any]], bool], min_leaves: int) -> dict[int, tuple[list[Any], set[int]]]:
    """Maximal trees of plain two-operand adds (no attributes) whose operands are each an
    add of a tree read by it alone, or a leaf: `leaf(node)` gives (its value, the nodes it
    stands for) or None.  An add joins only where `like(add node, its leaves' values)`
    holds.  Returns, per root of `min_leaves` or more leaves, (the leaves' values, every
    node the tree consists of: its adds and the leaves' nodes)."""
    users = g.users()
    outs = set(g.output_ids())

    def alone(nid: int) -> bool:
        return len(users[nid]) == 1 and nid not in outs

    trees: dict[int, tuple[list[Any], set[int]]] = {}
    for n in g.nodes:
        if (n.kind != POINTWISE or n.op != "add" or len(n.args) != 2 or n.attrs
                or not all(isinstance(a, Ref) for a in n.args)):
            continue
        found: list[Any] = []
        nodes = {n.id}
        for a in n.args:
            if a.id in trees and alone(a.id):
                found += trees[a.id][0]
                nodes |= trees[a.id][1]
            elif (lf := leaf(a.id)) is not None:
                found.append(lf[0])
                nodes |= lf[1]
            else:
                break
        else:
            if like(g[n.id], found):
                trees[n.id] = (found, nodes)
    return {a: t for a, t in trees.items() if len(t[0]) >= min_leaves
            and not any(u in trees and alone(a) for u in users[a])}


__all__ = ["add_trees"]
