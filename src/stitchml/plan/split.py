"""Task splitting (AStitch's adaptive thread mapping for few, long rows).

A reduction with fewer rows than the programs one wave can hold, each row longer than
`split_min_cols`, cannot keep the GPU busy one row per program.  It is rewritten
before grouping: the reduced (trailing) elements are viewed as S chunks, reduced per
chunk into float32 partials (P·S rows of parallel work), then reduced over the chunks.
The usual grouping, global scheme and ILP then place the phases, so e.g. a softmax
over [64, 30000] becomes parallel phases in one persistent launch.

S is the smallest divisor of the row length that gives at least one wave of rows and
chunks of at least `split_min_cols` elements (a view needs S to divide the row).
"""
from __future__ import annotations

import torch

from ..ir import nodes as ir
from ..ir.nodes import Ref, contiguous_strides, prod
from ..ir.rewrite import copy_node, finish_copy
from .options import PlanOptions


def _chunks(rows: int, cols: int, opts: PlanOptions) -> int | None:
    min_cols = opts.split_min_cols
    wave = 2 * opts.device.sms
    if rows >= wave or cols < 2 * min_cols:
        return None
    want = -(-wave // rows)
    for s in range(max(want, 2), cols // min_cols + 1):
        if cols % s == 0:
            return s
    return None


def split_plan(g: ir.Graph, opts: PlanOptions) -> dict[int, int]:
    """Which reductions to split, and into how many chunks (plain data for tests)."""
    out = {}
    for n in g.nodes:
        if n.kind != ir.REDUCE or n.op not in ir.COMBINABLE_REDUCES:
            continue
        src = g[n.refs[0]]
        dims = n.attr("dims")
        nd = len(src.shape)
        if dims != tuple(range(nd - len(dims), nd)):  # only trailing dims view as chunks
            continue
        s = _chunks(n.numel, prod(src.shape[d] for d in dims), opts)
        if s:
            out[n.id] = s
    return out


def split_long_rows(g: ir.Graph, opts: PlanOptions) -> ir.Graph:
    plan = split_plan(g, opts)
    if not plan:
        return g
    new = ir.Graph(inputs=[], outputs=[], fallbacks=list(g.fallbacks))
    remap: dict[int, int] = {}
    for n in g.nodes:
        if n.id not in plan:
            copy_node(new, g, n, remap)
            continue
        s = plan[n.id]
        src = g[n.refs[0]]
        dims = n.attr("dims")
        kept = src.shape[:len(src.shape) - len(dims)]
        cols = prod(src.shape[d] for d in dims)
        chunked = kept + (s, cols // s)
        view = new.add(ir.VIEW, "reshape", (Ref(remap[src.id]),), chunked, src.dtype, contiguous_strides(chunked))
        acc = torch.float32 if n.dtype in (torch.float16, torch.bfloat16) else n.dtype
        part_shape = kept + (s,)
        part = new.add(ir.REDUCE, n.op, (Ref(view),), part_shape, acc, contiguous_strides(part_shape),
                       (("dims", (len(chunked) - 1,)), ("split_of", n.id)))
        final = new.add(ir.REDUCE, n.op, (Ref(part),), n.shape, n.dtype, n.stride,
                        (("dims", (len(part_shape) - 1,)), ("split_chunks", s)))
        remap[n.id] = final
    finish_copy(new, g, remap)
    return new


__all__ = ["split_long_rows", "split_plan"]
