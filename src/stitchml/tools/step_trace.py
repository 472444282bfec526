"""Where a step's time goes between the host and the GPU (issue 12): one bench case,
some contenders, the bench harness's own call order, then a profiler trace of a few
steady-state steps with host (CPU) and device activity.

    python -m stitchml.tools.step_trace --case bert_train --dtype bf16 \\
        --contender stitchml --contender inductor-ro --out DIR [--steps 3] [--quick]

For each contender it writes `DIR/<case>-<dtype>-<contender>.json.gz` (a Chrome trace:
chrome://tracing or ui.perfetto.dev) and adds to `DIR/step_trace.md` / `.json`:
- wall per step, device-busy time, the GPU's idle time inside the steps;
- the largest idle gaps, each with the host activities that overlap it most (what the
  GPU waited for: a Python wrapper, autograd, a synchronising call);
- host calls that wait for the device (`cuda*Synchronize`, device-to-host copies), with
  the operator they were made from;
- for stitch, each compiled graph's CUDA-graph state (`GraphRunner.summary`): what a
  replay reads in place and copies, and why calls ran without the graph;
- the host's own time by Python function (`cProfile` over more steady-state steps, no
  torch profiler then): per step, the functions with the most time of their own, with
  their calls a step, so that a contender's host time can be split by what it calls.

Why: on the H200 (2026-11-27) stitch's BERT training step with CUDA graphs measured
10.05 ms wall against 6.15 ms of device activity while the host thread used 2.4 ms of
CPU: the GPU idled ~4 ms a step and nothing in the bench's tables said on what.

Nothing here is a benchmark figure: the profiler adds overhead to every host call.
The gap analysis (`idle_gaps`) is plain arithmetic over (start, end) intervals and is
tested on the CPU with made-up events.
"""
from __future__ import annotations

import argparse
import cProfile
import gzip
import pstats
import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import torch

SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy ",
              "cudaMemcpy(", "cudaStreamWaitEvent")
GAP_MIN_US = 5.0      # shorter gaps are the device's own launch spacing, not waiting


@dataclass
class Interval:
    name: str
    start_us: float
    end_us: float
    device: bool                      # a device activity (kernel, copy, memset)
    parent: str = ""                  # host: the operator this call was made from


@dataclass
class Gap:
    start_us: float
    end_us: float
    host: list[tuple[str, float]] = field(default_factory=list)   # (host activity, overlap µs), largest first

    @property
    def us(self) -> float:
        return self.end_us - self.start_us


