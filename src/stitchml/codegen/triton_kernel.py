"""Plan kernel → Triton source: one driver per kernel form.

The forms (`plan/mapping.py`) differ only in how programs cover the domain; what a
kernel computes is pulled the same way in every form (`emit_core.py`), reductions
and stores are shared (`emit_reduce.py`, `emit_store.py`):

- `pointwise`: a flat block of elements per program;
- `row_persistent` / `packed_rows`: one or several whole rows per program, held in
  registers; with column partials the program walks several row blocks (grid stride);
- `row_looped`: one row per program, walked in column blocks: one loop per group of
  reductions (`plan/row_loops.py`), then one loop for the element-wise outputs;
  row values are hoisted out of the loops; with column partials a few rows per
  program, the last loop storing each column block's partial over them;
- `combine`: the partials of column reductions reduced into their outputs.
"""
from __future__ import annotations

import contextlib
import sys
from dataclasses import replace
from typing import Callable, Iterator

import torch

from ..ir import index as ix
from ..ir import nodes as ir
from ..plan.data import Domain, KernelPlan, Mapping
from .emit_core import COL, ROW, KernelBuilder, Val, vector_elems
from .emit_reduce import Reductions
from .emit_store import Stores
from .kernel_source import KernelSource
from .prefetch import prefetched_walk
from .triton_ops import REDUCE_COMBINE, TL_DTYPE, cast_expr, compute_dtype, reduce_identity, round_half, store_expr


def _rows(b: KernelBuilder, pid: str, blocks: int | None = None) -> None:
    """Row variables of the program's row block (a flat block for point-wise kernels).
    `blocks`: how many row blocks `pid` walks, where it is a loop's variable (else the
    launch grid's program ids)."""
    tail = "" if b.flat else "[:, None]"
    b.row_pid = pid
    b.top.lines += [f"rflat = {pid} * {b.m.block_r} + tl.arange(0, {b.m.block_r}){tail}",
                    f"rmask = {_row_mask(b, b.m.grid if blocks is None else blocks)}", "zr = rflat * 0"]
    b.vars = b.define_vars(b.top, ROW)


def _row_mask(b: KernelBuilder, blocks: int) -> str:
    """`rflat < rows`, or a constant True where the row block divides the rows and no
    program's block starts past them (`KernelPlan.exact_rows`).  Triton folds the
    constant: a masked load then `where(mask, x, identity)` cost a select and predicate
    work per element in sm_90 SASS.  (A horizontal or global launch hands each body
    program ids below its own grid: `codegen/composite.py`.)"""
    rows, br = b.dom.rows, b.m.block_r
    if b.k.exact_rows and rows % br == 0 and blocks * br <= rows:
        return f"tl.full([{br}{'' if b.flat else ', 1'}], True, tl.int1)"
    return f"rflat < {rows}"


def _flat_index(b: KernelBuilder) -> None:
    dom = b.dom
    col_dims = list(dom.col_dims)
    b.col_flat = ix.flatten(tuple(b.vars[d] for d in col_dims), tuple(dom.shape[d] for d in col_dims))
    row_dims = [d for d in range(len(dom.shape)) if d not in dom.col_dims]
    b.row_flat = ix.flatten(tuple(b.vars[d] for d in row_dims), tuple(dom.shape[d] for d in row_dims))


def _outputs(b: KernelBuilder, stores: Stores) -> tuple[list[int], list[int]]:
    outputs = [o for o in b.k.outputs if o not in b.k.partials]
    return [o for o in outputs if not stores.is_full(o)], [o for o in outputs if stores.is_full(o)]


def emit_pointwise(b: KernelBuilder, stores: Stores) -> list[str]:
    _rows(b, _pid(b))
    for o in b.k.outputs:
        stores.store(o)
    return b.top.lines


