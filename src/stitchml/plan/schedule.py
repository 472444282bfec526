"""Launch scheduling across eager ops: an ILP that moves independent launch-bound
kernels past the eager ops (matrix products) around them so that they share
horizontal launches (HFuse's horizontal fusion, over the whole step instead of one
region between two eager ops).

The rule order runs every kernel as early as its inputs allow, so in a training
backward each bias gradient's combine (a few microseconds of work) sits alone between
two matrix products although nothing reads it until the step returns.  Here every
launch-bound kernel without column partials is *movable* (random kernels too: their
seeds are drawn when the step starts, whatever the order): it may
run in any gap between the *fixed* steps (eager ops, the other kernels, kept global
groups) that its producers and consumers allow, at most `WINDOW` gaps from where the
rules put it.  Each gap p has L_p launch slots (L_p = the launches the rule order has
there, at least 1); the kernels given one slot launch together.

  variables  x[k, p, l] ∈ {0,1}   kernel k in slot l of gap p (p within k's window)
             u[p, l]    ∈ {0,1}   slot (p, l) launches
  minimise   Σ u[p, l] + ε Σ |p − rule gap of k|·x[k, p, l]
             (launches × the launch cost: memory time does not move; ε < 1/(moves in all),
             so moving only ever breaks ties towards the rule order)
  subject to Σ_{p,l} x[k,p,l] = 1;  x[k,p,l] ≤ u[p,l];  Σ_k x[k,p,l] ≤ HORIZONTAL_MAX;
             ord(a) + 1 ≤ ord(b) for a movable a feeding a movable b, ord = Σ (slot index)·x
             (so dependent kernels never share a slot, and run in order);
             u[p, l+1] ≤ u[p, l]  (symmetry).

The rule order is a feasible point (each of its launches in its own slot), so the
solution is never worse under the model; components of overlapping windows are
solved apart, and a component the solver does not finish keeps the rule order.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..ir import nodes as ir
from .cost import group_seconds, predict_seconds
from .data import EagerStep, KernelPlan, LaunchGroup, Plan
from .graph_view import GraphView, is_free
from .launches import HORIZONTAL_MAX
from .options import PlanOptions

WINDOW = 8          # gaps a kernel may move from its rule position (bounds the ILP)
# movable kernels solved together at most (larger sets are cut by gaps).  48 gave BERT-base
# AdamW's update pieces ~685 variables, whose solves stopped at the 3 s safety limit with
# 0-5 nodes on the 2-core CPU with the other core busy (so the plan, 31-41 launches, went by
# the machine's speed); at 24, ~175 variables, every solve proves its optimum in 0.3-0.5 s
# there, and the plan is 30 launches
MAX_COMPONENT = 24
MOVE_COST = 1.0 / (2 * WINDOW * (MAX_COMPONENT + HORIZONTAL_MAX))   # per gap moved, in launches


@dataclass
class Scheduled:
    """A step order and its launch groups, as the scheduling ILP chose them."""
    steps: list
    groups: list[LaunchGroup]
    moved: int = 0                  # kernels that run in another gap than the rules put them
    variables: int = 0
    solve_s: float = 0.0
    unfinished: int = 0             # components the solver did not finish (rule order kept)
    movable: set[str] = field(default_factory=set)   # kernels whose window spans 2+ gaps


def step_dependencies(plan: Plan) -> list[set[int]]:
    """For each step of `plan.steps`, the indices of the steps it must follow: data
    producers through views, mutation fences, and a combine's producing kernel."""
    g = plan.graph
    gv = GraphView(g)
    steps = plan.steps
    at: dict[int, int] = {}
    for i, s in enumerate(steps):
        if isinstance(s, KernelPlan):
            for m in s.members:
                at.setdefault(m, i)
        else:
            at[s.node] = i
    named = {s.name: i for i, s in enumerate(steps) if isinstance(s, KernelPlan)}
    for i, s in enumerate(steps):      # a column reduction's value is written by its combine
        if isinstance(s, KernelPlan) and s.combine_of:
            for m in s.members:
                at[m] = i
    inverse: dict[int, set[int]] = {n.id: set() for n in g.nodes}
    for p, us in gv.users.items():
        for u in us:
            inverse[u].add(p)
    deps: list[set[int]] = []
    for i, s in enumerate(steps):
        nodes = s.members if isinstance(s, KernelPlan) else (s.node,)
        d: set[int] = set()
        for nid in nodes:
            for p in set(gv.sources[nid]) | {p for p in inverse[nid] if not is_free(g[p])}:
                j = at.get(p)
                if j is not None and j != i:
                    d.add(j)
        if isinstance(s, KernelPlan) and s.combine_of:
            d.add(named[s.combine_of])
        deps.append({j for j in d if j != i})
    for i, d in enumerate(deps):   # (a combine's own members are also its producer's)
        if isinstance(steps[i], KernelPlan) and not steps[i].combine_of:
            d.difference_update(j for j in list(d) if j > i and isinstance(steps[j], KernelPlan)
                                and steps[j].combine_of == steps[i].name)
    return deps


