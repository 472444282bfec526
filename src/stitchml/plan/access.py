"""Access patterns of a planned kernel, probed at plan time.

Which of a kernel's reads are *transposed*: unit stride along the domain's innermost
row dimension and a large stride along its innermost column dimension (a gradient
that arrives as [.., hidden, tokens] and is summed over tokens, a K matrix read for
its transpose).  A row kernel covers such a read with a few whole rows per block (4
rows of 1024 at hidden 768), so each column contributes a run of 4 contiguous values:
8 bytes of every 32-byte sector the GPU moves, in bfloat16.  The mapping then takes
taller tiles (`mapping.transposed_tile`).

The probe is the code generator's index analysis (`codegen.probes.load_offsets`, run once per
kernel content), the same dry run the planner already uses to check index spaces; strides are read off
the offset expressions at a few points (`ir.index.evaluate`).

Which of a flat kernel's reads come in *row runs*: contiguous along the innermost
dimension, but not in the kernel's flat order (a padded buffer's rows read back to
their traced width, a slice of each row).  Such an address divides the flat index by
an extent; Triton cannot prove it contiguous and, when a store of the same kernel
vectorises, lays the read out 8 elements a thread and issues them one by one: each
warp instruction then spans 512 bytes for 64 useful ones (GPT-2's logits copied back
from their padded rows ran at 20 % of copy bandwidth, bench/NOTES.md 2026-11-25).
The mapping then gives such kernels one element a thread (`mapping.one_per_thread`):
every access a warp makes is 32 consecutive elements.
"""
from __future__ import annotations

from dataclasses import replace
from math import gcd

from ..ir import index as ix
from ..ir import nodes as ir
from .data import Domain, KernelPlan


def _reads(g: ir.Graph, k: KernelPlan) -> list[tuple[int, ix.Expr]] | None:
    """`k`'s global reads, or None where its index spaces do not line up in this form
    (the planner's validation decides about such a kernel, not the probe)."""
    from ..codegen.probes import load_offsets   # (code generation builds on plan data)
    try:
        return load_offsets(g, k)
    except ix.IndexMismatch:
        return None


def may_reorder(g: ir.Graph, k: KernelPlan, outputs: bool = False) -> bool:
    """Whether some full-size input of `k` (with `outputs`, or output) is laid out
    otherwise than the domain itself (another shape or strides): only then can an access
    be transposed or come in row runs, so the probes (a code-generation dry run each)
    are spared for the plain kernels."""
    dom = k.domain
    full = dom.rows * dom.cols
    nd = len(dom.shape)
    if tuple(sorted(dom.col_dims)) != tuple(range(nd - len(dom.col_dims), nd)):
        return True   # columns ahead of rows: the walk itself is out of memory order
    want = (tuple(dom.shape), ir.contiguous_strides(tuple(dom.shape)))
    return any(g[i].numel >= full // 2
               and (tuple(g[i].shape), tuple(g[i].stride or ir.contiguous_strides(tuple(g[i].shape)))) != want
               for i in k.inputs + (k.outputs if outputs else ()))


def generates(g: ir.Graph, k: KernelPlan) -> bool:
    """Whether `k`, as mapped, passes the code generator's index analysis."""
    return _reads(g, k) is not None


def _stride(off: ix.Expr, name: str) -> int | None:
    base, step = ix.evaluate(off, {}), ix.evaluate(off, {name: 1})
    return None if base is None or step is None else step - base


def transposed_reads(g: ir.Graph, k: KernelPlan) -> list[int]:
    """The inputs `k` reads transposed (see the module doc), read at the domain's full
    size (a broadcast row vector does not count)."""
    dom = k.domain
    rows = [d for d in dom.row_dims if dom.shape[d] > 1]
    cols = [d for d in dom.col_dims if dom.shape[d] > 1]
    if not rows or not cols:
        return []
    rname, cname = f"r{rows[-1]}", f"c{cols[-1]}"
    full = dom.rows * dom.cols
    out: list[int] = []
    for nid, off in _reads(g, k) or ():
        if nid in out or g[nid].numel < full // 2:
            continue
        sr, sc = _stride(off, rname), _stride(off, cname)
        if sr == 1 and sc is not None and abs(sc) > 1:
            out.append(nid)
    return out


SECTOR_BYTES = 32   # the unit of a GPU's memory transactions