def emit_rows(b: KernelBuilder, stores: Stores) -> list[str]:
    """Whole rows in registers; with column partials, a grid-stride walk over row blocks
    (the grid is written out, not tl.num_programs: as a phase of a global kernel the
    launch grid differs)."""
    blocks = -(-b.dom.rows // b.m.block_r)
    _rows(b, "rblk.to(tl.int64)" if b.k.partials and b.idx64 else "rblk" if b.k.partials else _pid(b),
          blocks if b.k.partials else None)
    segmented = not b.top.has_col
    if segmented:   # a row as segments side by side (`Mapping.segments`)
        b.open_segments()
    else:
        b.top.lines += [f"cflat = {b.col_arange()}", f"cmask = cflat < {b.dom.cols}",
                        "zc = cflat * 0"]
        b.vars.update(b.define_vars(b.top, COL))
    _flat_index(b)
    for o in b.k.partials:
        if not segmented:
            stores.partial(o)
            continue
        for i in range(b.m.segments):   # (`mapping.segmented_partials`)
            with b.in_segment(i):
                stores.partial(o, i)
    row_level, full_level = _outputs(b, stores)
    for o in row_level:
        stores.store(o)
    for o in full_level:
        if not segmented:
            stores.store(o)
            continue
        for i in range(b.m.segments):
            with b.in_segment(i):
                stores.store(o)
    if not b.k.partials:
        return b.top.lines
    walk = None
    if b.k.prefetch and isinstance(blocks, int) and isinstance(b.m.grid, int):
        # the next row block's loads issued before this one's arithmetic (None: the body
        # has nothing to hoist, the plain walk stays)
        walk = prefetched_walk(b.top.lines, "rblk", "tl.program_id(0)", blocks, b.m.grid)
    if walk is None:
        walk = [f"for rblk in range(tl.program_id(0), {blocks}, {b.m.grid}):"] + ["    " + x for x in b.top.lines]
    return stores.before + walk + stores.after


def emit_looped(b: KernelBuilder, stores: Stores) -> list[str]:
    """Rows walked in column blocks; with column partials the program holds several rows
    and its last loop stores, per column block, the block's sums over those rows.
    `row_blocks` > 1 is a persistent grid: each program walks rows with a grid stride
    (`plan/mapping.py::persistent_looped`), with column partials adding each row block's
    sums into its partial row (`mapping.walking_looped_partials`)."""
    stride = b.m.row_blocks > 1
    blocks = -(-b.dom.rows // b.m.block_r)
    _rows(b, ("rblk.to(tl.int64)" if b.idx64 else "rblk") if stride else _pid(b), blocks if stride else None)
    for d in b.dom.col_dims:   # loop scopes define the c* names; the symbols are shared
        b.vars[d] = ix.var(f"c{d}", b.dom.shape[d], COL)
    _flat_index(b)
    row_level, full_level = _outputs(b, stores)
    for o in row_level:
        stores.store(o)
    if full_level or b.k.partials:
        b.open_loop()
        for o in full_level:
            stores.store(o)
        for o in b.k.partials:
            stores.looped_partial(o)
        b.close_loop()
    if stride:
        return [f"for rblk in range(tl.program_id(0), {blocks}, {b.m.grid}):"] + ["    " + x for x in b.top.lines]
    return b.top.lines


DRIVERS: dict[str, Callable[[KernelBuilder, Stores], list[str]]] = {
    "pointwise": emit_pointwise, "row_persistent": emit_rows, "packed_rows": emit_rows, "row_looped": emit_looped,
}


def _pid(b: KernelBuilder) -> str:
    return "tl.program_id(0).to(tl.int64)" if b.idx64 else "tl.program_id(0)"


@contextlib.contextmanager
def _recursion_room(g: ir.Graph) -> Iterator[None]:
    # pulling recurses once per dependency level (a few frames per node): allow as
    # many levels as the graph has nodes, e.g. 100 unrolled simulator steps
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old, min(8 * len(g.nodes) + 1000, 200_000)))
    try:
        yield
    finally:
        sys.setrecursionlimit(old)


def generate(g: ir.Graph, k: KernelPlan) -> KernelSource:
    if k.mapping.form == "combine":
        return generate_combine(g, k)
    with _recursion_room(g):
        b = KernelBuilder(g, k)
        b.reductions = Reductions(b)
        body = DRIVERS[k.mapping.form](b, Stores(b))
    return KernelSource(k.name, list(b.params), [b.pname[p] for p in b.params], body, k.mapping.grid,
                        k.mapping.num_warps, {n: frozenset(v) for n, v in b.levels.items()})


def load_offsets(g: ir.Graph, k: KernelPlan) -> list[tuple[int, ix.Expr]]:
    """The global reads `k` would make, as (node, offset in the domain's variables):
    code generation run for its index analysis only (the planner's access probe)."""
    return access_offsets(g, k)[0]


