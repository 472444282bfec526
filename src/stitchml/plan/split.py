"""Task splitting (AStitch's adaptive thread mapping for few, long rows).

A reduction with fewer rows than the programs one wave can hold, each row longer than
`split_min_cols`, cannot keep the GPU busy one row per program.  It is rewritten
before grouping: the reduced (trailing) elements are viewed as S chunks, reduced per
chunk into float32 partials (P·S rows of parallel work), then reduced over the chunks.
The usual grouping, global scheme and ILP then place the phases, so e.g. a softmax
over [64, 30000] becomes parallel phases in one persistent launch.

S is the smallest divisor of the row length that gives at least one wave of rows and
chunks of at least `split_min_cols` elements (a view needs S to divide the row).

Variances (layer norm's statistics: `sum(d)` and `sum(d*d)` with `d = x - r`, r a row
value such as the mean) would need a second pass over the row, after the mean.  Split,
they take their chunks' statistics instead: per chunk its mean m_c, and the sums of
x - m_c and of (x - m_c)^2 (lin_c, M2_c; a chunk is held in registers — these chunks are
kept within `persistent_max_cols` — so that is one pass), then over the chunks, with
e_c = m_c - r: sum(d) = sum_c(lin_c + C e_c), sum(d*d) = sum_c(M2_c + e_c (2 lin_c + C e_c))
(Chan's combination, kept exact for a rounded m_c by the lin_c term; no cancellation
between large sums).  One pass over the row gives the mean and the variance.
"""
from __future__ import annotations

import torch

from ..ir import nodes as ir
from ..ir.nodes import Ref, contiguous_strides, prod
from ..ir.rewrite import copy_node, finish_copy
from .options import PlanOptions
from .row_loops import through_views, online_partner


FALLBACK_MIN_CHUNKS = 16   # `_chunks` without a wave's divisor: the fewest chunks worth a split


