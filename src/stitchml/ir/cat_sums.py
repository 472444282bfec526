"""Sums of zero-padded concatenations folded into one concatenation.

Autograd accumulates the gradient of a tensor read slice by slice (a recurrence written
out step by step reads `x[:, t]` at every step t) by adding the slices' backward
results, each its gradient padded with zeros to the full size: `cat(0, g_t, 0)` along
the sliced dim.  T steps give T - 1 adds of T such concatenations, which one kernel then
evaluates at every element: every step's masked load, select and add (DIEN's GRU
backward over 50 steps: 50 loads, ~150 selects and 49 adds an element; sm_90: 512 bytes
of stack, the issue floor 11x the copy floor).

Where two added concatenations along one dim have non-zero pieces that do not overlap,
each position of the sum is one piece's value plus zero: the sum is the concatenation of
the non-zero pieces of both, the gaps filled with zeros.  Folded in topological order, a
chain of such adds becomes one concatenation of the T gradients.  `x + 0` is `x` for
every value, NaN and infinities included; the one difference is the sign of a zero: a
-0.0 gradient stays -0.0, where eager's `-0.0 + 0.0` gives +0.0 (equal under `==`).
"""
from __future__ import annotations

from .nodes import CAT, POINTWISE, REDUCE, VIEW, Graph, Node, Ref, contiguous_strides
from .add_trees import add_trees
from .rewrite import rebuild

Piece = tuple[int, int, "Ref | None"]   # (start, size, value); None: zeros
# a fold is made where the concatenation holds at least this many non-zero pieces: there a
# kernel reads them with one load (`codegen/emit_core.py::_cat_by_pointer`); a short chain
# costs a kernel little as it is, and a fold moves the kernel's place in the launch order
# (kernels are scheduled by their first node), which changed a few models' launch groups
MIN_PIECES = 4


def _is_zero(n: Node) -> bool:
    return n.kind == POINTWISE and n.op == "full" and not n.args and n.attr("value") == 0 \
        and not isinstance(n.attr("value"), bool)


def _pieces(g: Graph, n: Node) -> tuple[int, list[Piece]] | None:
    """A concatenation with static sizes: its dim and pieces (zero pieces as None)."""
    sizes = n.attr("sizes")
    if n.kind != CAT or not all(isinstance(s, int) for s in sizes):
        return None
    out, start = [], 0
    for ref, size in zip(n.args, sizes):
        out.append((start, size, None if _is_zero(g[ref.id]) else ref))
        start += size
    return n.attr("dim"), out


def _merged(a: list[Piece], b: list[Piece]) -> list[Piece] | None:
    """The non-zero pieces of both, in order, or None when two of them overlap."""
    nonzero = sorted((p for p in a + b if p[2] is not None), key=lambda p: p[0])
    for (s0, z0, _), (s1, _, _) in zip(nonzero, nonzero[1:]):
        if s1 < s0 + z0:
            return None
    return nonzero


def fold_cat_sums(g: Graph) -> Graph:
    """`g` with each add of two concatenations whose non-zero pieces are disjoint, and
    that holds `MIN_PIECES` or more of them, replaced by one concatenation (module doc);
    the adds of its chain before it are left to dead-node elimination.  `g` itself when
    there is none."""
    folds: dict[int, tuple[int, list[Piece]]] = {}
    cats: dict[int, tuple[int, list[Piece]]] = {}
    for n in g.nodes:   # which adds fold, in order: a folded add is a concatenation to later adds
        p = _pieces(g, n)
        if p is not None:
            cats[n.id] = p
        if n.kind != POINTWISE or n.op != "add" or len(n.args) != 2 or n.attrs \
                or not all(isinstance(a, Ref) for a in n.args):
            continue
        a, b = (cats.get(r.id) for r in n.args)
        if a is None or b is None or a[0] != b[0] or any(g[r.id].dtype != n.dtype or g[r.id].shape != n.shape
                                                         for r in n.args):
            continue
        merged = _merged(a[1], b[1])
        if merged is not None:
            cats[n.id] = (a[0], _filled(merged, n.shape[a[0]]))
            if len(merged) >= MIN_PIECES:
                folds[n.id] = cats[n.id]
    if not folds:
        return g

    def fold(new: Graph, n: Node, remap: dict[int, int]) -> int:
        dim, pieces = folds[n.id]
        parts = []
        for start, size, ref in pieces:
            if ref is None:
                shape = tuple(size if i == dim else s for i, s in enumerate(n.shape))
                parts.append(Ref(new.add(POINTWISE, "full", (), shape, n.dtype, contiguous_strides(shape),
                                         (("value", 0),))))
            else:
                parts.append(Ref(remap[ref.id]))
        if len(parts) == 1:   # one piece covers it all: a copy (the add is a value of its own)
            return new.add(POINTWISE, "identity", tuple(parts), n.shape, n.dtype, n.stride)
        return new.add(CAT, "cat", tuple(parts), n.shape, n.dtype, n.stride,
                       (("dim", dim), ("sizes", tuple(p[1] for p in pieces))))

    return rebuild(g, dict.fromkeys(folds, fold))