def _movable(k, dev, in_global: set[str]) -> bool:
    return (isinstance(k, KernelPlan) and k.name not in in_global and not k.partials and not k.own_warps
            and predict_seconds(k, dev) - dev.launch_s <= 2 * dev.launch_s)


def schedule(plan: Plan, groups: list[LaunchGroup], opts: PlanOptions, deps: list[set[int]]) -> Scheduled | None:
    """Re-order `plan.steps` and choose horizontal groups by the ILP above, keeping the
    global groups of `groups` as fixed units; None when nothing can move."""
    import time

    dev = opts.device
    steps = plan.steps
    n = len(steps)
    in_global = {m for grp in groups if grp.kind == "global" for m in grp.members}
    move = [_movable(s, dev, in_global) for s in steps]
    if sum(move) < 2:
        return None
    # fixed units in rule order; gap p lies after the p-th fixed step
    fixed_before = np.cumsum([0] + [0 if m else 1 for m in move])   # fixed steps before step i
    nfixed = int(fixed_before[-1])
    rule_gap = {i: int(fixed_before[i]) for i in range(n) if move[i]}
    # windows: after every fixed predecessor, before every fixed successor (propagated
    # through movable ones)
    lo = [0] * n
    for i in range(n):
        for j in deps[i]:
            lo[i] = max(lo[i], lo[j] if move[j] else int(fixed_before[j]) + 1)
    succ: list[list[int]] = [[] for _ in range(n)]
    for i in range(n):
        for j in deps[i]:
            succ[j].append(i)
    hi = [nfixed] * n
    for i in reversed(range(n)):
        for j in succ[i]:
            hi[i] = min(hi[i], hi[j] if move[j] else int(fixed_before[j]))
    window = {}
    for i in rule_gap:
        r = rule_gap[i]
        a, b = max(lo[i], r - WINDOW), min(hi[i], r + WINDOW)
        if not a <= r <= b:     # (cannot happen: the rule order is legal)
            a = b = r
        window[i] = (a, b)
    # gaps between the phases of a kept global group: nothing may run there
    blocked: set[int] = set()
    for grp in groups:
        if grp.kind == "global":
            at = sorted(int(fixed_before[i]) for i, st in enumerate(steps)
                        if isinstance(st, KernelPlan) and st.name in grp.members)
            blocked.update(range(at[0] + 1, at[-1] + 1))
    movable_names = {steps[i].name for i, (a, b) in window.items() if b > a}
    # slots per gap: the rule order's launches there (a rule horizontal group counts once)
    hgroup = {m: grp.name for grp in groups if grp.kind == "horizontal" for m in grp.members}
    slots = [1] * (nfixed + 1)
    seen: dict[int, set] = {}
    for i, r in rule_gap.items():
        seen.setdefault(r, set()).add(hgroup.get(steps[i].name, steps[i].name))
    for r, ls in seen.items():
        slots[r] = max(1, len(ls))

    t0 = time.perf_counter()
    placed: dict[int, tuple[int, int]] = {}
    nvars = unfinished = 0
    for comp in _pieces(window, rule_gap):
        got = _solve(comp, window, deps, blocked, slots, rule_gap, opts)
        nvars += got[1]
        if got[0] is None:
            unfinished += 1
            got = (_rule_slots(comp, rule_gap, hgroup, steps), 0)
        placed.update(got[0])
    # the new order: per gap, its slots in order, then the next fixed step
    by_slot: dict[tuple[int, int], list[int]] = {}
    for i, ps in placed.items():
        by_slot.setdefault(ps, []).append(i)
    order: list = []
    new_groups = [grp for grp in groups if grp.kind == "global"]
    fixed = [i for i in range(n) if not move[i]]
    for p in range(nfixed + 1):
        for key in sorted(k for k in by_slot if k[0] == p):
            members = sorted(by_slot[key])
            order.extend(steps[i] for i in members)
            if len(members) > 1:
                ks = [steps[i] for i in members]
                new_groups.append(LaunchGroup(
                    "g", "horizontal", tuple(k.name for k in ks), sum(k.mapping.grid for k in ks),
                    group_seconds("horizontal", ks, dev),
                    f"schedule: {len(ks)} independent launch-bound kernels in one launch"
                    + (" (moved across eager ops)" if any(placed[i][0] != rule_gap[i] for i in members) else "")))
        if p < nfixed:
            order.append(steps[fixed[p]])
    moved = sum(1 for i, (p, _) in placed.items() if p != rule_gap[i])
    return Scheduled(order, new_groups, moved, nvars, time.perf_counter() - t0, unfinished, movable_names)


