"""The static pipeline, top to bottom: lower → plan → codegen → load.

Capture (`capture/backend.py`: Dynamo → AOTAutograd → core-ATen FX graphs) hands each
graph to `compiler.compile_graph`, which calls `build_static` then `load` for a graph
of fixed sizes, and `dynamic.runner.compile_dynamic` for symbolic sizes: the runner
calls `build_static` at each new size and loads each template it builds through
`build_callable`, the one loading function of both paths.  Every stage is a plain
function; caching wraps them from above:

- the plan cache (`runtime/plan_cache.py`) keys what planning and code generation
  make of a *lowered* graph, so a second process skips both;
- the kernel-source cache (`runtime/kernel_cache.py`) keys a kernel by its content with
  node ids renumbered, so the same layer's kernels are generated once;
- `build_callable` starts the parallel compile of the launched kernels on a GPU
  (`runtime/precompile.py`), gives kernels equal up to their name one Triton function
  and binds a launcher to each name (`runtime/launcher.py`, through
  `wrapper.load_callable`).

`StageTimes` records where compile time went (bench and explain read it).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterable

import torch
import torch.fx as fx

from . import codegen, config
from .codegen import generate_all
from .codegen.kernel_source import KernelSource
from .ir.nodes import Graph
from .lower.lower import lower
from .plan.data import Plan
from .plan.options import PlanOptions
from .plan.planner import build_plan
from .runtime import plan_cache
from .runtime.cuda_graphs import device_seed_source, device_seeds_wanted
from .runtime.kernel_cache import cached_kernel, load_kernels
from .runtime.pdl import pdl_sources
from .runtime.precompile import Job, job_for, precompile
from .runtime.steps import Program
from .runtime.wrapper import build_program, load_callable


@dataclass
class StageTimes:
    """Seconds spent per stage for one graph (wall clock, this process)."""

    lower_s: float = 0.0
    plan_s: float = 0.0
    codegen_s: float = 0.0
    compile_s: float = 0.0      # Triton compilation before the first launch (parallel pool, GPU)
    load_s: float = 0.0         # wrapper built, kernel modules imported
    plan_cache_s: float = 0.0   # plan-cache key, lookup (and the entry read on a hit) and store
    plan_cached: bool = False   # plan and sources came from the plan cache

    def describe(self) -> str:
        cached = " (plan cache hit)" if self.plan_cached else ""
        return (f"lower {self.lower_s:.3f}s, plan {self.plan_s:.3f}s, codegen {self.codegen_s:.3f}s{cached}, "
                f"plan cache {self.plan_cache_s:.3f}s, load {self.load_s:.3f}s, "
                f"Triton compile {self.compile_s:.3f}s")


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
                 horizontal: bool = True, fixed_row_blocks: bool = False, replayed: bool = False,
                 plain_rows: bool = False) -> Built:
    """lower → plan → codegen for a graph whose sizes are all known.  `cuda_graphs`:
    no barrier launches; `horizontal=False`: no horizontal launch groups;
    `fixed_row_blocks`: row blocks independent of the row count (dynamic templates);
    `replayed`: the graph will be captured in a CUDA graph, so launches are priced at
    the replay's per-kernel gap (a barrier or a shared launch must beat that);
    `plain_rows`: looped rows walk their column blocks in one masked loop (no unmasked
    whole blocks apart from the partial one, no alignment shift: the plan the compiler
    falls back to when Triton refuses a kernel of those two loops)."""
    times = StageTimes()
    t0 = time.perf_counter()
    graph = lower(gm)                                                           # lower
    t1 = time.perf_counter()
    times.lower_s = t1 - t0
    opts = PlanOptions.from_config(global_barriers=config.get("global_barriers") and not cuda_graphs,
                                   horizontal_fusion=config.get("horizontal_fusion") and horizontal,
                                   fixed_row_blocks=fixed_row_blocks, graph_replay=replayed,
                                   **({"column_tails": False, "align_rows": False} if plain_rows else {}))
    key = plan_cache.plan_key(graph, device.type, opts)
    cached = plan_cache.load(key, graph)
    t2 = time.perf_counter()
    times.plan_cache_s = t2 - t1
    if cached is not None:
        plan, kernels = cached
        plan.source = graph   # (not pickled: what-if plans it again)
        times.plan_cached = True
        return Built(plan.graph, plan, kernels, times)
    plan = build_plan(graph, opts)                                              # plan
    t3 = time.perf_counter()
    kernels = generate_all(plan.graph, plan, _kernel_source(device.type))       # codegen
    t4 = time.perf_counter()
    times.plan_s, times.codegen_s = t3 - t2, t4 - t3
    plan_cache.store(key, graph, (plan, kernels))
    times.plan_cache_s += time.perf_counter() - t4
    return Built(plan.graph, plan, kernels, times)


def load(built: Built, device: torch.device) -> tuple[Callable, str]:
    """The callable that runs a graph of fixed sizes, and its wrapper's source.  Where
    the graph may be captured in a CUDA graph, kernels read their seeds from device
    memory."""
    t0 = time.perf_counter()
    seeds = device_seeds_wanted(device)
    kernels = pdl_sources(built.kernels, device)     # (programmatic dependent launch: knob pdl)
    program = build_program(built.plan, kernels, device, seeds)                 # wrapper steps
    kernels = {n: device_seed_source(ks) for n, ks in kernels.items()} if seeds else kernels
    code = program.render()
    built.times.load_s += time.perf_counter() - t0
    jobs = (job_for(kernels[n], built.graph) for n in built.plan.launched)
    call = build_callable(code, program.consts, {n: ks.source for n, ks in kernels.items()}, device, built.times,
                          jobs, program)
    return call, code


def build_callable(code: str, consts: dict, texts: dict[str, str], device: torch.device, times: StageTimes,
                   jobs: Iterable[Job] = (), program: Program | None = None) -> Callable:
    """Kernel texts and wrapper source → the callable: the one loading function of
    static graphs (`load`) and dynamic templates (`dynamic/runner.py`).  On a GPU the
    distinct launched kernels (`jobs`, iterated only there) start compiling in parallel
    first; the first call waits for them, so compilation overlaps with planning the
    next graph.  Kernels equal up to their name share one Triton function, and each
    name gets a launcher bound at load time."""
    t0 = time.perf_counter()
    pending = None
    if device.type == "cuda":
        load_kernels(texts)      # the module files the pool's workers read
        pending = precompile(jobs)
    call = load_callable(code, consts, texts, program)                          # launchers, wrapper
    times.load_s += time.perf_counter() - t0
    if pending is None or not pending.futures:
        return call

    def first_waits(*args):
        if pending.futures:
            times.compile_s += pending.wait()
        return call(*args)
    return first_waits


__all__ = ["Built", "StageTimes", "build_callable", "build_plan", "build_static", "generate_all", "load", "lower"]
