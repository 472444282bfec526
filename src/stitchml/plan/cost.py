"""Modelled DRAM bytes: what a kernel must read and write, and what an unfused
eager execution (one kernel per primitive op) would move."""
from __future__ import annotations

import copy
from dataclasses import replace
from typing import TYPE_CHECKING, Sequence

from ..ir import nodes as ir
from .data import KernelPlan, Plan
from .graph_view import GraphView, is_free
from .row_loops import loop_groups

if TYPE_CHECKING:
    from .devices import Device


def _nbytes(n: ir.Node, numel: int | None = None) -> int:
    itemsize = n.dtype.itemsize if n.dtype is not None else 4
    return (n.numel if numel is None else numel) * itemsize


def row_passes(g: ir.Graph, k: KernelPlan) -> int:
    """How often a kernel reads its row: once, or for a row-looped kernel once per
    loop the code generator emits (`row_loops.loop_groups`; argmax/argmin take two:
    the extreme value, then its first position), plus the loop that writes
    element-wise outputs."""
    if k.mapping.form != "row_looped":
        return 1
    return max(1, sum(n for starts, n in _loops(g, k) if starts))


def _loops(g: ir.Graph, k: KernelPlan) -> list[tuple[list[int], int]]:
    """A row-looped kernel's passes over its row as (the values each pass starts from,
    how many passes): one per loop group of reductions (`row_loops.loop_groups`; column
    partials are taken in the last loop), two per argmax/argmin (the extreme value, then
    its position), then the last loop: element-wise outputs and column partials."""
    rowwise = tuple(m for m in k.members if m not in k.partials)
    loops = [([g[r].refs[0] for r in grp], 1) for grp in loop_groups(g, rowwise)]
    loops += [([g[m].refs[0]], 2) for m in k.members if g[m].kind == ir.REDUCE and g[m].op not in ir.COMBINABLE_REDUCES]
    last = [o for o in k.outputs if o not in k.partials and g[o].numel != k.domain.rows]
    loops.append((last + [g[p].refs[0] for p in k.partials], 1))
    return loops


def input_passes(g: ir.Graph, k: KernelPlan) -> dict[int, int]:
    """How many of a row-looped kernel's loops read each input: a reduction loop reads
    what its reductions' operands are computed from, the last loop what the element-wise
    outputs and the column partials are computed from; row values of earlier loops are
    held in registers (the walk stops at reductions).  An input no loop reads (a per-row
    value) is read once."""
    members = set(k.members)
    inputs = set(k.inputs)

    def reached(starts) -> set[int]:
        seen, stack, found = set(), list(starts), set()
        while stack:
            nid = stack.pop()
            if nid in seen:
                continue
            seen.add(nid)
            if nid in inputs:
                found.add(nid)
            if nid in members and g[nid].kind == ir.REDUCE and nid not in starts:
                continue   # its value is a row value by now
            if nid in members or is_free(g[nid]):
                stack.extend(g[nid].refs)
        return found

    counts = dict.fromkeys(k.inputs, 0)
    for starts, n in _loops(g, k):
        for i in reached(starts):
            counts[i] += n
    return {i: max(1, c) for i, c in counts.items()}


def row_bytes(g: ir.Graph, k: KernelPlan) -> float:
    """Bytes of one row of the kernel's inputs that are read along its rows."""
    return sum(_nbytes(g[i]) / max(k.domain.rows, 1) for i in k.inputs if g[i].numel >= k.domain.cols)


