"""`explain`: what stitchml did with a function and why.

Every kernel with its ops, stitching scheme, thread mapping and modelled bytes; every
op that runs eagerly with its reason; every refused fusion with its reason.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from ..capture.backend import StitchBackend
from ..compiler import CompiledGraph
from ..ir.nodes import Fallback
from ..plan.devices import current_device


@dataclass(frozen=True)
class KernelInfo:
    name: str
    graph: str          # inference | forward | backward
    ops: tuple[str, ...]
    scheme: str         # local | regional | scatter
    mapping: str
    bytes_read: int
    bytes_written: int
    predicted_us: float


def _mb(b: int) -> str:
    return f"{b / 1e6:.3f} MB"


class Report:
    def __init__(self, graphs: list[CompiledGraph]):
        self.graphs = graphs

    @property
    def kernels(self) -> list[KernelInfo]:
        out = []
        for rec in self.graphs:
            if rec.plan is None:
                continue
            g = rec.graph
            for k in rec.plan.kernels:
                ops = tuple(f"{g[m].kind}.{g[m].op}" for m in k.members)
                out.append(KernelInfo(f"{rec.kind}:{k.name}", rec.kind, ops, k.scheme, k.mapping.describe(),
                                      k.bytes_read, k.bytes_written, k.predicted_s * 1e6))
        return out

    @property
    def num_kernels(self) -> int:
        """GPU kernels launched per call (a global or horizontal launch counts once)."""
        return sum(r.plan.num_kernels for r in self.graphs if r.plan is not None)

    @property
    def fallbacks(self) -> list[Fallback]:
        out = []
        for rec in self.graphs:
            if rec.eager_reason is not None:
                out.append(Fallback(f"<whole {rec.kind} graph>", rec.eager_reason))
            elif rec.graph is not None:
                out.extend(rec.graph.fallbacks)
        return out

    @property
    def modelled_bytes(self) -> int:
        return sum(k.bytes_read + k.bytes_written for k in self.kernels)

    @property
    def unfused_bytes(self) -> int:
        return sum(r.plan.unfused_bytes for r in self.graphs if r.plan is not None)

    @property
    def predicted_us(self) -> float:
        return sum(r.plan.predicted_s for r in self.graphs if r.plan is not None) * 1e6

    def to_text(self) -> str:
        lines = []
        for rec in self.graphs:
            lines.append(f"== {rec.kind} graph ==")
            if rec.dynamic is not None:  # buckets, templates, and why a size got its own kernels
                lines.extend("  " + line for line in rec.dynamic.describe().split("\n"))
                if rec.plan is not None:
                    lines.append("  plan at the last new size:")
            if rec.plan is None:
                lines.append(f"  runs eagerly: {rec.eager_reason}")
                continue
            g = rec.graph
            for step in rec.plan.steps:
                if hasattr(step, "members"):
                    ops = ", ".join(f"{g[m].op}" for m in step.members)
                    grp = rec.plan.group_of(step.name)
                    within = f" (in {grp.kind} launch {grp.name})" if grp else ""
                    lines.append(f"  kernel {step.name}: {step.scheme:8} {step.mapping.describe()}{within}")
                    lines.append(f"      reads {_mb(step.bytes_read)}, writes {_mb(step.bytes_written)}, "
                                 f"predicted {step.predicted_s * 1e6:.1f} us; ops: {ops}")
                else:
                    lines.append(f"  eager  {step.op}: {step.reason}")
            for grp in rec.plan.groups:
                lines.append(f"  launch {grp.name}: {grp.kind} {'+'.join(grp.members)} grid={grp.grid}: {grp.reason}")
            s = rec.plan.search
            if s is not None:
                lines.append(f"  launch search: {s.method}, modelled {s.chosen_s * 1e6:.1f} us vs rules "
                             f"{s.rule_s * 1e6:.1f} us, {s.variables} variables, solved in {s.solve_s * 1e3:.1f} ms, "
                             f"gap {s.gap:.0%}{'; ' + s.note if s.note else ''}")
            for r in rec.plan.refusals:
                lines.append(f"  not fused %{r.producer}({g[r.producer].op}) -> %{r.consumer}({g[r.consumer].op}): "
                             f"{r.reason}")
        dev = current_device()
        lines.append(f"predicted on {dev.name} ({dev.source}): {self.predicted_us:.1f} us")
        lines.append(f"total: {self.num_kernels} kernels, {len(self.fallbacks)} eager ops; modelled "
                     f"{_mb(self.modelled_bytes)} vs {_mb(self.unfused_bytes)} unfused (one kernel per op)")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.to_text()


def explain(fn: Callable, *example_inputs: Any, backward: bool = False, **compile_options: Any) -> Report:
    """Compile `fn` with a fresh stitch backend, run it once on the example inputs
    (and its backward, if `backward=True`), and report what was compiled."""
    backend = StitchBackend()
    compiled = torch.compile(fn, backend=backend, **compile_options)
    out = compiled(*example_inputs)
    if backward:
        outs = out if isinstance(out, (tuple, list)) else (out,)
        loss = sum(o.float().sum() for o in outs if isinstance(o, torch.Tensor) and o.requires_grad)
        loss.backward()
    return Report(backend.records)
