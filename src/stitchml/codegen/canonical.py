"""What the code generator reads for a kernel, written as text without node ids.

Two kernels whose canonical texts are equal generate equal code up to node ids: the
same layer's kernel in layer 1 and layer 12 of a transformer.  The text is the key of
everything that caches code generation by content: the kernel-source cache
(`runtime/kernel_cache.py`, in memory and on disk) and the planner's dry runs of the
index analysis (`codegen/probes.py`, in memory).  Its completeness is what makes
those caches correct: every `KernelPlan` field the emitters read is in it
(tests/test_canonical.py checks the emitters' sources for fields left out).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import config
from ..ir.nodes import Graph, Ref

if TYPE_CHECKING:
    from ..plan.data import KernelPlan

# knobs that change generated code (the rest only change planning, which is in the text)
CODE_KNOBS = ("pointwise_block", "persistent_max_cols", "loop_block_cols", "block_elems", "tuple_reductions")

# KernelPlan fields the text leaves out: the code generator does not read them (planning
# and pricing only); tests/test_canonical.py fails when an emitter starts reading one
NOT_READ_BY_CODEGEN = ("name", "bytes_read", "bytes_written", "predicted_s", "row_runs", "own_warps",
                       "sector_waste", "walk_note", "completes", "loop_waits")


def code_knobs() -> tuple[tuple[str, Any], ...]:
    """The current values of CODE_KNOBS (part of every key of generated code)."""
    return tuple((name, config.get(name)) for name in CODE_KNOBS)


def closure(g: Graph, k: KernelPlan) -> list[int]:
    """The nodes a kernel's code reads: members, inputs, and the views/point-wise
    nodes pulled through between them, in id order."""
    inputs = set(k.inputs)
    nodes = set(k.members) | inputs | {r for m in k.members for r in g[m].refs}
    stack = list(nodes)
    while stack:
        n = g[stack.pop()]
        if n.id in inputs:
            continue
        for r in n.refs:
            if r not in nodes:
                nodes.add(r)
                if g[r].kind in ("view", "pointwise", "cat") and r not in inputs:   # (free cats: recomputed)
                    stack.append(r)
    return sorted(nodes)


def _renumber(a: Any, ids: dict[int, int]) -> Any:
    # (exact type tests: called ~100 k times planning a 12-layer BERT step)
    t = type(a)
    if t is Ref:
        return ("ref", ids.get(a.id, "ext"))
    if t is tuple or t is list:
        return tuple([_renumber(x, ids) for x in a]) if a else ()
    return a


def canonical_kernel(g: Graph, k: KernelPlan) -> tuple[str, list[int]]:
    """A text that describes everything the code generator reads for kernel `k`, with
    node ids replaced by their position in the kernel's closure, and that closure.
    Two kernels with equal texts generate equal code up to node ids."""
    nodes = closure(g, k)
    ids = {nid: i for i, nid in enumerate(nodes)}
    inputs = set(k.inputs)
    parts = []
    for nid in nodes:
        n = g[nid]
        if nid in inputs:  # read from memory: only its layout matters
            parts.append(("in", n.kind, n.shape, str(n.dtype), n.stride))
        else:
            parts.append((n.kind, n.op, _renumber(n.args, ids), n.shape, str(n.dtype), n.stride,
                          _renumber(n.attrs, ids)))
    plan = (k.domain, k.mapping, k.scheme,
            *(tuple(ids.get(x, "ext") for x in t) for t in (k.members, k.outputs, k.inputs, k.dominant,
                                                             k.seeds, k.partials)),
            tuple((ids.get(a, "ext"), ids.get(b, "ext"), s) for a, b, s in k.stitches),
            bool(k.combine_of),
            # (the emitter reads these too: row vectors of a transposed tile, the column tail)
            tuple(ids.get(x, "ext") for x in k.transposed), k.column_tail, k.exact_rows, k.row_align,
            tuple((ids.get(a, "ext"), ids.get(b, "ext")) for a, b in k.combine_casts),
            tuple(ids.get(x, "ext") for x in k.epilogue), k.prefetch)
    return repr((parts, plan)), nodes