def _pieces(window: dict, rule_gap: dict) -> list[list[int]]:
    """Movable kernels in rule order, cut where no window reaches on (independent
    pieces) or where a piece holds MAX_COMPONENT kernels; every window is clipped to its
    piece's gaps, [cut before, cut after), which keeps its rule gap: pieces never share
    a gap, and a kernel never depends on one of a later piece."""
    items = sorted(window, key=lambda i: (rule_gap[i], i))
    pieces, cuts, cur, reach = [], [], [], -1
    for i in items:
        a, b = window[i]
        if cur and rule_gap[i] > rule_gap[cur[-1]] and (a > reach or len(cur) >= MAX_COMPONENT):
            pieces.append(cur)
            cuts.append(rule_gap[i])
            cur, reach = [], -1
        cur.append(i)
        reach = max(reach, b)
    if cur:
        pieces.append(cur)
    bounds = [-1] + cuts + [1 << 60]
    for q, piece in enumerate(pieces):
        for i in piece:
            a, b = window[i]
            window[i] = (max(a, bounds[q]), min(b, bounds[q + 1] - 1))
    return pieces


def _rule_slots(comp, rule_gap, hgroup, steps) -> dict[int, tuple[int, int]]:
    """The rule order as slots (each rule launch its own slot, in order)."""
    out, index = {}, {}
    for i in sorted(comp):
        r = rule_gap[i]
        key = (r, hgroup.get(steps[i].name, steps[i].name))
        if key not in index:
            index[key] = sum(1 for k in index if k[0] == r)
        out[i] = (r, index[key])
    return out


def _solve(comp, window, deps, blocked, slots, rule_gap, opts: PlanOptions):
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import coo_matrix

    gaps = sorted({p for i in comp for p in range(window[i][0], window[i][1] + 1)} - blocked)
    slot_ids = [(p, l) for p in gaps for l in range(slots[p])]
    sidx = {s: j for j, s in enumerate(slot_ids)}
    ordv = {s: j for j, s in enumerate(slot_ids)}     # slot order = position in the step
    xs = [(i, s) for i in comp for s in slot_ids if window[i][0] <= s[0] <= window[i][1]]
    nx, nu = len(xs), len(slot_ids)
    nv = nx + nu
    rows, cols, vals, lo, hi = [], [], [], [], []
    r = 0

    def add(entries, a, b):
        nonlocal r
        for c, v in entries:
            rows.append(r), cols.append(c), vals.append(v)
        lo.append(a), hi.append(b)
        r += 1

    by_kernel: dict[int, list[int]] = {}
    by_slot: dict[tuple[int, int], list[int]] = {}
    for j, (i, s) in enumerate(xs):
        by_kernel.setdefault(i, []).append(j)
        by_slot.setdefault(s, []).append(j)
        add([(j, 1.0), (nx + sidx[s], -1.0)], -np.inf, 0.0)            # x ≤ u
    for i in comp:
        add([(j, 1.0) for j in by_kernel[i]], 1.0, 1.0)                 # one slot each
    for s, js in by_slot.items():
        add([(j, 1.0) for j in js], -np.inf, HORIZONTAL_MAX)             # launch width
    members = set(comp)
    for b in comp:
        for a in deps[b]:
            if a in members:                                             # ord(a) + 1 ≤ ord(b)
                add([(j, float(ordv[xs[j][1]])) for j in by_kernel[a]]
                    + [(j, -float(ordv[xs[j][1]])) for j in by_kernel[b]], -np.inf, -1.0)
    for p in gaps:
        for l in range(slots[p] - 1):
            add([(nx + sidx[(p, l + 1)], 1.0), (nx + sidx[(p, l)], -1.0)], -np.inf, 0.0)
    # launches, then (a tie-break worth less than one launch in all) the distance moved:
    # a kernel that saves nothing by moving stays where the rules put it
    c = np.concatenate([[MOVE_COST * abs(s[0] - rule_gap[i]) for i, s in xs], np.ones(nu)])
    a = coo_matrix((vals, (rows, cols)), shape=(r, nv)).tocsr()
    res = milp(c, integrality=np.ones(nv), bounds=Bounds(np.zeros(nv), np.ones(nv)),
               constraints=[LinearConstraint(a, lo, hi)], options=opts.milp_options())
    if res.x is None or res.status not in (0,):
        return None, nv
    return {xs[j][0]: xs[j][1] for j in range(nx) if res.x[j] > 0.5}, nv


__all__ = ["schedule", "step_dependencies", "Scheduled", "WINDOW"]
