"""ILP search over launch-level stitching (scipy.optimize.milp, i.e. HiGHS).

Regional and local merges are made by the AStitch rules (grouping.py).  The search
works in two steps:

1. Per region between eager ops, for every pair of consecutive kernels, whether they
   share a launch: joined across a data dependency they become phases of a global
   (grid-barrier) kernel; joined when independent they become one horizontal kernel.
   Variables s_j ∈ {0,1} (1 = join kernel j and j+1); maximise the modelled time
   saved, Σ s_j·(launch − barrier_j); subject to
     - scheme legality: a segment is all-global or all-horizontal
       (s_j + s_{j+1} ≤ 1 where the two joins are of different kinds),
     - horizontal joins only between launch-bound kernels (bounds),
     - a launch holds at most MAX_SEGMENT kernels (window constraints: the register
       and compile-time budget of one launch).
   The rule-based grouping is the incumbent, region by region: a region takes the
   ILP's grouping only where it is strictly faster under the model.
2. Across eager ops (schedule.py): launch-bound kernels move past the eager ops around
   them into shared horizontal launches (a training backward's bias-gradient combines
   past its matrix products), once keeping the global groups of step 1 and once
   without them; the cheaper order is taken when strictly faster than step 1's.

So the plan is never worse than the rules under the model.  `SearchReport.per_region`
says, per region of the rule order, which plan won and by how much (a kernel in a
launch group is charged its memory time plus an equal share of the group's launch):
`explain` prints it.  Solved under a node limit per region / piece (`ilp_node_limit`)
and a time limit as a safety bound (`ilp_time_limit`); a region whose optimum the solver
does not prove within them keeps the rule plan.  Only an optimum is taken, never the
best solution found so far: that would depend on how fast the machine ran the search
(2-core CPU: Swin-T's training step planned 219 launches idle, 250 with the other core
busy, when a 0.5 s limit stopped one region's solve and its incumbent or the rules stood).

Merges stay with the rules: on the BERT training graphs (1 layer, batch 2, seq 128,
H100 table) none of the 202 single producer/consumer cuts of the rule plan, nor
stitching its 2 refused cheap broadcasts, lowers the predicted time (bytes and
launches only grow), so a merge search would only spend planning time; see
bench/NOTES.md.  `plan_search=rules` turns the search off.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import numpy as np

from .cost import atomic_seconds, group_seconds, memory_seconds, predict_seconds
from .data import KernelPlan, LaunchGroup, Plan
from .devices import Device
from .launches import form_groups, wave_capacity, wide_horizontal
from .options import PlanOptions

MAX_SEGMENT = 8


@dataclass
class RegionResult:
    """Which plan won one region (kernels between two eager ops) and by how much."""
    region: str            # first..last kernel name
    kernels: int
    winner: str            # ilp | rules | tie
    rule_s: float
    chosen_s: float
    note: str = ""


@dataclass
class SearchReport:
    method: str            # ilp | rules
    rule_s: float          # modelled time of the rule-based plan
    chosen_s: float        # modelled time of the chosen plan
    solve_s: float = 0.0
    gap: float = 0.0       # relative optimality gap HiGHS reported (0 = proven optimal)
    regions: int = 0
    variables: int = 0
    note: str = ""
    per_region: list = field(default_factory=list)   # RegionResult per region with 2+ kernels

    @property
    def regions_won(self) -> int:
        return sum(1 for r in self.per_region if r.winner == "ilp")


def _regions(steps: list, single: bool = False) -> list[list[KernelPlan]]:
    """Runs of kernels between eager ops (of 2+ kernels, or 1+ with `single`)."""
    out, cur = [], []
    least = 1 if single else 2
    for s in steps:
        if isinstance(s, KernelPlan):
            cur.append(s)
        else:
            if len(cur) >= least:
                out.append(cur)
            cur = []
    if len(cur) >= least:
        out.append(cur)
    return out


def _depends(k: KernelPlan, earlier: list[KernelPlan]) -> bool:
    produced = {o for e in earlier for o in e.provides}   # (placed concatenations too)
    return bool(set(k.inputs) & produced) or any(k.combine_of == e.name for e in earlier)


UNSOLVED = "no optimum proved within the solver's node or time limit (ilp_node_limit, ilp_time_limit)"


def search(plan: Plan, opts: PlanOptions) -> SearchReport:
    """Choose plan.groups by ILP (falls back to the rules); returns what happened."""
    dev = opts.device
    form_groups(plan, opts)
    rule_groups = list(plan.groups)
    rule_s = plan.predicted_s
    if not opts.ilp or opts.plan_search == "rules":
        wide = wide_horizontal(plan, opts)
        note = "ILP disabled (plan_search=rules)" if opts.plan_search == "rules" else "ILP disabled"
        return SearchReport("rules", rule_s, plan.predicted_s, note=note + _wide_note(wide))
    t0 = time.perf_counter()
    groups: list[LaunchGroup] = []
    nvars, worst_gap, notes, results = 0, 0.0, [], []
    for region in _regions(plan.steps):
        names = {k.name for k in region}
        mine = [g for g in rule_groups if set(g.members) <= names]
        rule_r = _region_seconds(region, mine)
        chosen, gap, ok = _solve_region(region, opts)
        nvars += len(region) - 1
        worst_gap = max(worst_gap, gap)
        label = f"{region[0].name}..{region[-1].name}"
        if not ok:   # the rule plan stands for this region
            notes.append(f"{label}: {UNSOLVED}")
            groups.extend(mine)
            results.append(RegionResult(label, len(region), "rules", rule_r, rule_r, UNSOLVED))
            continue
        ilp_groups = _to_groups(region, chosen, dev, 0)
        ilp_r = _region_seconds(region, ilp_groups)
        if ilp_r < rule_r - 1e-12:
            groups.extend(ilp_groups)
            results.append(RegionResult(label, len(region), "ilp", rule_r, ilp_r, _describe(ilp_groups)))
        else:        # ties and losses keep the rule plan (the incumbent)
            groups.extend(mine)
            results.append(RegionResult(label, len(region), "tie" if ilp_r <= rule_r + 1e-12 else "rules",
                                        rule_r, rule_r, _describe(mine)))
    plan.groups = [replace(g, name=f"g{i}") for i, g in enumerate(groups)]
    rule_steps = list(plan.steps)
    sched_note, movable, svars = _schedule_across(plan, opts)
    nvars += svars
    wide = wide_horizontal(plan, opts)
    chosen_s = plan.predicted_s
    solve = time.perf_counter() - t0
    results = _per_region(rule_steps, rule_groups, plan, results, movable, dev)
    won = sum(1 for r in results if r.winner == "ilp")
    method = "ilp" if won or chosen_s < rule_s - 1e-12 else "rules"
    note = f"ILP won {won} of {len(results)} regions" + (f"; {sched_note}" if sched_note else "") + \
        (f"; {'; '.join(notes)}" if notes else "") + _wide_note(wide)
    return SearchReport(method, rule_s, chosen_s, solve, worst_gap, len(results), nvars, note, results)


def _schedule_across(plan: Plan, opts: PlanOptions) -> tuple[str, set[str], int]:
    """The scheduling ILP (schedule.py) from the grouping chosen so far, once keeping its
    global groups and once without them; the cheaper order replaces the plan's when it
    is strictly faster under the model.  Returns what it did (for the note), the
    kernels that could move and the ILP variables."""
    from .schedule import schedule, step_dependencies
    if not opts.horizontal_fusion:
        return "", set(), 0
    deps = step_dependencies(plan)
    base = plan.predicted_s
    tries = [schedule(plan, plan.groups, opts, deps)]
    globals_ = [g for g in plan.groups if g.kind == "global"]
    if globals_:
        t = schedule(plan, [], opts, deps)
        if t is not None:   # a dissolved global group whose kernels still run back to back, alone, is kept
            t.groups += [g for g in globals_ if _back_to_back(t, g)]
        tries.append(t)
    best, best_s, movable, nvars = None, base, set(), 0
    for t in tries:
        if t is None:
            continue
        movable |= t.movable
        nvars += t.variables
        s = _seconds(t.steps, t.groups)
        if s < best_s - 1e-12:
            best, best_s = t, s
    if best is None:
        return "", movable, nvars
    plan.steps = best.steps
    plan.groups = [replace(g, name=f"g{i}") for i, g in enumerate(best.groups)]
    return (f"schedule across eager ops: {best.moved} kernels moved, "
            f"{(base - best_s) * 1e6:.1f} us saved"), movable, nvars


def _wide_note(groups: int) -> str:
    return f"; {groups} horizontal launches of independent point-wise kernels (launches.wide_horizontal)" \
        if groups else ""


def _back_to_back(t, group: LaunchGroup) -> bool:
    grouped = {m for g in t.groups for m in g.members}
    names = [k.name if isinstance(k, KernelPlan) else None for k in t.steps]
    if any(m in grouped for m in group.members) or group.members[0] not in names:
        return False
    i = names.index(group.members[0])
    return tuple(names[i:i + len(group.members)]) == group.members


def _seconds(steps: list, groups: list[LaunchGroup]) -> float:
    grouped = {m for g in groups for m in g.members}
    return (sum(k.predicted_s for k in steps if isinstance(k, KernelPlan) and k.name not in grouped)
            + sum(g.predicted_s for g in groups))


def _apportioned(steps: list, groups: list[LaunchGroup], dev: Device) -> dict[str, float]:
    """Each kernel's share of the modelled time: its own time, or in a launch group its
    memory time plus an equal share of the group's launch, barriers and slowdown."""
    out = {k.name: k.predicted_s for k in steps if isinstance(k, KernelPlan)}
    by_name = {k.name: k for k in steps if isinstance(k, KernelPlan)}
    for g in groups:
        mem = {m: predict_seconds(by_name[m], dev) - dev.launch_s for m in g.members}
        extra = (g.predicted_s - sum(mem.values())) / len(g.members)
        for m in g.members:
            out[m] = mem[m] + extra
    return out


