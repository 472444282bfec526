"""`explain`: what stitchml did with a function and why.

Every pattern rewrite of the Dynamo graph applied or refused with its reason; every
kernel with its ops, stitching scheme, thread mapping and modelled bytes; every op
that runs eagerly with its reason; every refused fusion with its reason.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch._dynamo.utils import counters

from ..capture.backend import StitchBackend
from ..compiler import CompiledGraph
from ..ir.nodes import Fallback
from ..capture.partition import PartitionRecord
from ..patterns.common import PatternRecord
from ..plan.devices import current_device, describe_source
from ..plan.library_cost import plan_library


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
    """What one backend compiled: its graphs (`CompiledGraph`) and the pattern rewrites
    it applied or refused on the Dynamo graphs before AOTAutograd (`PatternRecord`)."""

    def __init__(self, graphs: list[CompiledGraph], patterns: Sequence[PatternRecord] | None = None,
                 graph_breaks: Sequence[tuple[str, int]] | None = None,
                 partitions: Sequence[PartitionRecord] | None = None):
        self.graphs = graphs
        # how AOTAutograd split each training graph (capture/partition.py); None: not recorded
        self.partitions = None if partitions is None else list(partitions)
        self.patterns = list(patterns or ())
        # None: built without the backend's capture (plan_report, records alone): not "none matched"
        self.patterns_recorded = patterns is not None
        # Dynamo's graph breaks while this report's function was compiled, (reason, times);
        # None: not recorded (a report built from records alone)
        self.graph_breaks = None if graph_breaks is None else list(graph_breaks)

    def pattern_lines(self) -> list[str]:
        """One line per rewrite applied or refused, with what it produced or why not."""
        if not self.patterns_recorded:
            return ["  (not recorded: this report was built without the stitch backend's pattern rewrites)"]
        if not self.patterns:
            return ["  (none: no pattern matched, or the rewrites are switched off)"]
        return [f"  {'rewritten' if r.applied else 'refused':9} {r.pattern} at {r.anchor}: {r.detail}"
                for r in self.patterns]

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

    @property
    def plans(self) -> list:
        return [r.plan for r in self.graphs if r.plan is not None]

    def what_if(self, device: str | None = None, devices: list[str] | None = None) -> dict[str, Any]:
        """Predicted step time of the chosen plan and its alternatives (rules,
        no-global, no-horizontal, unfused, the chosen plan on the other devices):
        `{"device", "chosen", "plans": [{"name", "predicted_us", "kernels", "launches"}, ...]}`.
        An unknown device name raises `UnknownDevice` (a ValueError)."""
        from .whatif import what_if
        return what_if(self.plans, device, devices)

    def to_html(self, path: str, measured_us: dict[str, float] | None = None, title: str = "",
                what_if: dict[str, Any] | None = None) -> str:
        """Write the self-contained HTML report (graph coloured by kernel and scheme,
        per-kernel bytes and times, roofline chart, refusals, eager ops, what-if
        table) to `path` and return the path.  `measured_us`: kernel name
        (`forward:k3`) -> measured time, shown beside the prediction."""
        from .report_html import write_html
        return write_html(self, path, measured_us=measured_us, title=title, what_if=what_if)

    def to_text(self) -> str:
        applied = sum(r.applied for r in self.patterns)
        lines = [f"pattern rewrites (Dynamo graph, before AOTAutograd): {applied} applied, "
                 f"{len(self.patterns) - applied} refused"] + self.pattern_lines()
        if self.partitions:   # which forward values the backward recomputes, and which it may not
            lines.append("training graphs split (AOTAutograd, knob remat):")
            lines.extend(f"  {r.line()}" for r in self.partitions)
        if self.graph_breaks:   # each break ends a graph: nothing is fused or rewritten across it
            lines.append(f"Dynamo graph breaks: {sum(n for _, n in self.graph_breaks)} (nothing is fused or "
                         f"rewritten across a break; the code between graphs runs eagerly)")
            lines.extend(f"  {n}x {reason}" for reason, n in self.graph_breaks)
        from ..runtime.launcher import RETRIES
        if RETRIES:   # kernels Triton refused at their planned warps, launched at others (runtime/launcher.py)
            lines.append(f"Triton refused {len(RETRIES)} kernel(s) at their planned warp count (this process); "
                         "each runs at the first count that compiled:")
            lines.extend(f"  {name}: {planned} -> {used} warps ({reason})" for name, planned, used, reason in RETRIES)
        library_us = 0.0   # the eager ops' predicted time (plan/library_cost.py), every graph
        for rec in self.graphs:
            lines.append(f"== {rec.kind} graph ==")
            if rec.dynamic is not None:  # buckets, templates, and why a size got its own kernels
                lines.extend("  " + line for line in rec.dynamic.describe().split("\n"))
                if rec.plan is not None:
                    lines.append("  plan at the last new size:")
            if rec.plan is None:
                lines.append(f"  runs eagerly: {rec.eager_reason}")
                continue
            if getattr(rec, "aot_cache", "") == "hit":   # a warm process: AOTAutograd did not trace this graph
                lines.append("  ATen graph from AOTAutograd's cache (capture/aot_cache.py): joint-graph trace and "
                             "partition skipped")
            if getattr(rec, "replan_note", ""):   # Triton refused a kernel: the plan below is the second one
                lines.append(f"  {rec.replan_note}")
            for note in getattr(rec, "gemm_pads", ()):  # matrix products padded for cuBLAS, or left
                lines.append(f"  GEMM alignment: {note}")
            if rec.cuda_graph_note:  # why this graph is not replayed in a CUDA graph
                lines.append(f"  CUDA graphs: {rec.cuda_graph_note}")
            elif getattr(rec, "graph_runner", None) is not None:   # replayed: what each replay costs
                lines.append(f"  CUDA graphs: {rec.graph_runner.summary()}")
            pdl = rec.wrapper_source.count("launch_pdl=True")
            if pdl:   # (knob pdl, runtime/pdl.py)
                lines.append(f"  programmatic dependent launch: {pdl} launch line(s) overlap the kernel before "
                             "(each kernel waits on that grid first; grid-barrier kernels launch plainly)")
            if getattr(rec.plan, "graph_replay", False):   # (plans cached before the field have none)
                lines.append(f"  launches priced at a CUDA-graph replay's gap ({rec.plan.launch_s * 1e6:.1f} us a "
                             "kernel), not the host launch path: the graph is planned for capture")
            g = rec.graph
            prices = {lp.node: lp for lp in plan_library(rec.plan, current_device())}
            library_us += sum(lp.seconds for lp in prices.values()) * 1e6
            for step in rec.plan.steps:
                if hasattr(step, "members"):
                    ops = ", ".join(f"{g[m].op}" for m in step.members)
                    grp = rec.plan.group_of(step.name)
                    within = f" (in {grp.kind} launch {grp.name})" if grp else ""
                    lines.append(f"  kernel {step.name}: {step.scheme:8} {step.mapping.describe()}{within}")
                    lines.append(f"      reads {_mb(step.bytes_read)}, writes {_mb(step.bytes_written)}, "
                                 f"predicted {step.predicted_s * 1e6:.1f} us; ops: {ops}")
                    if step.walks_rows:
                        note = getattr(step, "walk_note", "")   # (plans cached before the field have none)
                        how = ("the next block's loads issued before this block's arithmetic (prefetch)"
                               if getattr(step, "prefetch", False) else
                               "each block's loads waited for before its arithmetic "
                               f"({note or 'knob prefetch_rows off'})")
                        lines.append(f"      each program walks {step.mapping.row_blocks} row blocks: {how}; "
                                     f"a memory latency a block is priced (cost.walk_latency)")
                        if note and getattr(step, "prefetch", False):
                            lines.append(f"      {note}")
                    elif getattr(step, "prefetch", False) and step.mapping.form == "row_looped":
                        lines.append(f"      {step.mapping.grid} programs walk {step.mapping.row_blocks} rows each: "
                                     "each loop over a row's column blocks issues the next block's loads before "
                                     "this block's arithmetic (prefetch; knob prefetch_columns)")
                    if getattr(step, "row_runs", False):   # (plans cached before the field have none)
                        lines.append("      reads row runs out of flat order: one element a thread, so each warp "
                                     "access is 32 consecutive elements")
                    order = getattr(step.domain, "order", ())   # (plans cached before the field have none)
                    if order and step.domain.is_flat:
                        lines.append(f"      walked in memory order (dims {order}, the last innermost): its "
                                     "reads and stores are contiguous along that dim")
                    elif order:
                        lines.append(f"      a transpose in tiles: columns along dim {step.domain.col_dims}, rows "
                                     f"ending with dim {order[-1]}; each access coalesced along its own dim")
                    if getattr(step, "transposed", ()):   # (plans cached before the field have none)
                        reads = ", ".join(f"%{r}" for r in step.transposed)
                        lines.append(f"      reads {reads} transposed: {step.mapping.block_r}-row tiles, so each "
                                     "column's run of contiguous values fills a 32-byte sector")
                    if getattr(step, "sector_waste", 0):   # (plans cached before the field have none)
                        lines.append(f"      strided reads: {step.mapping.block_r}-row tiles use part of each "
                                     f"32-byte sector; the unused {_mb(step.sector_waste)} are priced as bytes moved")
                    if step.partials and step.domain.col_dims != tuple(
                            range(len(step.domain.shape) - len(step.domain.col_dims), len(step.domain.shape))):
                        lines.append(f"      column reduction over the dims outermost in memory (rows: dims "
                                     f"{step.domain.row_dims}, columns: dims {step.domain.col_dims}, contiguous)")
                    if getattr(step, "epilogue", ()):   # (plans cached before the field have none)
                        ops = ", ".join(g[m].op for m in step.epilogue)
                        lines.append(f"      epilogue after its reductions, per column ({ops}): a one-program "
                                     "kernel fewer")
                else:
                    lp = prices.get(step.node)
                    cost = "" if lp is None else (f" [{lp.kind}: no price, {lp.note}]" if lp.kind == "unpriced" else
                                                  f" [{lp.kind}: predicted {lp.seconds * 1e6:.1f} us]")
                    lines.append(f"  eager  {step.op}: {step.reason}{cost}")
            for grp in rec.plan.groups:
                lines.append(f"  launch {grp.name}: {grp.kind} {'+'.join(grp.members)} grid={grp.grid}: {grp.reason}")
            marked: dict[str, list[str]] = {}
            for n in g.nodes:
                why = n.attr("recompute")
                if why:   # (`mark_recompute` stores the reason)
                    marked.setdefault(why, []).append(f"%{n.id}({n.op})")
            for why, nodes in marked.items():
                shown = ", ".join(nodes[:6]) + (f", ... ({len(nodes)} in all)" if len(nodes) > 6 else "")
                lines.append(f"  computed where read, not written: {shown}: {why}")
            placed: dict[int, list[str]] = {}
            for n in g.nodes:
                if n.attr("placed_in") is not None:
                    placed.setdefault(n.attr("placed_in")[0], []).append(f"%{n.id}({n.op})")
            for cat, parts in placed.items():
                lines.append(f"  written in place: {', '.join(parts)} straight into the slices of concatenation "
                             f"%{cat}, which no kernel copies (buffer placement)")
            into = [pos for pos, new in g.written() if rec.plan.copy_reason(new) is None]
            if into:
                shown = ", ".join(str(p) for p in into[:12]) + (", ..." if len(into) > 12 else "")
                lines.append(f"  graph inputs overwritten by the kernels computing their new values ({len(into)}): "
                             f"{shown}")
            for pos, new in g.written():
                why = rec.plan.copy_reason(new)
                if why is not None:
                    lines.append(f"  graph input {pos}: new value copied into it after the call: {why}")
            s = rec.plan.search
            if s is not None:
                lines.append(f"  launch search: {s.method}, modelled {s.chosen_s * 1e6:.1f} us vs rules "
                             f"{s.rule_s * 1e6:.1f} us, {s.variables} variables, solved in {s.solve_s * 1e3:.1f} ms, "
                             f"gap {s.gap:.0%}{'; ' + s.note if s.note else ''}")
                for r in getattr(s, "per_region", []):
                    if r.winner == "ilp":
                        lines.append(f"    region {r.region}: ILP wins, {r.rule_s * 1e6:.1f} -> "
                                     f"{r.chosen_s * 1e6:.1f} us "
                                     f"(saves {(r.rule_s - r.chosen_s) * 1e6:.2f} us): {r.note}")
            for r in rec.plan.refusals:
                lines.append(f"  not fused %{r.producer}({g[r.producer].op}) -> %{r.consumer}({g[r.consumer].op}): "
                             f"{r.reason}")
        dev = current_device()
        lines.append(f"predicted on {dev.name}: {self.predicted_us:.1f} us of stitched kernels + {library_us:.1f} us of "
                     f"library ops = {self.predicted_us + library_us:.1f} us; cost-model figures: {describe_source(dev)}")
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
    breaks = counters["graph_break"]
    before = dict(breaks)
    out = compiled(*example_inputs)
    if backward:
        outs = out if isinstance(out, (tuple, list)) else (out,)
        loss = sum(o.float().sum() for o in outs if isinstance(o, torch.Tensor) and o.requires_grad)
        loss.backward()
    new = [(_break_line(reason), n - before.get(reason, 0)) for reason, n in breaks.items()
           if n > before.get(reason, 0)]
    return Report(backend.records, backend.patterns, new, backend.partitions)


def _break_line(reason: str) -> str:
    """Dynamo's graph-break text in one line: what broke, and its hint if it gives one."""
    lines = [ln.strip() for ln in reason.splitlines() if ln.strip()]
    hint = next((ln for ln in lines if ln.startswith("Hint:")), None)
    return lines[0] + (f" ({hint})" if hint else "") if lines else reason