def _filled(nonzero: list[Piece], length: int) -> list[Piece]:
    """The non-zero pieces with zero pieces in the gaps, covering [0, length)."""
    out, at = [], 0
    for start, size, ref in nonzero:
        if start > at:
            out.append((at, start - at, None))
        out.append((start, size, ref))
        at = start + size
    if at < length:
        out.append((at, length - at, None))
    return out


def fold_reduction_sums(g: Graph) -> Graph:
    """`g` with each tree of adds whose leaves are `MIN_PIECES` or more sums over the same
    dims of same-shaped values (reshaped views of them aside) replaced by one sum over
    their concatenation along the first reduced dim.  Autograd accumulates the gradient
    of a parameter a recurrence uses at every step (a GRU's bias, through 50 steps) as an
    add of each step's column sum: 50 column reductions, each a kernel of partials and a
    combine (DIEN's training step: 200 of its 327 launches), become one reduction that
    reads each step's value once (`codegen/emit_core.py::_cat_by_pointer`).  The sum is
    reassociated, as every split reduction is: rounded once, in the reduction's
    accumulation type, where eager rounds each partial sum and each add (closer to the
    exact sum, not bit-equal to eager's).  Only where the adds and the reductions are read
    by the tree alone (not a graph output, not another reader)."""
    users = g.users()
    outs = set(g.output_ids())

    def leaf(nid: int) -> tuple[int, set[int]] | None:
        """A sum read by the tree alone, seen through reshapes read by it alone."""
        chain = []
        n = g[nid]
        while n.kind == VIEW and n.op == "reshape":
            chain.append(n.id)
            n = g[n.refs[0]]
        if n.kind != REDUCE or n.op != "sum" or n.attr("split_chunks") or n.attr("split_of"):
            return None
        if any(len(users[c]) != 1 or c in outs for c in [n.id, *chain]):
            return None
        return n.id, {n.id, *chain}

    def like(n: Node, found: list[int]) -> bool:
        """Sums over the same dims of same-shaped values, of the add's dtype and size."""
        first = g[found[0]]
        src = g[first.refs[0]]
        return bool(first.attr("dims")) and all(
            g[r].attr("dims") == first.attr("dims") and g[r].dtype == first.dtype == n.dtype
            and g[r].numel == n.numel and g[g[r].refs[0]].shape == src.shape
            and g[g[r].refs[0]].dtype == src.dtype for r in found)

    roots = {a: leaves for a, (leaves, _) in add_trees(g, leaf, like, MIN_PIECES).items()}
    if not roots:
        return g

    def fold(new: Graph, n: Node, remap: dict[int, int]) -> int:
        # (in their sources' order: a product fold over the same steps then builds the same
        # concatenation, `ir/product_sums.py`, and `merge_duplicates` keeps one)
        reds = sorted(roots[n.id], key=lambda r: g[r].refs[0])
        r0 = g[reds[0]]
        src = g[r0.refs[0]]
        dim = r0.attr("dims")[0]
        shape = tuple(s * len(reds) if i == dim else s for i, s in enumerate(src.shape))
        cat = new.add(CAT, "cat", tuple(Ref(remap[g[r].refs[0]]) for r in reds), shape, src.dtype,
                      contiguous_strides(shape), (("dim", dim), ("sizes", (src.shape[dim],) * len(reds))))
        total = new.add(REDUCE, "sum", (Ref(cat),), r0.shape, r0.dtype, r0.stride, r0.attrs)
        if r0.shape != n.shape:
            total = new.add(VIEW, "reshape", (Ref(total),), n.shape, n.dtype, n.stride)
        return total

    return rebuild(g, dict.fromkeys(roots, fold))


__all__ = ["fold_cat_sums", "fold_reduction_sums"]
