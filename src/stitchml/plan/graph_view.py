"""Planner's view of the IR graph: which nodes are kernel members, which are free
index maps, and the effective producer/consumer edges through those free nodes."""
from __future__ import annotations

import copy
from dataclasses import replace
from functools import cached_property
from typing import Callable, Iterable, Iterator

from ..ir import nodes as ir
from ..ir.dce import mutates
from .placement import is_placed, written_parts

# Pure functions of the element index: duplicated into every kernel that reads them.
FREE_POINTWISE = frozenset({"full", "iota"})
EXPENSIVE = frozenset({"exp", "exp2", "log", "log2", "log1p", "expm1", "tanh", "pow", "erf", "sin", "cos",
                       "sigmoid"})


def is_free(n: ir.Node) -> bool:
    return n.kind == ir.VIEW or (n.kind == ir.POINTWISE and (n.op in FREE_POINTWISE or bool(n.attr("recompute")))) \
        or (n.kind == ir.CAT and bool(n.attr("recompute")))


# element-wise ops cheap enough to compute again in every kernel that reads them
CHEAP = frozenset({"add", "sub", "mul", "neg"})
# and, weighed against a plan's kernels (`cheap_chains` with `leaf_ok`), comparisons and
# selects: a ReLU's backward, where(relu_out <= 0, 0, dy), whose float32 cast a
# channels-last batch-norm backward's partial kernel otherwise writes for its dx kernel
SELECTS = frozenset({"where", "le", "lt", "ge", "gt", "eq", "ne", "logical_not", "bitwise_and", "bitwise_or"})


def view_base(g: ir.Graph, nid: int) -> ir.Node:
    n = g[nid]
    while n.kind == ir.VIEW:
        n = g[n.refs[0]]
    return n


def _constant(g: ir.Graph, a) -> bool:
    """A scalar operand, or a filled constant tensor."""
    if not isinstance(a, ir.Ref):
        return True
    base = view_base(g, a.id)
    return base.kind == ir.POINTWISE and base.op == "full"


def _is_source(n: ir.Node) -> bool:
    """A value no kernel computes: a graph input, an eager op's result, or a
    concatenation whose parts are written into its buffer (`placement.py`)."""
    return n.kind in (ir.INPUT, ir.OPAQUE, ir.ITEM) or is_placed(n)


