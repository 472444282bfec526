"""Launch grouping, chosen by the cost model.

- global: a kernel with column partials, its combine, and the kernels right after it
  that read their results become phases of one persistent launch (grid barriers
  between phases) when a barrier is cheaper than the launches it replaces.
- horizontal: consecutive, mutually independent, launch-bound kernels share one
  launch (dispatch on program-id ranges).
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
        return (isinstance(s, KernelPlan) and s.name not in grouped and not s.combine_of and not s.partials
                and not s.own_warps and _mem_s(s, dev) <= 2 * dev.launch_s)

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
