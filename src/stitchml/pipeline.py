"""The static pipeline, top to bottom: lower → plan → codegen → load.

Capture (`capture/backend.py`: Dynamo → AOTAutograd → core-ATen FX graphs) hands each
graph to `compiler.compile_graph`, which calls `build_static` then `load` for a graph
of fixed sizes, and the dynamic runner (`dynamic/runner.py`) calls `build_static` at
each new size.  Every stage is a plain function; caching wraps them from above:

- the plan cache (`runtime/plan_cache.py`) keys what planning and code generation
  make of a *lowered* graph, so a second process skips both;
- the kernel-source cache (`runtime/kernel_cache.py`) keys a kernel by its content with
  node ids renumbered, so the same layer's kernels are generated once;
- `load` gives kernels equal up to their name one Triton function, compiles the
  distinct ones in parallel on a GPU (`runtime/precompile.py`) and binds launchers
  (`runtime/launcher.py`).

`StageTimes` records where compile time went (bench and explain read it).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.fx as fx

from . import codegen, config
from .codegen import generate_all
from .codegen.kernel_source import KernelSource
from .ir.nodes import Graph
from .lower.lower import lower
from .plan.data import Plan
from .plan.planner import build_plan
from .runtime import plan_cache
from .runtime.kernel_cache import cached_kernel
from .runtime.wrapper import build_callable


@dataclass
class StageTimes:
    """Seconds spent per stage for one graph (wall clock, this process)."""

    lower_s: float = 0.0
    plan_s: float = 0.0
    codegen_s: float = 0.0
    compile_s: float = 0.0      # Triton compilation before the first launch (parallel pool, GPU)
    load_s: float = 0.0         # wrapper built, kernel modules imported
    plan_cached: bool = False   # plan and sources came from the plan cache

    def describe(self) -> str:
        cached = " (plan cache hit)" if self.plan_cached else ""
        return (f"lower {self.lower_s:.3f}s, plan {self.plan_s:.3f}s, codegen {self.codegen_s:.3f}s{cached}, "
                f"load {self.load_s:.3f}s, Triton compile {self.compile_s:.3f}s")


@dataclass
class Built:
    """What the static pipeline produced for one graph of fixed sizes."""

    graph: Graph
    plan: Plan
    kernels: dict[str, KernelSource]
    times: StageTimes = field(default_factory=StageTimes)


def _kernel_source(device_kind: str) -> Callable:
    # looked up at call time (codegen.generate), so the cache wraps whatever generator is installed
    return lambda g, k: cached_kernel(g, k, device_kind, lambda: codegen.generate(g, k))


def build_static(gm: fx.GraphModule, device: torch.device, *, cuda_graphs: bool = False,
                 horizontal: bool = True) -> Built:
    """lower → plan → codegen for a graph whose sizes are all known."""
    times = StageTimes()
    t0 = time.perf_counter()
    graph = lower(gm)                                                           # lower
    times.lower_s = time.perf_counter() - t0
    key = plan_cache.plan_key(graph, device.type, cuda_graphs=cuda_graphs, horizontal=horizontal)
    cached = plan_cache.load(key, graph)
    if cached is not None:
        plan, kernels = cached
        times.plan_cached = True
        return Built(plan.graph, plan, kernels, times)
    t1 = time.perf_counter()
    with config.override(global_barriers=config.get("global_barriers") and not cuda_graphs,
                         horizontal_fusion=config.get("horizontal_fusion") and horizontal):
        plan = build_plan(graph)                                                # plan
    t2 = time.perf_counter()
    kernels = generate_all(plan.graph, plan, _kernel_source(device.type))       # codegen
    times.plan_s, times.codegen_s = t2 - t1, time.perf_counter() - t2
    plan_cache.store(key, graph, (plan, kernels))
    return Built(plan.graph, plan, kernels, times)


def load(built: Built, device: torch.device) -> tuple[Callable, str]:
    """The callable that runs the graph, and its wrapper's source.  On a GPU the
    graph's distinct kernels start compiling in parallel (`precompile`); the first
    call waits for them, so compilation overlaps with planning the next graph."""
    pending = None
    if device.type == "cuda":
        from .runtime.precompile import precompile
        pending = precompile(built.kernels, built.graph, built.plan.launched)
    t1 = time.perf_counter()
    call, source = build_callable(built.plan, built.kernels, device)           # runtime
    built.times.load_s = time.perf_counter() - t1
    if pending is None or not pending.futures:
        return call, source

    def first_waits(args):
        if pending.futures:
            built.times.compile_s = pending.wait()
        return call(args)
    return first_waits, source


__all__ = ["Built", "StageTimes", "build_static", "build_plan", "build_callable", "generate_all", "load", "lower"]
