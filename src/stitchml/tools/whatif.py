"""What-if predictions (Daydream's question, asked of the cost model): the predicted
step time of the chosen plan against alternatives, without running any of them.

Alternatives, each planned again from the same lowered IR graphs (`Plan.source`, the
graph before planning's rewrites; plan only: no code is generated, nothing runs):
- `rules`: the AStitch rules and rule-based launch groups (`plan_search=rules`);
- `no-global`: no grid-barrier launches; `no-horizontal`: no horizontal launches;
- `no-placement`: concatenations copied by a kernel instead of their parts written into
  their slices (`place_cats=False`, which also leaves the sums of column sums unfolded);
- `no-product-fold`: sums of small matrix products left as they are (`product_sums=False`);
- `unfused`: eager, one kernel per memory-intensive primitive op;
- `<chosen>@<device>`: the chosen plan, as it is, priced on each other device of the table.

Ops that run eagerly (matrix products, attention kernels, ops without a rule) are priced
per row too (`library_us`, `plan/library_cost.py`): the same in most rows, not in
`no-product-fold`, whose products are the library's.  `step_us` = stitched + library,
per row and for the chosen plan (the table's `step_us`), on the table's device.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .. import config
from ..plan.cost import plan_seconds, unfused_seconds
from ..plan.data import Plan
from ..plan.devices import DEVICES, Device, describe_source, get_device
from ..plan.library_cost import plan_library

VARIANTS: dict[str, dict[str, Any]] = {
    "rules": {"plan_search": "rules"},
    "no-global": {"global_barriers": False},
    "no-horizontal": {"horizontal_fusion": False},
    "no-placement": {"place_cats": False},
    "no-product-fold": {"product_sums": False},
}


@dataclass
class PlanRow:
    name: str
    predicted_us: float
    kernels: int
    launches: int
    device: str
    note: str = ""
    library_us: float | None = None   # the row's eager ops (None: not priced, e.g. `unfused`)

    def as_dict(self) -> dict[str, Any]:
        lib = None if self.library_us is None else round(self.library_us, 3)
        return {"name": self.name, "predicted_us": round(self.predicted_us, 3), "kernels": self.kernels,
                "launches": self.launches, "device": self.device, "note": self.note, "library_us": lib,
                "step_us": None if lib is None else round(self.predicted_us + self.library_us, 3)}


def _replan(plan: Plan, dev: Device, **changes: Any) -> Plan:
    """`plan`'s lowered graph (`Plan.source`; a plan without one: its own graph, whose
    rewrites then stay) planned again on `dev` with `changes`; a plan made for
    CUDA-graph capture is planned (and so priced) as replayed again."""
    from ..plan.options import PlanOptions
    from ..plan.planner import build_plan
    changes.setdefault("graph_replay", plan.graph_replay)
    return build_plan(plan.source if plan.source is not None else plan.graph, PlanOptions.from_config(dev, **changes))


def _library_us(plans: list[Plan], dev: Device) -> float:
    return sum(lp.seconds for p in plans for lp in plan_library(p, dev)) * 1e6


def _priced(plan: Plan, dev: Device) -> float:
    """`plan` priced on `dev`, launches at a replay's gap where it was planned for capture."""
    return plan_seconds(plan, dev.replayed() if plan.graph_replay else dev)


def what_if(plans: list[Plan], device: str | None = None, devices: list[str] | None = None) -> dict[str, Any]:
    """The what-if table for the plans of one compiled model (e.g. its forward and
    backward graphs, summed).  `device`: predict for this table device (re-planned
    there) instead of the current one; `devices`: the other devices to price the
    chosen plan on (default: every other device of the table).  Unknown names raise
    `UnknownDevice` naming the devices the table has."""
    dev = get_device(device)
    others = [get_device(d) for d in devices] if devices is not None else \
        [get_device(d) for d in DEVICES if d != dev.name]
    search = str(config.get("plan_search"))
    chosen_name = search if search in ("ilp", "rules") else "ilp"
    if device is not None:
        chosen = [_replan(p, dev) for p in plans]
    else:
        chosen = plans
    prices = [lp for p in chosen for lp in plan_library(p, dev)]
    library_us = sum(lp.seconds for lp in prices) * 1e6
    rows = [PlanRow(chosen_name, sum(_priced(p, dev) for p in chosen) * 1e6,
                    sum(len(p.kernels) for p in chosen), sum(p.num_kernels for p in chosen), dev.name,
                    "the plan stitchml uses", library_us)]
    for name, knobs in VARIANTS.items():
        if name == chosen_name:
            continue
        alt = [_replan(p, dev, **knobs) for p in plans]
        note = ", ".join(f"{k}={v}" for k, v in knobs.items())
        if name.startswith("no-") and all(config.get(k) == v for k, v in knobs.items()):
            note += " (already off: the chosen plan)"
        rows.append(PlanRow(name, sum(_priced(p, dev) for p in alt) * 1e6, sum(len(p.kernels) for p in alt),
                            sum(p.num_kernels for p in alt), dev.name, note, _library_us(alt, dev)))
    total, n = 0.0, 0
    for p in plans:
        s, k = unfused_seconds(p.graph, dev)
        total, n = total + s, n + k
    rows.append(PlanRow("unfused", total * 1e6, n, n, dev.name, "eager: one kernel per primitive op"))
    for o in others:
        if o.name == dev.name:
            continue
        rows.append(PlanRow(f"{chosen_name}@{o.name}", sum(_priced(p, o) for p in chosen) * 1e6,
                            sum(len(p.kernels) for p in chosen), sum(p.num_kernels for p in chosen), o.name,
                            f"the chosen plan priced on {o.name} ({o.source})", _library_us(chosen, o)))
    unpriced = sorted({lp.op for lp in prices if lp.kind == "unpriced"})
    return {"device": dev.name, "source": describe_source(dev), "chosen": chosen_name,
            "plans": [r.as_dict() for r in rows],
            "library_us": round(library_us, 3), "library_ops": len(prices), "unpriced_ops": unpriced,
            "step_us": round(rows[0].predicted_us + library_us, 3),
            "note": "predicted: the stitched part; library: its eager ops (matrix products, attention, ...)"}


def format_table(table: dict[str, Any]) -> str:
    chosen = next(p for p in table["plans"] if p["name"] == table["chosen"])
    base = chosen["predicted_us"] or 1e-30
    lines = [f"what-if on {table['device']} ({table['source']}):",
             f"  {'plan':18} {'predicted':>12} {'vs chosen':>10} {'kernels':>8} {'launches':>9} "
             f"{'library':>12} {'step':>12}  note"]
    for p in table["plans"]:
        rel = p["predicted_us"] / base
        mark = "*" if p["name"] == table["chosen"] else " "
        lib = p.get("library_us")
        tail = f"{'—':>12} {'—':>12}" if lib is None else f"{lib:10.1f}us {p['step_us']:10.1f}us"
        lines.append(f" {mark}{p['name']:18} {p['predicted_us']:10.1f}us {rel:9.2f}x {p['kernels']:8d} "
                     f"{p['launches']:9d} {tail}  {p['note']}")
    lines.append(f"  library ops of the chosen plan (matrix products, attention, other eager ops): "
                 f"{table['library_us']:.1f}us over {table['library_ops']} op(s)"
                 + (f"; no price for {', '.join(table['unpriced_ops'])}" if table["unpriced_ops"] else ""))
    lines.append(f"  step ({table['chosen']} + library ops): {table['step_us']:.1f}us")
    lines.append(f"  ({table['note']})")
    return "\n".join(lines)


__all__ = ["what_if", "format_table", "VARIANTS"]
