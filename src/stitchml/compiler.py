"""The pipeline, top to bottom: lower → plan → codegen → runtime.

`compile_graph` is called by the capture stage for every ATen graph (inference,
training forward, training backward).  If any stage fails, the graph runs eagerly
and the reason is recorded (never a crash, never a half-compiled graph).
"""
from __future__ import annotations

import logging
import time
import warnings
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.fx as fx

from . import config
from .codegen import generate_all
from .codegen.triton_kernel import KernelSource
from .ir.nodes import Graph
from .lower.lower import lower
from .lower.registry import Unsupported
from .plan.data import Plan
from .plan.planner import build_plan
from .dynamic.runner import compile_dynamic, is_symbolic
from .runtime.wrapper import build_callable

log = logging.getLogger("stitchml")


@dataclass
class CompiledGraph:
    """What one graph compiled into; kept by the backend for `explain`."""

    kind: str                       # inference | forward | backward
    graph: Graph | None = None
    plan: Plan | None = None
    kernels: dict[str, KernelSource] = field(default_factory=dict)
    wrapper_source: str = ""
    eager_reason: str | None = None  # set when the whole graph runs eagerly
    compile_seconds: float = 0.0
    calls: int = 0
    cuda_graph_note: str = ""       # why CUDA-graph replay was not used, when asked for
    dynamic: object = None          # dynamic.runner.DynamicState for a graph with symbolic sizes


def _device_of(gm: fx.GraphModule, example_inputs) -> torch.device:
    for n in gm.graph.nodes:
        val = n.meta.get("val")
        if isinstance(val, torch.Tensor):
            return val.device
    for x in example_inputs:
        if isinstance(x, torch.Tensor):
            return x.device
    return torch.device("cpu")


def _interpreter_on() -> bool:
    """Whether Triton really runs in interpreter mode.  Triton decides when it is
    imported (its library functions are decorated then), so setting the variable
    later is not enough: check both the variable and what the library became."""
    import os
    if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        return False
    import triton.language as tl
    return type(tl.sigmoid).__name__ == "InterpretedFunction"


@dataclass
class Built:
    """What the static pipeline produced for one graph of fixed sizes."""

    graph: Graph
    plan: Plan
    kernels: dict[str, KernelSource]


def build_static(gm: fx.GraphModule, device: torch.device, *, cuda_graphs: bool = False,
                 horizontal: bool = True) -> Built:
    """lower → plan → codegen, for a graph whose sizes are all known (the runtime
    wrapper is built by the caller: one per graph, or one per size bucket)."""
    graph = lower(gm)                                                        # lower
    with config.override(global_barriers=config.get("global_barriers") and not cuda_graphs,
                         horizontal_fusion=config.get("horizontal_fusion") and horizontal):
        plan = build_plan(graph)                                             # plan
    graph = plan.graph  # planning may rewrite the graph (task splitting)
    kernels = generate_all(graph, plan, device.type)                        # codegen
    return Built(graph, plan, kernels)


