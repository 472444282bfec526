"""Launch grouping, chosen by the cost model.

- global: a kernel with column partials, its combine, and the kernels right after it
  that read their results become phases of one persistent launch (grid barriers
  between phases) when a barrier is cheaper than the launches it replaces.
- horizontal: consecutive, mutually independent, launch-bound kernels share one
  launch (dispatch on program-id ranges).
- wide horizontal (`wide_horizontal`, after the search): consecutive, mutually
  independent point-wise kernels that are NOT launch-bound and run at the same warps
  (an optimizer step's updates of equally shaped parameters) share one launch too: one
  grid of all their programs instead of one short grid each, no byte moved twice.
"""
from __future__ import annotations

from .cost import group_seconds, predict_seconds
from .data import KernelPlan, LaunchGroup, Plan
from .devices import Device
from .options import PlanOptions

HORIZONTAL_MAX = 8
MAXNREG = 128  # register cap passed to persistent (barrier) launches on CUDA


def wave_capacity(dev: Device, num_warps: int) -> int:
    """Programs that are resident at once: the largest safe grid for a barrier.
    The interpreter (cpu entry) runs one program at a time, so only 1 is safe."""
    if dev.name == "cpu":
        return 1
    # conservative on purpose (a deadlock is worse than a slower kernel): the launch
    # caps registers at MAXNREG, and shared memory use is unknown until compiled, so
    # at most two programs per SM are assumed resident, one for 8+ warps
    by_warps = dev.max_warps_per_sm // max(num_warps, 1)
    by_regs = dev.regs_per_sm // (max(num_warps, 1) * 32 * MAXNREG)
    return dev.sms * max(1, min(by_warps, by_regs, 2 if num_warps <= 4 else 1))


def _mem_s(k: KernelPlan, dev: Device) -> float:
    return predict_seconds(k, dev) - dev.launch_s


def _may_share(s, grouped: set[str]) -> bool:
    """A kernel that may join a horizontal launch: not in a launch group yet, no column
    partials or combine (their global chains), not tied to its own warp count."""
    return (isinstance(s, KernelPlan) and s.name not in grouped and not s.combine_of and not s.partials
            and not s.own_warps)


def form_groups(plan: Plan, opts: PlanOptions) -> None:
    if opts.global_barriers:
        _global(plan, opts.device)
    if opts.horizontal_fusion:
        _horizontal(plan, opts.device)


def _global(plan: Plan, dev: Device) -> None:
    steps = plan.steps
    i = 0
    while i < len(steps):
        k = steps[i]
        if not (isinstance(k, KernelPlan) and k.partials):
            i += 1
            continue
        chain, produced = [k], set(k.provides)
        j = i + 1
        while j < len(steps) and isinstance(steps[j], KernelPlan):
            nxt = steps[j]
            if nxt.combine_of != chain[-1].name and not (set(nxt.inputs) & produced):
                break
            chain.append(nxt)
            produced |= set(nxt.provides)
            j += 1
        n = len(chain)
        if n > 1:
            warps = max(c.mapping.num_warps for c in chain)
            grid = min(max(c.mapping.grid for c in chain), wave_capacity(dev, warps))
            separate = sum(predict_seconds(c, dev) for c in chain)
            fused = group_seconds("global", chain, dev)
            if fused < separate:
                plan.groups.append(LaunchGroup(
                    f"g{len(plan.groups)}", "global", tuple(c.name for c in chain), grid, fused,
                    f"{n - 1} grid barriers ({(n - 1) * dev.barrier_s * 1e6:.1f} us) replace {n - 1} launches "
                    f"({(n - 1) * dev.launch_s * 1e6:.1f} us)"))
        i = j


def _horizontal(plan: Plan, dev: Device) -> None:
    grouped = {m for g in plan.groups for m in g.members}

    def candidate(s) -> bool:
        return _may_share(s, grouped) and _mem_s(s, dev) <= 2 * dev.launch_s

    run: list[KernelPlan] = []

    def flush():
        if len(run) > 1:
            fused = dev.launch_s + sum(_mem_s(c, dev) for c in run)
            plan.groups.append(LaunchGroup(
                f"g{len(plan.groups)}", "horizontal", tuple(c.name for c in run), sum(c.mapping.grid for c in run),
                fused, f"{len(run)} launch-bound kernels: saves {(len(run) - 1) * dev.launch_s * 1e6:.1f} us of "
                       f"launches"))
        run.clear()

    for s in plan.steps:
        if candidate(s) and len(run) < HORIZONTAL_MAX:
            produced = {o for r in run for o in r.provides}
            if not (set(s.inputs) & produced):
                run.append(s)
                continue
        flush()
        if candidate(s):
            run.append(s)
    flush()