def access_offsets(g: ir.Graph, k: KernelPlan) -> tuple[list[tuple[int, ix.Expr]], list[tuple[int, ix.Expr]]]:
    """The global reads and the element stores `k` would make, as (node, offset in the
    domain's variables): code generation run for its index analysis only."""
    with _recursion_room(g):
        b = KernelBuilder(g, k)
        b.reductions = Reductions(b)
        DRIVERS[k.mapping.form](b, Stores(b))
    return b.loads, b.stores


def row_alignment(g: ir.Graph, k: KernelPlan) -> tuple[int, ...]:
    """`KernelPlan.row_align` for a looped kernel of one row a program, as (row
    coefficient, constant, elements a 16-byte vector) of an anchor access, or ().
    GPT-2's logits are rows of 50257 bfloat16 values, row r starting 2r bytes past a
    16-byte boundary, so no whole column block of theirs could be read or stored in
    vectors.  Shifting the whole blocks to start at the anchor's boundary aligns every
    access congruent to it (`KernelBuilder.aligned_address`) and unaligns those that
    were aligned and are not: the anchor is the unaligned access that leaves the most
    bytes moved in vectors, and only if that beats not shifting.  Accesses are the
    loads and stores contiguous along the row (`KernelBuilder.row_linear`), each pass
    over a buffer counted."""
    with _recursion_room(g):
        b = KernelBuilder(g, replace(k, row_align=()))
        b.reductions = Reductions(b)
        DRIVERS[k.mapping.form](b, Stores(b))
    accesses = []   # (row coefficient, constant, elements a vector, bytes)
    for nid, off in b.loads + b.stores:
        lin = b.row_linear(off) if COL in ix.axes(off) else None
        if lin is not None and vector_elems(g[nid].dtype) > 1:
            accesses.append((*lin, vector_elems(g[nid].dtype), g[nid].numel * g[nid].dtype.itemsize))
    best, best_bytes = (), sum(n for kr, c, v, n in accesses if kr % v == 0 and c % v == 0)
    for ka, ca, va, _ in accesses:
        if ka % va == 0 and ca % va == 0:
            continue   # aligned already: no anchor
        vector = sum(n for kr, c, v, n in accesses if va % v == 0 and (kr - ka) % v == 0 and (c - ca) % v == 0)
        if vector > best_bytes:
            best, best_bytes = (ka, ca, va), vector
    return best


COMBINE_UNROLL_LOADS = 16   # a combine's steps x reductions unrolled at most (tile loads in flight)


