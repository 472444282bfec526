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
from .row_loops import online_partner


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
    chunks: dict[int, tuple[int, int]] = {}   # split amax -> (its chunked view, its chunk maxima)
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
        partner = online_partner(g, n)
        if partner is not None and partner in chunks and plan.get(partner) == s:
            remap[n.id] = _split_online_sum(new, n, chunks[partner], remap[partner], chunked)
            continue
        view = new.add(ir.VIEW, "reshape", (Ref(remap[src.id]),), chunked, src.dtype, contiguous_strides(chunked))
        acc = torch.float32 if n.dtype in (torch.float16, torch.bfloat16) else n.dtype
        part_shape = kept + (s,)
        part = new.add(ir.REDUCE, n.op, (Ref(view),), part_shape, acc, contiguous_strides(part_shape),
                       (("dims", (len(chunked) - 1,)), ("split_of", n.id)))
        final = new.add(ir.REDUCE, n.op, (Ref(part),), n.shape, n.dtype, n.stride,
                        (("dims", (len(part_shape) - 1,)), ("split_chunks", s)))
        remap[n.id] = final
        if n.op == "amax" and acc == n.dtype:
            chunks[n.id] = (view, part)
    finish_copy(new, g, remap)
    return new


def _split_online_sum(new: ir.Graph, n: ir.Node, chunk: tuple[int, int], row_max: int,
                      chunked: tuple[int, ...]) -> int:
    """`n = sum(exp(x - m))` (the online partner of the split `m = amax(x)`) split with
    it: per chunk the online pair (m_c = amax of the chunk, s_c = sum(exp(x - m_c))),
    so one pass over the row gives both, then s = sum(s_c * exp(m_c - m)) over the
    chunks.  A chunk whose maximum is -inf adds nothing (its s_c is NaN); a row whose
    maximum is -inf gets eager's NaN; a NaN maximum propagates."""
    view, m_c = chunk
    dt = n.dtype
    part_shape = chunked[:-1]
    ps = contiguous_strides(part_shape)

    def bcast(nid: int, from_shape: tuple[int, ...], to_shape: tuple[int, ...]) -> int:
        keep = from_shape + (1,) * (len(to_shape) - len(from_shape))
        r = new.add(ir.VIEW, "reshape", (Ref(nid),), keep, dt, contiguous_strides(keep))
        return new.add(ir.VIEW, "expand", (Ref(r),), to_shape, dt, (0,) * len(to_shape))

    # per chunk: s_c = sum(exp(x - m_c)), an online pair with m_c (plan/row_loops.py)
    diff = new.add(ir.POINTWISE, "sub", (Ref(view), Ref(bcast(m_c, part_shape, chunked))), chunked, dt,
                   contiguous_strides(chunked))
    e = new.add(ir.POINTWISE, "exp", (Ref(diff),), chunked, dt, contiguous_strides(chunked))
    s_c = new.add(ir.REDUCE, "sum", (Ref(e),), part_shape, dt, ps, (("dims", (len(chunked) - 1,)),
                                                                      ("split_of", n.id)))
    # over the chunks: rescale each chunk's sum to the row maximum
    m_b = bcast(row_max, n.shape, part_shape)
    scale = new.add(ir.POINTWISE, "exp", (Ref(new.add(ir.POINTWISE, "sub", (Ref(m_c), Ref(m_b)), part_shape, dt,
                                                       ps)),), part_shape, dt, ps)
    term = new.add(ir.POINTWISE, "mul", (Ref(s_c), Ref(scale)), part_shape, dt, ps)
    empty = new.add(ir.POINTWISE, "eq", (Ref(m_c), float("-inf")), part_shape, torch.bool, ps)
    term = new.add(ir.POINTWISE, "where", (Ref(empty), 0.0, Ref(term)), part_shape, dt, ps)
    total = new.add(ir.REDUCE, "sum", (Ref(term),), n.shape, dt, contiguous_strides(n.shape),
                    (("dims", (len(part_shape) - 1,)), ("split_chunks", chunked[-2])))
    all_inf = new.add(ir.POINTWISE, "eq", (Ref(row_max), float("-inf")), n.shape, torch.bool,
                      contiguous_strides(n.shape))
    return new.add(ir.POINTWISE, "where", (Ref(all_inf), float("nan"), Ref(total)), n.shape, dt, n.stride)


__all__ = ["split_long_rows", "split_plan"]