def _per_region(rule_steps: list, rule_groups: list[LaunchGroup], plan: Plan, consecutive: list[RegionResult],
                movable: set[str], dev: Device) -> list[RegionResult]:
    """Per region of the rule order (kernels between two eager ops) where more than one
    plan is legal (2+ kernels, or a kernel the schedule may move elsewhere): the rule
    plan's time against the chosen plan's, each kernel charged its share of its group."""
    rule = _apportioned(rule_steps, rule_groups, dev)
    chosen = _apportioned(plan.steps, plan.groups, dev)
    notes = {r.region: r.note for r in consecutive}
    out = []
    for region in _regions(rule_steps, single=True):
        if len(region) < 2 and not any(k.name in movable for k in region):
            continue
        label = f"{region[0].name}..{region[-1].name}"
        r_s = sum(rule[k.name] for k in region)
        c_s = sum(chosen[k.name] for k in region)
        if c_s < r_s - 1e-12:
            winner = "ilp"
        else:
            winner = "tie" if c_s <= r_s + 1e-12 else "rules"
        groups = [g for g in plan.groups if set(g.members) & {k.name for k in region}]
        out.append(RegionResult(label, len(region), winner, r_s, c_s,
                                notes.get(label, "") if winner != "ilp" else _describe(groups)))
    return out


