"""Sums of matrix products folded into one product over the concatenated inner dimension.

    A_1 @ B_1 + A_2 @ B_2 + ... + A_n @ B_n  =  [A_1 | ... | A_n] @ [B_1; ...; B_n]

Autograd accumulates the weight gradient of a matrix a recurrence applies at every step
(a GRU's hidden-to-hidden weights, through 50 steps) as an add of each step's product
dG_t^T @ h_t: DIEN's training step at b2048 runs 100 products of [108 x 2048] @ [2048 x 36],
each a few microseconds of latency for 16 MFLOP, and adds them one by one.  Folded, one
product walks the 50 steps' inner dimension, and its float32 accumulator is rounded once
(eager rounds each product and each add to the gradient's dtype: the fold is closer to the
exact sum, not bit-equal to eager's).  The concatenations cost a copy of the operands
unless buffer placement (`plan/placement.py`) writes them in place: a step's gate
gradients already go into that step's concatenation, which becomes a slice of the
concatenation of all steps.

Only where the cost model prices the folded product and the copies of its operands below
the products it replaces (`library_cost.gemm_seconds` for every product, the operand
copies at the copy bandwidth: a sum of a few large products, such as a weight shared by
two layers, is left alone), over `MIN_PIECES` or more `aten.mm` results of one shape and
dtype, each read by the tree of adds alone (the adds too), seen directly or through
transposes (all alike).  Pieces are ordered by their operands' node ids, so that two folds
over the same steps (the bias gradient's `fold_reduction_sums`) build the same
concatenation, which `dce.merge_duplicates` then keeps once.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from .nodes import CAT, OPAQUE, VIEW, Graph, Ref, contiguous_strides
from .add_trees import add_trees
from .rewrite import rebuild

if TYPE_CHECKING:
    from ..plan.devices import Device

MIN_PIECES = 4
MM = "aten.mm.default"

Piece = tuple[int, bool]   # (node, read transposed)


def _transposes(g: Graph, nid: int) -> tuple[int, bool, list[int]]:
    """(the node under a chain of 2-D transposes, whether the chain transposes it, the chain)."""
    chain, flip = [], False
    n = g[nid]
    while n.kind == VIEW and n.op == "permute" and tuple(n.attr("dims")) == (1, 0):
        chain.append(n.id)
        flip = not flip
        n = g[n.refs[0]]
    return n.id, flip, chain


def fold_product_sums(g: Graph, dev: Device) -> Graph:
    """`g` with each qualifying add tree of matrix products replaced by one product
    (module doc); `dev` is the cost model's device."""
    users = g.users()
    outs = set(g.output_ids())

    def leaf(nid: int) -> tuple[tuple[int, bool], set[int]] | None:
        """((mm node, transposed), its nodes) of an add operand read by the tree alone."""
        base, flip, chain = _transposes(g, nid)
        n = g[base]
        if (n.kind != OPAQUE or n.op != MM or base not in g.eager_calls
                or any(len(users[c]) != 1 or c in outs for c in [base, *chain])):
            return None
        _, args, kwargs = g.eager_calls[base]
        if kwargs or len(args) != 2 or not all(isinstance(a, Ref) for a in args):
            return None
        return (base, flip), {base, *chain}

    def like(n, found: list[tuple[int, bool]]) -> bool:
        """Products of the add's 2-D shape (transposed where read so) and dtype."""
        return n.shape is not None and len(n.shape) == 2 and all(
            g[m].shape == (n.shape[::-1] if flip else n.shape) and g[m].dtype == n.dtype for m, flip in found)

    trees = add_trees(g, leaf, like, MIN_PIECES)
    roots: dict[int, list[Piece]] = {}
    for a, (leaves, _) in trees.items():
        if g[a].stride is not None and g[a].stride != contiguous_strides(g[a].shape):
            continue   # (the product is written row-major: eager's sum of transposes is not)
        pieces = _operands(g, leaves)
        if pieces is not None and _pays(g, pieces, g[a], dev):
            roots[a] = pieces
    if not roots:
        return g
    # (the products and adds replaced are read by their tree alone: eager products are not
    # dropped as dead code, so they are left out here)
    replaced = set().union(*(trees[r][1] for r in roots)) - set(roots)
    return rebuild(g, {r: (lambda new, n, remap: _fold(new, g, n, roots[n.id], remap)) for r in roots}, replaced)


