"""What-if predictions (Daydream's question, asked of the cost model): the predicted
step time of the chosen plan against alternatives, without running any of them.

Alternatives, each planned again from the same IR graphs (plan only: no code is
generated, nothing runs):
- `rules`: the AStitch rules and rule-based launch groups (`plan_search=rules`);
- `no-global`: no grid-barrier launches; `no-horizontal`: no horizontal launches;
- `unfused`: eager, one kernel per memory-intensive primitive op;
- `<chosen>@<device>`: the chosen plan, as it is, priced on each other device of the table.

Ops that run eagerly in every plan (matrix products, attention kernels, ops without a
rule) are the same in every row, so the rows compare the memory-intensive part; the
table adds their predicted time once (`library_us`, `plan/library_cost.py`) and the
chosen plan's whole step (`step_us`), on the table's device.
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
}


@dataclass
class PlanRow:
    name: str
    predicted_us: float
    kernels: int
    launches: int
    device: str
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "predicted_us": round(self.predicted_us, 3), "kernels": self.kernels,
                "launches": self.launches, "device": self.device, "note": self.note}


def _replan(plan: Plan, dev: Device, **changes: Any) -> Plan:
    """`plan`'s graph planned again on `dev` with `changes`; a plan made for CUDA-graph
    capture is planned (and so priced) as replayed again."""
    from ..plan.options import PlanOptions
    from ..plan.planner import build_plan
    changes.setdefault("graph_replay", plan.graph_replay)
    return build_plan(plan.graph, PlanOptions.from_config(dev, **changes))


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
    rows = [PlanRow(chosen_name, sum(_priced(p, dev) for p in chosen) * 1e6,
                    sum(len(p.kernels) for p in chosen), sum(p.num_kernels for p in chosen), dev.name,
                    "the plan stitchml uses")]
    for name, knobs in VARIANTS.items():
        if name == chosen_name:
            continue
        alt = [_replan(p, dev, **knobs) for p in plans]
        rows.append(PlanRow(name, sum(_priced(p, dev) for p in alt) * 1e6, sum(len(p.kernels) for p in alt),
                            sum(p.num_kernels for p in alt), dev.name,
                            ", ".join(f"{k}={v}" for k, v in knobs.items())))
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
                            f"the chosen plan priced on {o.name} ({o.source})"))
    prices = [lp for p in chosen for lp in plan_library(p, dev)]
    library_us = sum(lp.seconds for lp in prices) * 1e6
    unpriced = sorted({lp.op for lp in prices if lp.kind == "unpriced"})
    return {"device": dev.name, "source": describe_source(dev), "chosen": chosen_name,
            "plans": [r.as_dict() for r in rows],
            "library_us": round(library_us, 3), "library_ops": len(prices), "unpriced_ops": unpriced,
            "step_us": round(rows[0].predicted_us + library_us, 3),
            "note": "plans: the memory-intensive part; ops that run eagerly in every plan are library_us"}


def format_table(table: dict[str, Any]) -> str:
    chosen = next(p for p in table["plans"] if p["name"] == table["chosen"])
    base = chosen["predicted_us"] or 1e-30
    lines = [f"what-if on {table['device']} ({table['source']}):",
             f"  {'plan':18} {'predicted':>12} {'vs chosen':>10} {'kernels':>8} {'launches':>9}  note"]
    for p in table["plans"]:
        rel = p["predicted_us"] / base
        mark = "*" if p["name"] == table["chosen"] else " "
        lines.append(f" {mark}{p['name']:18} {p['predicted_us']:10.1f}us {rel:9.2f}x {p['kernels']:8d} "
                     f"{p['launches']:9d}  {p['note']}")
    lines.append(f"  library ops (the same in every plan: matrix products, attention, other eager ops): "
                 f"{table['library_us']:.1f}us over {table['library_ops']} op(s)"
                 + (f"; no price for {', '.join(table['unpriced_ops'])}" if table["unpriced_ops"] else ""))
    lines.append(f"  step ({table['chosen']} + library ops): {table['step_us']:.1f}us")
    lines.append(f"  ({table['note']})")
    return "\n".join(lines)


__all__ = ["what_if", "format_table", "VARIANTS"]