def plan_report(model: Callable, *example_inputs: Any, backward: bool = True) -> Report:
    """A Report from planning only: the model's AOT forward (and backward) graphs are
    lowered and planned, no kernel is generated or run (the model itself runs
    eagerly).  For reports on models too large to run under the interpreter."""
    import time

    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    from ..capture.decomp import decomposition_table
    from ..lower.lower import lower
    from ..plan.planner import build_plan

    records: list[CompiledGraph] = []

    def planned(kind: str):
        def compiler(gm, inputs):
            t0 = time.perf_counter()
            g = lower(gm)
            plan = build_plan(g)
            records.append(CompiledGraph(kind, graph=plan.graph, plan=plan,
                                         compile_seconds=time.perf_counter() - t0))
            return make_boxed_func(gm.forward)
        return compiler

    torch._dynamo.reset()
    backend = aot_autograd(fw_compiler=planned("forward"), bw_compiler=planned("backward"),
                           decompositions=decomposition_table(), keep_inference_input_mutations=True)
    out = torch.compile(model, backend=backend)(*example_inputs)
    if backward:
        outs = out if isinstance(out, (tuple, list)) else (getattr(out, "last_hidden_state", out),)
        loss = sum(o.float().sum() for o in outs if isinstance(o, torch.Tensor) and o.requires_grad)
        loss.backward()
    return Report(records)