def _region_seconds(region: list[KernelPlan], groups: list[LaunchGroup]) -> float:
    grouped = {m for g in groups for m in g.members}
    return sum(k.predicted_s for k in region if k.name not in grouped) + sum(g.predicted_s for g in groups)


def _describe(groups: list[LaunchGroup]) -> str:
    return ", ".join(f"{g.kind} {'+'.join(g.members)}" for g in groups) or "separate launches"


def _join_value(region: list[KernelPlan], j: int, opts: PlanOptions) -> tuple[float, str]:
    dev = opts.device
    a, b = region[j], region[j + 1]
    dep = _depends(b, region[: j + 1])
    if dep:
        if not opts.global_barriers:
            return 0.0, "none"
        # a calibrated global-scheme efficiency below 1 costs memory time too (counted for
        # both kernels of every join: conservative; the plan is re-priced exactly after)
        # (bytes only: the latencies a phase waits are not slowed by the persistent grid)
        slow = (1.0 / dev.efficiency("global") - 1.0) * sum(memory_seconds(k, dev) + atomic_seconds(k, dev)
                                                           for k in (a, b))
        # replayed, a global launch's counter reset is one more node: charged to every join
        # (conservative for segments of 3+; the plan is re-priced exactly after)
        reset = dev.launch_s if dev.replay else 0.0
        return dev.launch_s - dev.barrier_s - slow - reset, "global"
    if not opts.horizontal_fusion:
        return 0.0, "none"
    launch_bound = all(predict_seconds(k, dev) - dev.launch_s <= 2 * dev.launch_s for k in (a, b))
    if not launch_bound or a.partials or b.partials or a.combine_of or b.combine_of or a.own_warps or b.own_warps:
        return 0.0, "none"
    return dev.launch_s, "horizontal"