def cheap_chains(g: ir.Graph, free: Callable[[int], bool] | None = None, leaf_ok: Callable[[int], bool] | None = None,
                 cats: bool = False) -> Iterator[tuple[int, frozenset[int]]]:
    """Casts of sources (graph inputs, eager results) and cheap element-wise ops (add,
    sub, mul, neg, division by a constant) and casts whose operands are sources or such nodes (through views), with at
    most two full-size sources in all, in graph order: (node, its sources).  Sources
    broadcast from a tenth of the value's size or less (a norm's saved per-row mean and
    rstd, a weight vector) do not count towards the two: a reader re-reads them from
    cache, so a layer norm's normalised input (x - mean) * rstd is a chain of one source.
    With `free` (a predicate, asked as the walk reaches each node), a chain passes only
    through nodes for which it holds.  With `leaf_ok` (a predicate on a value computed in
    a kernel), such values are leaves too where it holds (a plan's written values: a
    batch norm's per-channel mean, a gradient a kernel writes anyway and a later kernel
    reads as its float32 cast), constants are leaves of no bytes, and comparisons and
    selects (`SELECTS`) are cheap too."""
    chains: dict[int, frozenset[int]] = {}

    def leaf_of(nid: int) -> frozenset[int] | None:
        found = leaves(nid)
        if found is None and leaf_ok is not None:
            base = view_base(g, nid)
            if leaf_ok(base.id):
                return frozenset({base.id})
            if base.kind == ir.POINTWISE and base.op in FREE_POINTWISE:
                return frozenset()   # a constant: every reader computes it anyway
        return found

    cheap = CHEAP | SELECTS if leaf_ok is not None else CHEAP

    def leaves(nid: int) -> frozenset[int] | None:
        n = view_base(g, nid)
        if _is_source(n):
            return frozenset({n.id})
        return chains.get(n.id) if free is None or free(n.id) else None

    for n in g.nodes:
        if n.kind == ir.CAT and cats and leaf_ok is not None:
            # a concatenation reads each position from one part: recomputed, a reader
            # loads the part it needs under masks (a pooling window of the -inf padded
            # input, the residue classes of a pooling backward interleaved), so the two
            # full-size sources are counted per part, against the part's size
            parts = [(leaf_of(r), g[r].numel) for r in n.refs]
            if parts and all(p is not None and len(_full_size(g, p, size)) <= 2 for p, size in parts):
                leaf = frozenset().union(*(p for p, _ in parts))
                chains[n.id] = leaf
                yield n.id, leaf
            continue
        if n.kind != ir.POINTWISE or not n.refs:
            continue
        if n.op == "cast":
            # of a source, or of a chain (an RMSNorm backward's float32 copy of dy * w)
            if (found := leaf_of(n.refs[0])) is not None:
                chains[n.id] = found
                yield n.id, found
        elif n.op in cheap or n.op == "truediv" and not isinstance(n.args[1], ir.Ref) \
                or leaf_ok is not None and n.op in ("tdiv", "fmod") and _constant(g, n.args[1]):
            # (a division by a constant costs what a multiply does: a batch norm's mean, sum / N;
            # an integer one a multiply and a shift: a max-pool's window offset // kw, % kw)
            parts = [leaf_of(r) for r in n.refs]
            if any(p is None for p in parts):
                continue
            leaf = frozenset().union(*parts)
            if len(_full_size(g, leaf, n.numel)) <= 2:
                chains[n.id] = leaf
                yield n.id, leaf


def source_bytes(g: ir.Graph, leaf: Iterable[int]) -> int:
    return sum(g[s].numel * g[s].dtype.itemsize for s in leaf)


def _full_size(g: ir.Graph, leaf, numel: int) -> list[int]:
    """The sources of a chain that count (`cheap_chains`): those not broadcast from a
    tenth of its `numel` or less."""
    return [s for s in leaf if g[s].numel * 10 > numel]


def mark_recompute(g: ir.Graph, ids: Iterable[int] | dict[int, str],
                   reason: str = "a cheap chain of sources") -> ir.Graph:
    """A copy of `g` whose nodes `ids` are free: computed by every kernel that reads them.
    The attribute holds why (`explain` lists it); `ids` may be a mapping of id to reason."""
    out = copy.copy(g)
    out.nodes = list(g.nodes)
    for p in ids:
        why = ids[p] if isinstance(ids, dict) else reason
        out.nodes[p] = replace(g[p], attrs=g[p].attrs + (("recompute", why),))
    return out


def recompute_cheap(g: ir.Graph) -> ir.Graph:
    """Values that every reading kernel computes itself instead of one kernel writing them:

    - casts of values no kernel computes (graph inputs, eager results): converting on the
      fly reads the source (bf16: 2 bytes an element) where a materialised cast would be
      written once and read by each consuming kernel (fp32: 4 + 4 bytes);
    - cheap element-wise ops (add, sub, mul, neg) of such sources — at most two of full
      size, through views and casts of the first kind, and any broadcast small ones —
      whose result is at least as wide as its full-size sources: a softmax backward's
      float32 dy * y from two bf16 tensors, which a long-row split otherwise writes (134 MB
      at [128, 262144]) for a later kernel that reads y anyway; a layer norm backward's
      (x - mean) * rstd and dy * that, which the row kernel of few long rows otherwise
      writes (268 MB) for the dx and column-sum kernels.  Each reader then reads at most
      the bytes it would have read (and the small sources again, from cache).
      (Narrower results are weighed against the plan's kernels: `planner._cheaper_recomputed`.)

    A value that must exist as a tensor (a graph output, an eager op's operand) stays a
    kernel member."""
    picked: set[int] = set()
    escapes = None
    for nid, leaf in cheap_chains(g, free=lambda m: m in picked):
        n = g[nid]
        of_source = n.op == "cast" and _is_source(view_base(g, n.refs[0]))
        if not of_source and source_bytes(g, _full_size(g, leaf, n.numel)) > n.numel * n.dtype.itemsize:
            continue
        escapes = GraphView(g).escapes if escapes is None else escapes
        if nid not in escapes:
            picked.add(nid)
    return mark_recompute(g, sorted(picked)) if picked else g