def combine_waits(k: KernelPlan) -> int:
    """Memory latencies a program of combine kernel `k` waits one after another: one when
    its steps are unrolled (every load in flight at once), else one a step."""
    steps = -(-k.domain.shape[0] // max(k.mapping.block_r, 1))
    return 1 if steps * max(len(k.dominant), 1) <= COMBINE_UNROLL_LOADS else steps


def generate_combine(g: ir.Graph, k: KernelPlan) -> KernelSource:
    """Reduce the (programs x cols) partials of column reductions into their outputs.
    Each program owns `block_c` columns and reads `block_r` partial rows per step, so
    the partial rows are combined in a few wide steps rather than one load after
    another (a latency-bound chain of 2 x SMs dependent loads).  Every reduction's
    partials are read in the same steps, and where steps x reductions is at most
    `COMBINE_UNROLL_LOADS` the steps are unrolled (`tl.static_range`), so all the loads
    are in flight at once: a rolled loop waits a memory latency a step and reduction
    (H200, 2026-11-30: two BERT layer-norm-backward combines of 3 reductions x 3 steps,
    2.4 MB each, took 4.7 µs in one launch; bench/NOTES.md forty-eighth session)."""
    rows = k.domain.shape[0]
    br, bc = k.mapping.block_r, k.mapping.block_c
    lines = [f"c = tl.program_id(0) * {bc} + tl.arange(0, {bc})",
             f"p = tl.arange(0, {br})[:, None]"]
    accumulate, finish = [], []   # each reduction's step in the walk, and what follows the walk
    params, names = [], []
    casts = dict(k.combine_casts)   # a reduction stored as its cast (plan/planner.py::_absorb_casts)
    for i, nid in enumerate(k.dominant):   # (a combine's reductions)
        n = g[nid]
        dest = g[casts.get(nid, nid)]
        cols = n.numel
        cd = compute_dtype(n.dtype)
        ident = reduce_identity(n.op, cd)
        combine = REDUCE_COMBINE[n.op]
        off = ix.offset(ix.unravel(ix.var("c", cols, ROW), dest.shape), dest.stride)
        value = f"red{i}" if dest is n else cast_expr(f"red{i}", n.dtype, dest.dtype)
        store = store_expr(value, dest.dtype)
        reduced = f"tl.sum(acc{i}, 0)" if n.op == "sum" else f"tl.reduce(acc{i}, 0, {combine})"
        lines += [f"cmask{i} = c < {cols}", f"acc{i} = tl.full([{br}, {bc}], {ident}, {TL_DTYPE[cd]})"]
        accumulate.append(f"    acc{i} = {combine}(acc{i}, tl.load(part{i} + (r + p) * {cols} + c[None, :], "
                          f"mask=cmask{i}[None, :] & (r + p < {rows}), other={ident}))")
        finish.append(f"red{i} = {reduced}")
        params.append(("partial", nid))
        names.append(f"part{i}")
        if dest.id not in k.outputs:
            continue   # read by the epilogue only (`KernelPlan.epilogue`)
        # a one-element output has a constant offset: keep the pointer a block (c * 0)
        finish.append(f"tl.store(dst{i} + {ix.render(off) if ix.axes(off) else f'(c * 0 + {ix.render(off)})'}, "
                      f"{store}, mask=cmask{i})")
        params.append(("out", dest.id))
        names.append(f"dst{i}")
    unrolled = combine_waits(k) == 1 and rows > br
    lines += [f"for r in {'tl.static_range' if unrolled else 'range'}(0, {rows}, {br}):"] + accumulate + finish
    levels: dict[int, frozenset] = {}
    if k.epilogue:
        b = _epilogue(g, k, {nid: f"red{i}" for i, nid in enumerate(k.dominant)})
        lines += b.top.lines
        params += list(b.params)
        names += [b.pname[p] for p in b.params]
        levels = {n: frozenset(v) for n, v in b.levels.items()}
    return KernelSource(k.name, params, names, lines, k.mapping.grid, k.mapping.num_warps, levels)


class _EpilogueBuilder(KernelBuilder):
    """The emitter of a combine kernel's epilogue (`KernelPlan.epilogue`): a point-wise
    block over the combine's columns whose reductions are the combine's registers."""

    def __init__(self, g: ir.Graph, k: KernelPlan, reds: dict[int, str]):
        super().__init__(g, k)
        self.reds = reds

    def value(self, nid: int, index: tuple[ix.Expr, ...]) -> Val:
        if nid not in self.reds:
            return super().value(nid, index)
        n = self.g[nid]
        # the combine's lane j holds the reduction's element j in its natural order: only
        # a read at that element (through reshapes) is the register
        flat = ix.flatten(index, n.shape)
        lanes = {0, 1, n.numel - 1} if n.numel > 1 else {0}
        if any(ix.evaluate(flat, {"r0": j}) != j for j in lanes):
            raise ix.IndexMismatch(f"combine epilogue reads reduction {nid} off its lane")
        cd = compute_dtype(n.dtype)
        val = Val(self.reds[nid], frozenset({ROW}), cd)
        if n.dtype in (torch.float16, torch.bfloat16):   # read as stored, as every reader sees it
            val = self.emit(self.top, round_half(val.name, n.dtype), val.axes, cd)
        return val


def _epilogue(g: ir.Graph, k: KernelPlan, reds: dict[int, str]) -> KernelBuilder:
    """Emit `k`'s epilogue: its members at each of the combine's columns, its outputs
    stored; the program's columns are `tl.program_id(0) * block_c + arange(block_c)`,
    as the combine's own."""
    cols = g[k.dominant[0]].numel
    bc = k.mapping.block_c
    members = set(k.epilogue)
    ep = KernelPlan(k.name, k.epilogue, tuple(o for o in k.outputs if o in members), k.inputs, Domain((cols,)),
                    Mapping("pointwise", bc, 1, k.mapping.num_warps, k.mapping.grid), "local", (), ())
    b = _EpilogueBuilder(g, ep, reds)
    b.reductions = Reductions(b)
    b.row_pid = "tl.program_id(0)"
    b.top.lines += [f"rflat = tl.program_id(0) * {bc} + tl.arange(0, {bc})", f"rmask = rflat < {cols}",
                    "zr = rflat * 0"]
    b.vars = b.define_vars(b.top, ROW)
    stores = Stores(b)
    for o in ep.outputs:
        stores.store(o)
    return b


__all__ = ["DRIVERS", "KernelSource", "generate", "generate_combine", "row_alignment"]