def _solve_region(region: list[KernelPlan], opts: PlanOptions):
    from scipy.optimize import Bounds, LinearConstraint, milp
    n = len(region) - 1
    values, kinds = zip(*(_join_value(region, j, opts) for j in range(n)))
    c = -np.array(values)                                  # maximise saved time
    upper = np.array([1.0 if k != "none" and v > 0 else 0.0 for v, k in zip(values, kinds)])
    rows, lo, hi = [], [], []
    for j in range(n - 1):                                 # one scheme per launch
        if kinds[j] != kinds[j + 1]:
            r = np.zeros(n)
            r[j] = r[j + 1] = 1
            rows.append(r), lo.append(0), hi.append(1)
    for j in range(max(0, n - MAX_SEGMENT + 1)):           # at most MAX_SEGMENT kernels a launch
        r = np.zeros(n)
        r[j:j + MAX_SEGMENT] = 1
        rows.append(r), lo.append(0), hi.append(MAX_SEGMENT - 1)
    cons = [LinearConstraint(np.array(rows), lo, hi)] if rows else []
    res = milp(c, integrality=np.ones(n), bounds=Bounds(np.zeros(n), upper), constraints=cons,
               options=opts.milp_options())
    if res.x is None or res.status != 0:   # (only a proved optimum: see the module doc)
        return None, 1.0, False
    gap = float(getattr(res, "mip_gap", 0.0) or 0.0)
    return [(round(x) == 1, k) for x, k in zip(res.x, kinds)], gap, True


def _to_groups(region: list[KernelPlan], joins, dev: Device, start: int) -> list[LaunchGroup]:
    out, seg, kind = [], [region[0]], None
    for j, (join, k) in enumerate(joins):
        if join:
            seg.append(region[j + 1])
            kind = k
            continue
        if len(seg) > 1:
            out.append(_group(seg, kind, dev, start + len(out)))
        seg, kind = [region[j + 1]], None
    if len(seg) > 1:
        out.append(_group(seg, kind, dev, start + len(out)))
    return out


def _group(seg: list[KernelPlan], kind: str, dev: Device, index: int) -> LaunchGroup:
    n = len(seg)
    if kind == "global":
        warps = max(k.mapping.num_warps for k in seg)
        grid = min(max(k.mapping.grid for k in seg), wave_capacity(dev, warps))
        return LaunchGroup(f"g{index}", "global", tuple(k.name for k in seg), grid,
                           group_seconds("global", seg, dev), f"ILP: {n - 1} barriers replace launches")
    return LaunchGroup(f"g{index}", "horizontal", tuple(k.name for k in seg), sum(k.mapping.grid for k in seg),
                       group_seconds("horizontal", seg, dev),
                       f"ILP: {n} independent launch-bound kernels in one launch")