def _operands(g: Graph, leaves: list[tuple[int, bool]]) -> list[tuple[Piece, Piece, int]] | None:
    """Per product of the tree, its left and right operands as pieces of a result that is
    not transposed ((A B)^T = B^T A^T), and its inner extent; None where the pieces do not
    line up (mixed transposes, other dtypes)."""
    out = []
    for m, flip in leaves:
        _, (a, b), _ = g.eager_calls[m]
        pa, ta, _ = _transposes(g, a.id)
        pb, tb, _ = _transposes(g, b.id)
        left, right = ((pb, not tb), (pa, not ta)) if flip else ((pa, ta), (pb, tb))
        inner = g[a.id].shape[1]
        out.append((left, right, inner))
    if len({l[1] for l, _, _ in out}) != 1 or len({r[1] for _, r, _ in out}) != 1:
        return None
    if {g[l[0]].dtype for l, _, _ in out} | {g[r[0]].dtype for _, r, _ in out} != {g[leaves[0][0]].dtype}:
        return None
    return sorted(out, key=lambda x: (x[0][0], x[1][0]))


def _pays(g: Graph, pieces, root, dev) -> bool:
    """The folded product and its operands' copies priced below the products it replaces."""
    from ..plan.library_cost import gemm_seconds   # (the planner's price of a product)
    m, n = root.shape
    dtype = g[pieces[0][0][0]].dtype
    before = sum(gemm_seconds(1, m, n, k, dtype, dev) + dev.graph_launch_s for _, _, k in pieces)
    total_k = sum(k for _, _, k in pieces)
    copies = 2 * (m + n) * total_k * dtype.itemsize / dev.bandwidth   # both operands read and written once
    after = gemm_seconds(1, m, n, total_k, dtype, dev) + dev.graph_launch_s + copies
    return after < before


def _fold(new: Graph, g: Graph, root, pieces, remap: dict[int, int]) -> int:
    """Append the concatenated operands and their product to `new`; return the product."""
    m, n = root.shape
    dtype = root.dtype
    sizes = tuple(k for _, _, k in pieces)
    total = sum(sizes)

    def operand(side: int) -> int:
        # side 0: [m, K] pieces joined along dim 1; side 1: [K, n] pieces along dim 0.
        # Pieces read transposed are joined along the other dim and the result transposed
        # back (a cat of transposes is the transpose of a cat).
        nodes = [p[side][0] for p in pieces]
        flip = pieces[0][side][1]
        along = int((side == 0) != flip)
        shape = [g[nodes[0]].shape[0], g[nodes[0]].shape[1]]
        shape[along] = total
        shape = tuple(shape)
        cat = new.add(CAT, "cat", tuple(Ref(remap[x]) for x in nodes), shape, dtype, contiguous_strides(shape),
                      (("dim", along), ("sizes", sizes)))
        if not flip:
            return cat
        t = shape[::-1]
        return new.add(VIEW, "permute", (Ref(cat),), t, dtype, contiguous_strides(t), (("dims", (1, 0)),))

    a, b = operand(0), operand(1)
    attrs = (("reason", "compute-intensive: vendor library"), ("multi", False),
             ("fx_name", f"folded_mm_{root.id}"))
    out = new.add(OPAQUE, MM, (Ref(a), Ref(b)), (m, n), dtype, contiguous_strides((m, n)), attrs)
    new.eager_calls[out] = (torch.ops.aten.mm.default, (Ref(a), Ref(b)), {})
    return out


__all__ = ["fold_product_sums", "MIN_PIECES"]
