"""ILP search over launch-level stitching (scipy.optimize.milp, i.e. HiGHS).

Regional and local merges are made by the AStitch rules (grouping.py).  This search
decides, for every pair of consecutive kernels inside a region between eager ops,
whether they share a launch: joined across a data dependency they become phases of
a global (grid-barrier) kernel; joined when independent they become one horizontal
kernel.  Variables s_j ∈ {0,1} (1 = join kernel j and j+1); maximise the modelled
time saved, Σ s_j·(launch − barrier_j); subject to
  - scheme legality: a segment is all-global or all-horizontal
    (s_j + s_{j+1} ≤ 1 where the two joins are of different kinds),
  - horizontal joins only between launch-bound kernels (bounds),
  - a launch holds at most MAX_SEGMENT kernels (window constraints: the register and
    compile-time budget of one launch).
The rule-based grouping is the incumbent, region by region: a region takes the ILP's
grouping only where it is strictly faster under the model, so the plan is never
worse than the rules; `SearchReport.per_region` says which plan won each region and
by how much (`explain` prints it).  Solved per region, under a time cap
(`ilp_time_limit`); a region the solver does not finish keeps the rule plan.

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

from .cost import group_seconds, predict_seconds
from .data import KernelPlan, LaunchGroup, Plan
from .devices import Device
from .launches import form_groups, wave_capacity
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


def _regions(plan: Plan) -> list[list[KernelPlan]]:
    out, cur = [], []
    for s in plan.steps:
        if isinstance(s, KernelPlan):
            cur.append(s)
        else:
            if len(cur) > 1:
                out.append(cur)
            cur = []
    if len(cur) > 1:
        out.append(cur)
    return out


def _depends(k: KernelPlan, earlier: list[KernelPlan]) -> bool:
    produced = {o for e in earlier for o in e.outputs}
    return bool(set(k.inputs) & produced) or any(k.combine_of == e.name for e in earlier)


def search(plan: Plan, opts: PlanOptions) -> SearchReport:
    """Choose plan.groups by ILP (falls back to the rules); returns what happened."""
    dev = opts.device
    form_groups(plan, opts)
    rule_groups = list(plan.groups)
    rule_s = plan.predicted_s
    if not opts.ilp or opts.plan_search == "rules":
        return SearchReport("rules", rule_s, rule_s, note="ILP disabled (plan_search=rules)"
                            if opts.plan_search == "rules" else "ILP disabled")
    t0 = time.perf_counter()
    cap = opts.ilp_time_limit
    groups: list[LaunchGroup] = []
    nvars, worst_gap, notes, results = 0, 0.0, [], []
    for region in _regions(plan):
        names = {k.name for k in region}
        mine = [g for g in rule_groups if set(g.members) <= names]
        rule_r = _region_seconds(region, mine)
        chosen, gap, ok = _solve_region(region, opts, cap)
        nvars += len(region) - 1
        worst_gap = max(worst_gap, gap)
        label = f"{region[0].name}..{region[-1].name}"
        if not ok:   # the rule plan stands for this region
            notes.append(f"{label}: solver failed or timed out")
            groups.extend(mine)
            results.append(RegionResult(label, len(region), "rules", rule_r, rule_r, "solver failed or timed out"))
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
    chosen_s = plan.predicted_s
    solve = time.perf_counter() - t0
    won = sum(1 for r in results if r.winner == "ilp")
    method = "ilp" if won else "rules"
    note = f"ILP won {won} of {len(results)} regions" + (f"; {'; '.join(notes)}" if notes else "")
    return SearchReport(method, rule_s, chosen_s, solve, worst_gap, len(results), nvars, note, results)


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
        slow = (1.0 / dev.efficiency("global") - 1.0) * sum(predict_seconds(k, dev) - dev.launch_s for k in (a, b))
        return dev.launch_s - dev.barrier_s - slow, "global"
    if not opts.horizontal_fusion:
        return 0.0, "none"
    launch_bound = all(predict_seconds(k, dev) - dev.launch_s <= 2 * dev.launch_s for k in (a, b))
    if not launch_bound or a.partials or b.partials or a.combine_of or b.combine_of:
        return 0.0, "none"
    return dev.launch_s, "horizontal"


def _solve_region(region: list[KernelPlan], opts: PlanOptions, cap: float):
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
               options={"time_limit": cap, "disp": False})
    if res.x is None:
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