def sector_waste(g: ir.Graph, k: KernelPlan, reads: list[int]) -> int:
    """Bytes of whole 32-byte sectors that `k`'s transposed `reads` (`transposed_reads`)
    move beyond the bytes they use: each column's run is the program's rows along the
    read's contiguous dim (at most the dim's size), and a run under a sector still moves
    the sector.  A row-looped program of one row over a channels-last batch-norm input
    reads 2 bytes of every sector in bfloat16: 16x its bytes through L2."""
    dom = k.domain
    rows = [d for d in dom.row_dims if dom.shape[d] > 1]
    if not rows:
        return 0
    inner = dom.shape[rows[-1]]
    waste = 0
    for r in dict.fromkeys(reads):
        n = g[r]
        run = min(k.mapping.block_r, inner) * n.dtype.itemsize
        if run < SECTOR_BYTES:
            waste += n.numel * n.dtype.itemsize * (SECTOR_BYTES - run) // run
    return waste


def _unit_dims(g: ir.Graph, k: KernelPlan) -> dict[int, int]:
    """Bytes of `k`'s full-size reads and stores by the domain dim along which they are
    contiguous (unit stride); an access contiguous along none is left out."""
    from ..codegen.probes import access_offsets   # (code generation builds on plan data)
    try:
        loads, stores = access_offsets(g, k)
    except ix.IndexMismatch:
        return {}
    dom = k.domain
    full = dom.rows * dom.cols
    dims = [d for d, s in enumerate(dom.shape) if s > 1]
    out: dict[int, int] = {}
    seen: set[tuple[int, int]] = set()
    for i, (nid, off) in enumerate(loads + stores):
        store = i >= len(loads)
        if (nid, store) in seen or g[nid].numel < full // 2:
            continue
        seen.add((nid, store))
        unit = [d for d in dims if _stride(off, f"r{d}") == 1]
        if len(unit) == 1:
            out[unit[0]] = out.get(unit[0], 0) + g[nid].numel * g[nid].dtype.itemsize
    return out


TILE_MIN_RUN = 8          # a dim shorter than this is no run worth tiling for
TILE_MIN_SHARE = 0.25     # the other layout's share of the bytes that makes a transpose worth a tile


def layout_domain(g: ir.Graph, k: KernelPlan) -> Domain | None:
    """A better domain for a flat kernel (no reductions) whose full-size accesses are
    contiguous along another dim than its innermost, or None to keep it:
    - most bytes contiguous along one dim `a`: the domain walked with `a` innermost
      (`Domain.order`), so those accesses are the flat index itself (a value stored in a
      transposed layout: LLaMA's key copy for its attention product);
    - a quarter of the bytes or more contiguous along another dim `b` (a transpose): a
      2-d domain whose columns are the shorter of `a` and `b` and whose rows end with the
      longer, walked in tiles, each access coalesced along its own dim and Triton
      converting between them through shared memory (BERT's key, read [tokens, hidden]
      and stored [.., head dim, tokens])."""
    dom = k.domain
    if not dom.is_flat:
        return None
    natural = [d for d, s in enumerate(dom.shape) if s > 1]
    if len(natural) < 2:
        return None
    unit = _unit_dims(g, k)
    if not unit:
        return None
    inner = natural[-1]
    best = max(unit, key=lambda d: (unit[d], d == inner))
    others = {d: b for d, b in unit.items() if d != best}
    second = max(others, key=lambda d: others[d]) if others else None
    if (second is not None and others[second] >= TILE_MIN_SHARE * sum(unit.values())
            and dom.shape[best] >= TILE_MIN_RUN and dom.shape[second] >= TILE_MIN_RUN):
        # either dim can be the columns (the tile holds both); programs cover row blocks,
        # so the longer dim goes to the rows: more programs (a 2-d transpose of 8192 x 4096)
        col, row = (best, second) if dom.shape[best] <= dom.shape[second] else (second, best)
        rows = [d for d in range(len(dom.shape)) if d not in (best, second)] + [row]
        return Domain(dom.shape, (col,), tuple(rows))
    if best == inner:
        return None
    return replace(dom, order=tuple(d for d in range(len(dom.shape)) if d != best) + (best,))


ROW_VALUES_MIN_COLS = 1024   # a row at least this long: its values are read once a row, not once an element
ROW_VALUES_MIN_READS = 2     # per-row values a flat kernel reads before rows pay off where rows are unaligned