def compile_graph(gm: fx.GraphModule, example_inputs, kind: str, records: list | None = None) -> Callable:
    rec = CompiledGraph(kind)
    if records is not None:
        records.append(rec)
    t0 = time.perf_counter()
    try:
        device = _device_of(gm, example_inputs)
        if device.type == "cpu" and not _interpreter_on():
            raise Unsupported("CPU tensors: kernels need a GPU, or TRITON_INTERPRET=1 set before triton is "
                              "imported (the Triton interpreter)")
        if is_symbolic(gm):  # sizes known only at run time: kernels compiled per mapping bucket
            if config.get("cuda_graphs"):
                rec.cuda_graph_note = "CUDA graphs are not applied to graphs with dynamic sizes"
                warnings.warn(f"stitchml: {rec.cuda_graph_note}", stacklevel=2)
            return compile_dynamic(gm, kind, device, rec, build_static)
        graphs = _cuda_graph_mode(kind, device, rec)
        built = build_static(gm, device, cuda_graphs=graphs)
        rec.graph, rec.plan, rec.kernels = built.graph, built.plan, built.kernels
        call, rec.wrapper_source = build_callable(rec.plan, rec.kernels, device)    # runtime
    except Exception as e:  # graceful: this graph runs eagerly
        if not config.get("fallback_on_error") and not isinstance(e, Unsupported):
            raise
        rec.eager_reason = f"{type(e).__name__}: {e}"
        rec.plan, rec.kernels = None, {}  # nothing of the plan runs: explain must not describe it
        if not isinstance(e, Unsupported):
            warnings.warn(f"stitchml: {kind} graph runs eagerly: {rec.eager_reason}", stacklevel=2)
        rec.compile_seconds = time.perf_counter() - t0
        return _eager(gm, rec)
    rec.compile_seconds = time.perf_counter() - t0
    if config.get("verbose"):
        log.warning("stitchml %s graph: %d kernels, %d eager ops (%.2fs)", kind, rec.plan.num_kernels,
                    len(rec.plan.steps) - rec.plan.num_kernels, rec.compile_seconds)

    if graphs and not any(k.seeds for k in rec.plan.kernels):
        call = _replay_in_cuda_graph(call)
    elif graphs:
        rec.cuda_graph_note = "CUDA graphs refused: kernels draw random numbers (a captured seed would repeat)"
        warnings.warn(f"stitchml: {rec.cuda_graph_note}", stacklevel=2)

    state: dict = {}

    def run(args):
        rec.calls += 1
        if "eager" in state:
            return _run_eager(gm, args)
        if rec.calls > 1:
            return call(args)
        # Triton compiles each kernel at its first launch, i.e. inside the first call:
        # a failure there is a compile failure, so this graph runs eagerly from now on
        inputs = list(args)
        try:
            return call(args)
        except Exception as e:
            if not config.get("fallback_on_error"):
                raise
            rec.eager_reason = f"{type(e).__name__} at first launch: {str(e)[:300]}"
            rec.plan, rec.kernels = None, {}
            state["eager"] = True
            warnings.warn(f"stitchml: {kind} graph runs eagerly: {rec.eager_reason}", stacklevel=2)
            return _run_eager(gm, inputs)

    run._boxed_call = True
    return run


def _run_eager(gm: fx.GraphModule, args) -> tuple:
    inputs = list(args)
    if isinstance(args, list):
        args.clear()
    return gm(*inputs)


def _cuda_graph_mode(kind: str, device: torch.device, rec: CompiledGraph) -> bool:
    if not config.get("cuda_graphs"):
        return False
    if device.type != "cuda":
        rec.cuda_graph_note = f"CUDA graphs need a CUDA device; {kind} graph on {device.type} runs without them"
        warnings.warn(f"stitchml: {rec.cuda_graph_note}", stacklevel=3)
        return False
    if kind != "inference":
        rec.cuda_graph_note = "CUDA graphs are applied to inference graphs only"
        return False
    return True


def _replay_in_cuda_graph(call: Callable) -> Callable:
    """Warm up once, capture one call on static input buffers, then replay: copy the
    new inputs in, replay, and return copies of the static outputs (the next replay
    overwrites them)."""
    state: dict = {}

    def run(args):
        inputs = list(args)
        args.clear()
        if "graph" not in state:
            out = call(list(inputs))                      # warm-up: compiles kernels
            torch.cuda.synchronize()
            static = [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                static_out = call(list(static))
            state.update(graph=graph, static=static, out=static_out)
            return out
        for dst, src in zip(state["static"], inputs):
            if isinstance(dst, torch.Tensor):
                dst.copy_(src)
        state["graph"].replay()
        return tuple(o.clone() if isinstance(o, torch.Tensor) else o for o in state["out"])

    return run


def _eager(gm: fx.GraphModule, rec: CompiledGraph) -> Callable:
    def run(args):
        rec.calls += 1
        return _run_eager(gm, args)

    run._boxed_call = True
    return run