def merge(spans: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """Union of intervals, sorted."""
    out: list[list[float]] = []
    for s, e in sorted(spans):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def idle_gaps(events: list[Interval], window: tuple[float, float], top: int = 10,
              min_us: float = GAP_MIN_US) -> tuple[float, float, list[Gap]]:
    """(device-busy µs, device-idle µs, the `top` largest idle gaps) inside `window`;
    each gap names the host activities overlapping it, by overlap."""
    lo, hi = window
    busy = merge((max(e.start_us, lo), min(e.end_us, hi)) for e in events
                 if e.device and e.end_us > lo and e.start_us < hi)
    busy_us = sum(e - s for s, e in busy)
    gaps = []
    cursor = lo
    for s, e in busy + [(hi, hi)]:
        if s - cursor >= min_us:
            gaps.append(Gap(cursor, s))
        cursor = max(cursor, e)
    idle_us = (hi - lo) - busy_us
    gaps.sort(key=lambda g: -g.us)
    host = [e for e in events if not e.device]
    for g in gaps[:top]:
        overlap: dict[str, float] = {}
        for h in host:
            o = min(h.end_us, g.end_us) - max(h.start_us, g.start_us)
            if o > 0:
                key = f"{h.name} [in {h.parent}]" if h.parent else h.name
                overlap[key] = overlap.get(key, 0.0) + o
        g.host = sorted(overlap.items(), key=lambda kv: -kv[1])[:6]
    return busy_us, idle_us, gaps[:top]


def sync_calls(events: list[Interval]) -> dict[str, dict[str, float]]:
    """Host calls that wait for the device, by (call, operator): count and total µs."""
    out: dict[str, dict[str, float]] = {}
    for e in events:
        if not e.device and any(e.name.startswith(s) for s in SYNC_CALLS):
            key = f"{e.name} [in {e.parent or '?'}]"
            d = out.setdefault(key, {"count": 0, "us": 0.0})
            d["count"] += 1
            d["us"] += e.end_us - e.start_us
    return out


def _intervals(prof: Any) -> list[Interval]:
    """The profiler's events as intervals; a host call's parent is its innermost
    enclosing operator (`aten::...` or a Python-level record)."""
    out = []
    for evt in prof.events():
        tr = evt.time_range
        dev = getattr(evt, "device_type", None) == torch.autograd.DeviceType.CUDA
        parent = ""
        p = getattr(evt, "cpu_parent", None)
        while p is not None and not parent:
            if not p.name.startswith("cuda"):
                parent = p.name
            p = getattr(p, "cpu_parent", None)
        out.append(Interval(evt.name, float(tr.start), float(tr.end), dev, parent))
    return out


def host_profile(step: Any, steps: int, top: int = 25) -> list[dict[str, Any]]:
    """`steps` calls of `step` under cProfile: the `top` functions by their own time,
    per step (µs), with calls a step and time including callees.  Why: the bench's host
    time per step is one number; this splits it by what the host does (a wrapper line,
    a library call, a launcher, autograd), for comparison between contenders."""
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(steps):
        step()
    prof.disable()
    st = pstats.Stats(prof)
    rows = []
    for (file, line, fn), (_cc, ncalls, tt, ct, _callers) in st.stats.items():   # type: ignore[attr-defined]
        where = fn if file == "~" else f"{Path(file).name}:{line}({fn})"
        rows.append({"function": where, "calls": round(ncalls / steps, 1), "own_us": round(tt / steps * 1e6, 1),
                     "cum_us": round(ct / steps * 1e6, 1)})
    rows.sort(key=lambda r: -r["own_us"])
    return rows[:top]


def _runner_lines(contender: Any) -> list[str]:
    backend = getattr(contender, "backend", None)
    lines = []
    for rec in getattr(backend, "records", []) or []:
        runner = getattr(rec, "graph_runner", None)
        state = runner.summary() if runner is not None else (rec.cuda_graph_note or "not replayed in a CUDA graph")
        lines.append(f"{rec.kind} graph: {state}")
    return lines


def trace_case(case: str, dtype: str, names: list[str], out: Path, steps: int = 3, quick: bool = False,
               warm_steps: int = 4, profile_steps: int = 20) -> list[dict[str, Any]]:
    from ..bench.harness import BenchOptions, make_context, pick_contenders, reference, select_cases
    from ..bench.timing import wall_call
    from ..capture.logging_breaks import ignore_once_logging
    opts = BenchOptions(cases=(case,), quick=quick, dtype=dtype)
    ctx, specs = make_context(opts), select_cases(opts)
    if not specs:
        raise SystemExit(f"no bench case {case!r} (stitchml bench --list)")
    spec = specs[0]
    rows = []
    for c in pick_contenders(tuple(names)):
        w = spec.build(dtype, ctx.device, spec.name)
        ignore_once_logging()     # as the harness does once the case's libraries are imported
        skip = c.skip_reason(w, ctx)
        reference(w)
        if skip is not None:
            rows.append({"case": spec.name, "dtype": dtype, "contender": c.name, "skipped": skip[1]})
            continue
        p = c.prepare(w, ctx)                       # the cold call (its results kept, as the harness does)
        first = p.first
        held, _ = wall_call(p.step, ctx.device)     # held while the next calls run, as the harness does
        for _ in range(warm_steps):
            p.step()
        acts = [torch.profiler.ProfilerActivity.CPU]
        if ctx.device.type == "cuda":
            acts.append(torch.profiler.ProfilerActivity.CUDA)
        walls = []
        with torch.profiler.profile(activities=acts) as prof:
            for _ in range(steps):
                walls.append(wall_call(p.step, ctx.device)[1])
        host = host_profile(p.step, profile_steps) if profile_steps else []
        del first, held
        name = f"{spec.name}-{dtype}-{c.name}".replace("[", "_").replace("]", "").replace(",", "_")
        raw = out / f"{name}.json"
        prof.export_chrome_trace(str(raw))
        with open(raw, "rb") as src, gzip.open(f"{raw}.gz", "wb") as dst:
            shutil.copyfileobj(src, dst)
        raw.unlink()
        ev = _intervals(prof)
        window = (min(e.start_us for e in ev), max(e.end_us for e in ev)) if ev else (0.0, 0.0)
        busy, idle, gaps = idle_gaps(ev, window)
        row = {"case": spec.name, "dtype": dtype, "contender": c.name, "steps": steps,
               "wall_ms_per_step": [round(x * 1e3, 3) for x in walls],
               "device_busy_ms_per_step": round(busy / 1e3 / steps, 3),
               "device_idle_ms_per_step": round(idle / 1e3 / steps, 3) if ctx.device.type == "cuda" else None,
               "gaps": [{"us": round(g.us, 1), "host": [(h, round(o, 1)) for h, o in g.host]} for g in gaps]
               if ctx.device.type == "cuda" else [],
               "sync_calls": sync_calls(ev), "graphs": _runner_lines(c), "trace": f"{raw.name}.gz",
               "host_profile": host, "host_profile_steps": profile_steps}
        rows.append(row)
        del p
        torch._dynamo.reset()
    return rows


def to_markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["# step traces (profiler on: figures carry its overhead; not benchmark results)", ""]
    for r in rows:
        lines.append(f"## {r['case']} {r['dtype']} {r['contender']}")
        if "skipped" in r:
            lines += [f"skipped: {r['skipped']}", ""]
            continue
        lines.append(f"- wall per step (ms): {r['wall_ms_per_step']}; device busy {r['device_busy_ms_per_step']} ms, "
                     f"device idle {r['device_idle_ms_per_step']} ms a step (CPU: n/a)")
        for g in r["graphs"]:
            lines.append(f"- {g}")
        for k, v in sorted(r["sync_calls"].items(), key=lambda kv: -kv[1]["us"]):
            lines.append(f"- waits for the device: {k}: {v['count']} calls, {v['us']:.0f} µs")
        for g in r["gaps"]:
            host = "; ".join(f"{h} {o:.0f} µs" for h, o in g["host"]) or "no host activity"
            lines.append(f"- idle gap {g['us']:.0f} µs: {host}")
        lines.append(f"- trace: {r['trace']}")
        if r.get("host_profile"):
            lines += ["", f"Host time by function (cProfile, {r['host_profile_steps']} steps, per step; "
                      "cProfile's own overhead inflates many small calls):", "",
                      "| function | calls | own µs | with callees µs |", "|---|---|---|---|"]
            lines += [f"| `{h['function']}` | {h['calls']} | {h['own_us']} | {h['cum_us']} |" for h in r["host_profile"]]
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m stitchml.tools.step_trace", description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", action="append", required=True, help="bench case (name or family), repeatable")
    ap.add_argument("--contender", action="append", default=None, help="repeatable (default: stitchml, inductor-ro)")
    ap.add_argument("--dtype", default="bf16", choices=("fp32", "bf16"))
    ap.add_argument("--steps", type=int, default=3, help="steady-state steps profiled")
    ap.add_argument("--quick", action="store_true", help="the bench's --quick sizes")
    ap.add_argument("--profile-steps", type=int, default=20,
                    help="steady-state steps under cProfile for the host table (0: none)")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    rows = []
    t0 = time.perf_counter()
    for case in a.case:
        rows += trace_case(case, a.dtype, a.contender or ["stitchml", "inductor-ro"], a.out, a.steps, a.quick,
                           profile_steps=a.profile_steps)
    (a.out / "step_trace.json").write_text(json.dumps(rows, indent=1))
    (a.out / "step_trace.md").write_text(to_markdown(rows))
    print(to_markdown(rows))
    print(f"step_trace: {len(rows)} rows in {time.perf_counter() - t0:.0f} s -> {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