def _chunks(rows: int, cols: int, opts: PlanOptions, persistent: bool = False) -> int | None:
    """The number of chunks, or None; `persistent`: chunks no longer than
    `persistent_max_cols` (held in registers), if there is such a divisor."""
    min_cols = opts.split_min_cols
    wave = 2 * opts.device.sms
    # (knob split_long_variance: a variance over rows too long for registers takes
    # chunk statistics whatever the row count: one walk of the row instead of three)
    long_variance = persistent and opts.split_long_variance and cols > opts.persistent_max_cols
    if (rows >= wave and not long_variance) or cols < 2 * min_cols:
        return None
    want = -(-wave // rows)
    if persistent:
        want = max(want, -(-cols // opts.persistent_max_cols))
    for s in range(max(want, 2), cols // min_cols + 1):
        if cols % s == 0:
            return s
    # no divisor gives a wave: the most chunks that divide the row (PoolFormer's float32
    # group norm over 320 x 14 x 14 = 62720 values a sample at a batch of 2: no divisor of
    # 62720 between the 132 chunks a wave wants and the 61 of 1024 elements, so its two
    # rows were two programs for the whole GPU; 56 chunks of 1120 are 112)
    # At least FALLBACK_MIN_CHUNKS: a short row's sum (a loss's mean over 8192 tokens, 8
    # chunks) would only gain a launch (the cross-entropy micro rows: 4 -> 5 launches)
    # (persistent chunks still no longer than `persistent_max_cols`)
    least = max(FALLBACK_MIN_CHUNKS, -(-cols // opts.persistent_max_cols) if persistent else 1)
    for s in range(min(want - 1, cols // min_cols), least - 1, -1):
        if cols % s == 0:
            return s
    return None


def _row_value(g: ir.Graph, nid: int, rows: int) -> int | None:
    """The node a reshape/expand chain broadcasts back from, if it holds one value per row."""
    src = through_views(g, nid)
    return src if prod(g[src].shape) == rows else None


def deviation_sum(g: ir.Graph, n: ir.Node) -> tuple[str, int, int] | None:
    """("sq" | "lin", x, r) when `n` is sum(d * d) or sum(d) over trailing dims with
    d = x - r, r one value per row broadcast back, in float32/float64; else None."""
    if n.kind != ir.REDUCE or n.op != "sum" or n.attr("split_chunks") or n.attr("split_of"):
        return None
    kind, d = "lin", g[n.refs[0]]
    if d.kind == ir.POINTWISE and d.op == "mul" and len(d.refs) == 2 and d.refs[0] == d.refs[1] \
            and all(isinstance(a, Ref) for a in d.args):
        kind, d = "sq", g[d.refs[0]]
    if d.kind != ir.POINTWISE or d.op != "sub" or len(d.refs) != 2 or not all(isinstance(a, Ref) for a in d.args):
        return None
    x, b = d.refs
    if (g[x].shape != d.shape or d.shape != g[n.refs[0]].shape or d.dtype != n.dtype or g[x].dtype != n.dtype
            or n.dtype not in (torch.float32, torch.float64)):
        return None
    r = _row_value(g, b, n.numel)
    return (kind, x, r) if r is not None and r != x else None


def _variance_sources(g: ir.Graph) -> set[tuple[int, tuple[int, ...]]]:
    """(x, dims) of every sum(d * d) with d = x - r: the reductions over x with those
    dims take persistent chunks, so that the mean and the variance share them."""
    out = set()
    for n in g.nodes:
        hit = deviation_sum(g, n)
        if hit and hit[0] == "sq":
            out.add((hit[1], n.attr("dims")))
    return out


def split_plan(g: ir.Graph, opts: PlanOptions) -> dict[int, int]:
    """Which reductions to split, and into how many chunks (plain data for tests)."""
    out = {}
    variance = _variance_sources(g)
    for n in g.nodes:
        if n.kind != ir.REDUCE or n.op not in ir.COMBINABLE_REDUCES:
            continue
        src = g[n.refs[0]]
        dims = n.attr("dims")
        nd = len(src.shape)
        if dims != tuple(range(nd - len(dims), nd)):  # only trailing dims view as chunks
            continue
        dev = deviation_sum(g, n)
        x = dev[1] if dev else src.id
        s = _chunks(n.numel, prod(src.shape[d] for d in dims), opts, persistent=(x, dims) in variance)
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
    stats = _ChunkStats(new, remap)           # per (x, chunked shape): the chunked view, sums, M2
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
        dev = deviation_sum(g, n)
        if dev is not None:
            remap[n.id] = stats.deviation_sum(n, dev, chunked)
            continue
        if n.op == "sum" and src.dtype == n.dtype and n.dtype in (torch.float32, torch.float64):
            # a plain row sum: its chunk sums are the ones a variance over the same rows uses
            view, part = stats.sums(src.id, src.dtype, chunked, n.id)
            remap[n.id] = new.add(ir.REDUCE, "sum", (Ref(part),), n.shape, n.dtype, n.stride,
                                  (("dims", (len(chunked) - 2,)), ("split_chunks", s)))
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


class _ChunkStats:
    """Chunk statistics of a split row source x, built once per (x, chunked shape) in the
    new graph: the chunked view, the chunk sums, and the chunk means with the sums of
    deviations from them and of their squares.  Keyed by the whole chunked shape, not the
    chunk count alone: two reductions of one x over different trailing dims (a layer norm
    over (1, 24, 4) and one over (24, 4) of the same value, fuzz seed 32036) split into
    the same number of chunks but keep different leading dims, and the second read the
    first's partials with its own dims (an IndexError in planning)."""

    def __init__(self, new: ir.Graph, remap: dict[int, int]):
        self.new, self.remap = new, remap
        self.views: dict[tuple[int, tuple[int, ...]], int] = {}
        self.sum_parts: dict[tuple[int, tuple[int, ...]], int] = {}
        self.m2_parts: dict[tuple[int, tuple[int, ...]], tuple[int, int, int]] = {}

    def view(self, x: int, dtype: torch.dtype, chunked: tuple[int, ...]) -> int:
        key = (x, tuple(chunked))
        if key not in self.views:
            self.views[key] = self.new.add(ir.VIEW, "reshape", (Ref(self.remap[x]),), chunked, dtype,
                                           contiguous_strides(chunked))
        return self.views[key]

    def sums(self, x: int, dtype: torch.dtype, chunked: tuple[int, ...], of: int) -> tuple[int, int]:
        key = (x, tuple(chunked))
        view = self.view(x, dtype, chunked)
        if key not in self.sum_parts:
            ps = chunked[:-1]
            self.sum_parts[key] = self.new.add(ir.REDUCE, "sum", (Ref(view),), ps, dtype, contiguous_strides(ps),
                                               (("dims", (len(chunked) - 1,)), ("split_of", of)))
        return view, self.sum_parts[key]

    def deviations(self, x: int, dtype: torch.dtype, chunked: tuple[int, ...], of: int) -> tuple[int, int, int]:
        """(chunk means m_c, chunk sums of x - m_c, chunk sums of (x - m_c)^2), each of
        the parts' shape.  The first sum is 0 only in exact arithmetic: m_c is rounded
        (by about an ulp of x), and the combination below uses it rather than assume it."""
        key = (x, tuple(chunked))
        new = self.new
        view, total = self.sums(x, dtype, chunked, of)
        ps = chunked[:-1]
        pst = contiguous_strides(ps)
        if key not in self.m2_parts:
            mean = new.add(ir.POINTWISE, "truediv", (Ref(total), float(chunked[-1])), ps, dtype, pst)
            dev = new.add(ir.POINTWISE, "sub", (Ref(view), Ref(_bcast(new, mean, ps, chunked, dtype))), chunked,
                          dtype, contiguous_strides(chunked))
            sq = new.add(ir.POINTWISE, "mul", (Ref(dev), Ref(dev)), chunked, dtype, contiguous_strides(chunked))
            attrs = (("dims", (len(chunked) - 1,)), ("split_of", of))
            lin = new.add(ir.REDUCE, "sum", (Ref(dev),), ps, dtype, pst, attrs)
            m2 = new.add(ir.REDUCE, "sum", (Ref(sq),), ps, dtype, pst, attrs)
            self.m2_parts[key] = (mean, lin, m2)
        return self.m2_parts[key]

    def deviation_sum(self, n: ir.Node, dev: tuple[str, int, int], chunked: tuple[int, ...]) -> int:
        """With e_c = m_c - r: sum(d) = sum_c(lin_c + C e_c) and
        sum(d*d) = sum_c(M2_c + e_c (2 lin_c + C e_c)) — exact for any m_c."""
        kind, x, r = dev
        new, dt = self.new, n.dtype
        ps = chunked[:-1]
        pst = contiguous_strides(ps)
        c = float(chunked[-1])

        def pw(op, *args):
            return new.add(ir.POINTWISE, op, tuple(Ref(a) if isinstance(a, int) and not isinstance(a, bool) else a
                                                   for a in args), ps, dt, pst)
        mean, lin, m2 = self.deviations(x, dt, chunked, n.id)
        e = pw("sub", mean, _bcast(new, self.remap[r], ps[:-1], ps, dt))
        ce = new.add(ir.POINTWISE, "mul", (Ref(e), c), ps, dt, pst)
        if kind == "lin":
            term = pw("add", lin, ce)
        else:
            twice = new.add(ir.POINTWISE, "mul", (Ref(lin), 2.0), ps, dt, pst)
            term = pw("add", m2, pw("mul", e, pw("add", twice, ce)))
        return new.add(ir.REDUCE, "sum", (Ref(term),), n.shape, dt, n.stride,
                       (("dims", (len(ps) - 1,)), ("split_chunks", chunked[-2])))


def _bcast(new: ir.Graph, nid: int, from_shape: tuple[int, ...], to_shape: tuple[int, ...], dt) -> int:
    """A row value (any shape of that many elements) broadcast over the trailing dims of
    `to_shape` (`from_shape`: its leading dims)."""
    keep = tuple(from_shape) + (1,) * (len(to_shape) - len(from_shape))
    r = new.add(ir.VIEW, "reshape", (Ref(nid),), keep, dt, contiguous_strides(keep))
    return new.add(ir.VIEW, "expand", (Ref(r),), to_shape, dt, (0,) * len(to_shape))


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
        return _bcast(new, nid, from_shape, to_shape, dt)

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