def is_member(n: ir.Node) -> bool:
    return n.kind in ir.STITCHABLE and not is_free(n) and not is_placed(n) or n.kind == ir.SCATTER_ADD


class GraphView:
    def __init__(self, g: ir.Graph):
        self.g = g

    @cached_property
    def users(self) -> dict[int, list[int]]:
        users = self.g.users()
        # mutation fences: an eager op that writes its first argument runs after every
        # earlier reader of that buffer and before every later one
        for n in self.g.nodes:
            if n.kind == ir.OPAQUE and self.mutates(n):
                target = n.refs[0] if n.refs else None
                for r in self.readers(target):
                    if r < n.id and n.id not in users[r]:
                        users[r].append(n.id)
                    elif r > n.id and r not in users[n.id]:
                        users[n.id].append(r)
        # a placed concatenation is complete once its parts are written: whatever reads it
        # runs after the kernels that write them (no kernel computes it to carry the edge)
        for n in self.g.nodes:
            if is_placed(n):
                readers = self.consumers[n.id]
                for p in written_parts(self.g, n.id):
                    users[p].extend(r for r in readers if r not in users[p])
        return users

    def mutates(self, n: ir.Node) -> bool:
        """Whether eager op `n` writes its first argument (a mutation fence)."""
        return mutates(self.g, n)

    def readers(self, nid: int | None) -> list[int]:
        """Nodes reading the value, directly or through views (a view's readers too)."""
        if nid is None:
            return []
        out, stack = [], [nid]
        base = self.g.users()
        while stack:
            for u in base[stack.pop()]:
                out.append(u)
                if self.g[u].kind == ir.VIEW:
                    stack.append(u)
        return out

    @cached_property
    def sources(self) -> dict[int, tuple[int, ...]]:
        """Non-free nodes each node reads, looking through free nodes."""
        memo: dict[int, tuple[int, ...]] = {}
        for n in self.g.nodes:
            acc: dict[int, None] = {}
            for r in n.refs:
                if is_free(self.g[r]):
                    acc.update(dict.fromkeys(memo[r]))
                else:
                    acc[r] = None
            memo[n.id] = tuple(acc)
        return memo

    @cached_property
    def consumers(self) -> dict[int, tuple[int, ...]]:
        """Non-free nodes reading each node's value (through free nodes)."""
        out: dict[int, list[int]] = {n.id: [] for n in self.g.nodes}
        for n in self.g.nodes:
            if is_free(n):
                continue
            for s in self.sources[n.id]:
                out[s].append(n.id)
        return {k: tuple(dict.fromkeys(v)) for k, v in out.items()}

    @cached_property
    def escapes(self) -> set[int]:
        """Nodes whose value must exist as a real tensor: graph outputs and operands of
        eager ops, looking through free nodes (which are then replayed eagerly)."""
        need: set[int] = {n.id for n in self.g.nodes if n.attr("placed_in") is not None}   # (written in place)
        stack = list(self.g.output_ids())
        for n in self.g.nodes:
            if n.kind in (ir.OPAQUE, ir.ITEM):
                stack.extend(n.refs)
        seen = set()
        while stack:
            nid = stack.pop()
            if nid in seen:
                continue
            seen.add(nid)
            need.add(nid)
            if is_free(self.g[nid]):
                stack.extend(self.g[nid].refs)
        return need