def wide_horizontal(plan: Plan, opts: PlanOptions) -> int:
    """Group consecutive independent point-wise kernels that are not launch-bound (the
    searches leave them alone) into horizontal launches of up to HORIZONTAL_MAX bodies;
    returns the groups added.

    Why: BERT-base's AdamW step has 73 updates of 768 x 768 and 768 x 3072 parameters,
    2-4 us of memory each on an H200; merged into one kernel's body they ran at 25-60%
    of copy bandwidth (H200, 2026-11-30: `grouping._serial_siblings`), launched one by
    one they pay a launch each and each grid (576-1152 programs, 1-2 waves) ends in a
    partly filled wave.  One launch of up to 8 bodies runs their programs as one grid:
    each program still streams one body.  Only same-warp members (the composite runs
    every body at its widest member's warps) and no in-place hazard: a member reading a
    graph input that another member writes would read it while it is overwritten."""
    if not opts.horizontal_fusion or opts.fixed_row_blocks:
        return 0   # (dynamic shapes: launches are never packed)
    dev = opts.device
    g = plan.graph
    grouped = {m for grp in plan.groups for m in grp.members}
    writer_of: dict[int, int] = {}   # graph input node -> the member node whose value is written into it
    for pos, new in g.written():
        writer_of[g.inputs[pos]] = new

    def eligible(s) -> bool:
        return (_may_share(s, grouped) and s.mapping.form == "pointwise" and s.scheme != "scatter"
                and _mem_s(s, dev) > 2 * dev.launch_s)

    by_name = {k.name: k for k in plan.kernels}
    group_provides: dict[str, set[int]] = {}   # member -> every value its launch group provides
    for grp in plan.groups:
        vals = {o for m in grp.members for o in by_name[m].provides}
        for m in grp.members:
            group_provides[m] = vals
    runs: list[list[KernelPlan]] = []
    run: list[KernelPlan] = []
    skipped: set[int] = set()   # values computed by steps between the run's first member and now

    def flush() -> None:
        if len(run) > 1:
            runs.append(list(run))
        run.clear()
        skipped.clear()

    def fits(s: KernelPlan) -> bool:
        if len(run) >= HORIZONTAL_MAX or s.mapping.num_warps != run[0].mapping.num_warps:
            return False
        if set(s.inputs) & skipped:   # (it moves up to the run's first member, before those)
            return False
        produced = {o for r in run for o in r.provides}
        if set(s.inputs) & produced:
            return False
        members = {m for r in run for m in r.members}
        mine = set(s.members)
        # no member reads an input another member overwrites
        if any(writer_of.get(x) in members for x in s.inputs):
            return False
        return not any(writer_of.get(x) in mine for r in run for x in r.inputs)

    for s in plan.steps:
        if not isinstance(s, KernelPlan):
            flush()
            continue
        if not eligible(s):
            if run:   # independent kernels in between (other launch groups' members) are skipped
                skipped.update(group_provides.get(s.name, s.provides))
            continue
        if run and fits(s):
            run.append(s)
            continue
        flush()
        run.append(s)
    flush()
    if not runs:
        return 0
    # each run's members launch together where its first member stood
    moved = {k.name for r in runs for k in r[1:]}
    first = {r[0].name: r for r in runs}
    steps = []
    for s in plan.steps:
        if isinstance(s, KernelPlan) and s.name in moved:
            continue
        steps.extend(first[s.name] if isinstance(s, KernelPlan) and s.name in first else [s])
    plan.steps = steps
    for r in runs:
        plan.groups.append(LaunchGroup(
            f"g{len(plan.groups)}", "horizontal", tuple(c.name for c in r), sum(c.mapping.grid for c in r),
            group_seconds("horizontal", r, dev),
            f"{len(r)} independent point-wise kernels of {r[0].mapping.num_warps} warps in one grid: saves "
            f"{(len(r) - 1) * dev.launch_s * 1e6:.1f} us of launches and the partial last waves of "
            f"{len(r) - 1} grids"))
    return len(runs)