def row_values_domain(g: ir.Graph, k: KernelPlan, itemsize: int) -> Domain | None:
    """A row domain for a flat kernel (no reductions) that reads values broadcast along
    its innermost dim — per-row values (a cross-entropy backward over [tokens, vocab]
    reads each token's target, masks and log-sum-exp) — or None to keep it flat.  Flat,
    every element divides its index by the row length and gathers each per-row value on
    its own: sm_90 code of GPT-2's loss backward (4096 x 50257 bfloat16, four per-row
    values) is 50 instructions an element, 32 scalar loads and 110 address operations
    for a thread's 8 elements; its issue time exceeds its memory time.  As rows, a
    program loads each per-row value once and walks the row's columns.
    Taken where the innermost dim is at least ROW_VALUES_MIN_COLS long, every full-size
    access is contiguous along it, and the kernel reads ROW_VALUES_MIN_READS per-row
    values or its rows start 16-byte aligned (odd rows lose the flat form's vectors);
    `itemsize`: the smallest element size of the kernel's full-size accesses."""
    dom = k.domain
    if not dom.is_flat or dom.order:
        return None
    natural = [d for d, s in enumerate(dom.shape) if s > 1]
    if len(natural) < 2 or natural[-1] != len(dom.shape) - 1 or dom.shape[natural[-1]] < ROW_VALUES_MIN_COLS:
        return None
    from ..codegen.probes import access_offsets   # (code generation builds on plan data)
    try:
        loads, stores = access_offsets(g, k)
    except ix.IndexMismatch:
        return None
    inner, cols = natural[-1], dom.shape[natural[-1]]
    lead = [f"r{d}" for d in natural[:-1]]
    full = dom.rows
    per_row: set[int] = set()
    for i, (nid, off) in enumerate(loads + stores):
        step = _stride(off, f"r{inner}")
        if step is None:
            return None
        if i < len(loads) and step == 0 and any(_stride(off, name) not in (0, None) for name in lead):
            per_row.add(nid)
        elif g[nid].numel >= full // 2 and step != 1:
            return None   # a full-size access not contiguous along the row
    if not per_row:
        return None
    if len(per_row) < ROW_VALUES_MIN_READS and (cols * itemsize) % VECTOR_BYTES:
        return None
    return Domain(dom.shape, (inner,))


def _digits(i: int, names: list[tuple[str, int]]) -> dict[str, int]:
    """Flat index `i` as the values of the domain's variables (innermost last)."""
    out = {}
    for name, size in reversed(names):
        out[name] = i % size
        i //= size
    return out


VECTOR_BYTES = 16   # the widest access a thread makes (ld.global.v4.b32)


def row_run_reads(g: ir.Graph, k: KernelPlan) -> list[int]:
    """The inputs a flat kernel reads in row runs (see the module doc), at its full size,
    whose runs cannot be read in 16-byte vectors: the largest power of two dividing the
    run length, the row stride and the first offset is under 16 bytes' worth of
    elements (a run of 64 at a row stride of 2304 is read in vectors anyway)."""
    dom = k.domain
    names = [(f"r{d}", dom.shape[d]) for d in dom.row_dims if dom.shape[d] > 1]
    if len(names) < 2:
        return []
    inner = names[-1][1]
    probes = [1, inner - 1, inner, inner + 1, 2 * inner + 3]
    full = dom.rows
    out: list[int] = []
    for nid, off in _reads(g, k) or ():
        if nid in out or g[nid].numel < full // 2:
            continue
        base = ix.evaluate(off, {})
        at = [ix.evaluate(off, _digits(i, names)) for i in probes if i < full]
        if base is None or None in at or len(at) < 2 or at[0] - base != 1:
            continue
        if all(a - base == i for a, i in zip(at, probes)):   # flat order
            continue
        row_step = ix.evaluate(off, _digits(inner, names))
        aligned = gcd(gcd(inner, row_step - base), base) if row_step is not None else 1
        if (aligned & -aligned) * g[nid].dtype.itemsize < VECTOR_BYTES:   # (largest power of two dividing it)
            out.append(nid)
    return out


__all__ = ["generates", "layout_domain", "may_reorder", "row_run_reads", "row_values_domain", "sector_waste",
           "transposed_reads"]