def reread_miss(g: ir.Graph, k: KernelPlan, dev: Device) -> float:
    """Fraction of a looped kernel's re-reads of its row that miss L2 and go to DRAM.
    A program re-reads its row right after its previous pass; meanwhile every resident
    program streams its own row, so the row is still in L2 when the rows in flight fit
    (three quarters of L2 assumed usable: outputs and other data share it)."""
    if k.mapping.form != "row_looped":
        return 1.0
    warps = max(k.mapping.num_warps, 1)
    resident = min(max(k.mapping.grid, 1), dev.sms * max(1, dev.max_warps_per_sm // warps))
    in_flight = resident * row_bytes(g, k) * k.mapping.block_r
    return 0.0 if in_flight <= 0 else min(1.0, max(0.0, 1.0 - 0.75 * dev.l2_bytes / in_flight))


def kernel_bytes(g: ir.Graph, k: KernelPlan, dev: Device | None = None) -> tuple[int, int]:
    """Modelled DRAM bytes: each input buffer counted once, capped at the elements the
    kernel can touch; a looped kernel's further passes over its rows count as far as
    they miss L2 (`reread_miss`) on `dev` (default: the current device)."""
    from .devices import current_device
    touched = k.domain.rows * k.domain.cols
    miss = reread_miss(g, k, dev or current_device())
    passes = input_passes(g, k) if k.mapping.form == "row_looped" else dict.fromkeys(k.inputs, 1)
    paths = read_paths(g, k)
    read = int(sum(min(_nbytes(g[i]), _nbytes(g[i], touched) * paths.get(i, 1)) * (1 + (passes[i] - 1) * miss)
                   for i in k.inputs))
    written = sum(_nbytes(g[o]) for o in k.outputs if o not in k.partials)
    written += sum(k.mapping.grid * g[p].numel * 4 for p in k.partials)
    return read, written


def read_paths(g: ir.Graph, k: KernelPlan) -> dict[int, int]:
    """How many index maps each input is read through: paths from the kernel's members
    to it through free nodes.  An input larger than the kernel's domain read through
    several maps touches up to that many domains' worth of it (a pooling window's nine
    strided slices of its padded input touch all of it; the two halves of a chunk, both)."""
    return input_paths(g, k.members, k.inputs)


def input_paths(g: ir.Graph, kernel_members: Sequence[int], kernel_inputs: Sequence[int]) -> dict[int, int]:
    """`read_paths` of the kernel those members and inputs would make (before it exists:
    the mapping counts a lane's loads with it)."""
    inputs = set(kernel_inputs)
    members = set(kernel_members)
    count: dict[int, int] = {}
    seen = set(members)
    stack = list(members)
    while stack:   # the closure: members and the free nodes between them and the inputs
        for r in g[stack.pop()].refs:
            if r not in seen:
                seen.add(r)
                if r not in inputs and is_free(g[r]):
                    stack.append(r)
    for nid in sorted(seen, reverse=True):   # a node's readers have larger ids
        if nid in inputs:
            continue
        weight = 1 if nid in members else count.get(nid, 0)
        if weight:
            for r in set(g[nid].refs):
                count[r] = count.get(r, 0) + weight
    return {i: count.get(i, 1) for i in kernel_inputs}


def _as_eager(g: ir.Graph) -> ir.Graph:
    """`g` without the planner's recompute marks: eager runs those ops once, as kernels
    of their own (the unfused baseline must not move with the plan's choices)."""
    if not any(n.attr("recompute") for n in g.nodes):
        return g
    out = copy.copy(g)
    out.nodes = [replace(n, attrs=tuple(a for a in n.attrs if a[0] != "recompute")) if n.attr("recompute") else n
                 for n in g.nodes]
    return out


def unfused_bytes(g: ir.Graph) -> int:
    """Bytes if every memory-intensive primitive op ran as its own kernel."""
    g = _as_eager(g)
    gv = GraphView(g)
    total = 0
    for n in g.nodes:
        if is_free(n) or n.kind not in ir.STITCHABLE | {ir.SCATTER_ADD}:
            continue
        total += _nbytes(n) + sum(_nbytes(g[s]) for s in gv.sources[n.id])
    return total


def predict_seconds(k: KernelPlan, dev: Device | None = None, warps: int = 0) -> float:
    """Modelled time of one kernel: launch cost plus bytes over bandwidth, scaled by
    how much of the machine the grid occupies (too few programs cannot saturate
    DRAM; a partial last wave is paid in full) and by the form's measured efficiency
    (1.0 until `stitchml calibrate` measured it); atomic adds (scatter kernels) pay
    the calibrated per-element atomic cost.  `warps`: the warps its programs really run
    with when more than its own (a member of a horizontal launch, whose composite kernel
    runs every body at the widest member's warp count: fewer of its programs fit an SM)."""
    from .devices import current_device
    dev = dev or current_device()
    mem = memory_seconds(k, dev, warps)
    return dev.launch_s + walk_latency(k, mem, dev) + atomic_seconds(k, dev)


def atomic_seconds(k: KernelPlan, dev: Device) -> float:
    return dev.atomic_s * k.domain.rows * k.domain.cols if k.scheme == "scatter" else 0.0


def memory_seconds(k: KernelPlan, dev: Device, warps: int = 0) -> float:
    """`predict_seconds`'s bytes term: bytes over bandwidth at the grid's occupancy and
    the form's efficiency, before any latency its programs wait (`walk_latency`)."""
    # column-lane programs (and their combine) are priced at the occupancy of the 16-warp
    # tiles they replace: the H200 ran them 2.4-2.8x faster, where occupancy counted in
    # programs x warps would call them 2-3x slower (these kernels are latency-bound, not
    # short of warps in flight; plan/mapping.py::column_lane_partials)
    warps = max(16 if k.mapping.column_lanes else max(k.mapping.num_warps, 1), warps)
    per_sm = max(1, min(dev.max_warps_per_sm // warps, 32))
    slots = dev.sms * per_sm
    grid = max(k.mapping.grid, 1)
    waves = -(-grid // slots)
    occupancy = min(1.0, grid / slots) if waves == 1 else grid / (waves * slots)
    # a quarter of the slots busy already saturates DRAM on these parts
    efficiency = min(1.0, occupancy * 4) * dev.efficiency(k.mapping.form)
    # (sectors that transposed reads move beyond their bytes pass through L2 and L1 as
    # well: priced at the copy bandwidth, an estimate the H200 has not checked yet)
    moved = k.bytes_read + k.bytes_written + k.sector_waste
    return moved / (dev.bandwidth * max(efficiency, 1.0 / slots))


def loop_waits(g: ir.Graph, k: KernelPlan) -> int:
    """`KernelPlan.loop_waits`: the column blocks a program of row-looped kernel `k` loads
    one after another (its row blocks x `row_passes` x the column blocks of a pass); 0 for
    other forms."""
    if k.mapping.form != "row_looped" or not isinstance(k.domain.cols, int):
        return 0
    blocks = -(-k.domain.cols // max(k.mapping.block_c, 1))
    return max(k.mapping.row_blocks, 1) * row_passes(g, k) * blocks


def loop_latency(k: KernelPlan, mem: float, dev: Device) -> float:
    """Memory time of a row-looped kernel whose grid runs in one round of at most two
    programs an SM (a persistent grid walking rows, or a partial kernel's capped grid):
    each column block's loads are issued, waited for, then computed on, so the blocks add
    `Device.loop_wait_s` each to the bytes' time; with the next block's loads issued first
    (`KernelPlan.prefetch`, `codegen/emit_core.py::_column_loop`) a block takes the longer
    of a full memory latency and its bytes' time.  Grids of more programs than that overlap
    one program's waits with another's loads: not priced (no measurement yet)."""
    if k.mapping.form != "row_looped" or not k.loop_waits or k.mapping.grid > 2 * dev.sms:
        return mem
    if k.prefetch:
        return max(mem, k.loop_waits * dev.mem_latency_s)
    return mem + k.loop_waits * dev.loop_wait_s


def walk_latency(k: KernelPlan, mem: float, dev: Device) -> float:
    """Memory time of a kernel whose programs walk `row_blocks` blocks one after another
    (column partials: 1-2 programs an SM): each step waits for its loads, a memory latency,
    before it computes, so the walk adds a latency a block to the bytes' time (H200,
    2026-11-30: 2.0-2.6x bytes over bandwidth measured, within 15% of this on four
    kernels).  With the next block's loads issued first (`KernelPlan.prefetch`) a step
    takes the longer of the latency and its bytes' time.  A combine waits a latency for
    its partial rows, once where its steps are unrolled (`codegen.triton_kernel.
    combine_waits`; H200: 1.7 µs for one of 3 steps rolled, 4.2-4.7 for two of 9 in one
    launch, against 0.3-1.9 priced by bytes alone)."""
    if k.mapping.form == "combine":   # (its steps over the partial rows: unrolled where few)
        from ..codegen.triton_kernel import combine_waits
        return mem + combine_waits(k) * dev.mem_latency_s
    if k.mapping.form == "row_looped":
        return loop_latency(k, mem, dev)
    if not k.walks_rows:
        return mem
    lat = k.mapping.row_blocks * dev.mem_latency_s
    return max(mem, lat) if k.prefetch else mem + lat


def group_seconds(kind: str, kernels: list[KernelPlan], dev: Device) -> float:
    """Modelled time of a launch group: one launch, the members' memory time (in a
    horizontal group at the widest member's warps, as the composite runs them), and a
    grid barrier between consecutive phases of a global group (whose counter reset is
    one more node when the graph is replayed in a CUDA graph)."""
    if kind != "global":
        # one composite kernel at the widest member's warps (codegen/composite.py)
        widest = max((k.mapping.num_warps for k in kernels), default=1)
        return dev.launch_s + sum(predict_seconds(k, dev, widest) - dev.launch_s for k in kernels)
    mems = [memory_seconds(k, dev) for k in kernels]
    mem = sum(m + atomic_seconds(k, dev) for k, m in zip(kernels, mems))
    # the latencies its phases wait (walks, combines) are not bytes: not scaled below
    waits = sum(walk_latency(k, m, dev) - m for k, m in zip(kernels, mems))
    # a persistent grid capped at the resident programs moves bytes slower than the
    # separate launches do: `stitchml calibrate` measures by how much ("global" efficiency);
    # replayed in a CUDA graph, its barrier counter is zeroed by a memset node first
    reset = dev.launch_s if dev.replay else 0.0
    return dev.launch_s + reset + mem / dev.efficiency("global") + waits + (len(kernels) - 1) * dev.barrier_s


def plan_seconds(plan: Plan, dev: Device) -> float:
    """The plan's kernels and launch groups priced on `dev` (same structure: the
    plan as chosen, moved to another device)."""
    by_name = {k.name: k for k in plan.kernels}
    grouped = {m for g in plan.groups for m in g.members}
    total = sum(predict_seconds(k, dev) for k in plan.kernels if k.name not in grouped)
    return total + sum(group_seconds(g.kind, [by_name[m] for m in g.members], dev) for g in plan.groups)


def unfused_seconds(g: ir.Graph, dev: Device) -> tuple[float, int]:
    """Modelled time and launch count if every memory-intensive primitive op ran as
    its own kernel (the eager what-if; the ops that run eagerly anyway are left out
    of every plan's figure alike)."""
    g = _as_eager(g)
    gv = GraphView(g)
    total, n = 0.0, 0
    for node in g.nodes:
        if is_free(node) or node.kind not in ir.STITCHABLE | {ir.SCATTER_ADD}:
            continue
        nbytes = _nbytes(node) + sum(_nbytes(g[s]) for s in gv.sources[node.id])
        total += dev.launch_s + nbytes / dev.bandwidth
        n += 1
    return total, n
