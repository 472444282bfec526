"""Compiling one captured graph: the static pipeline (`pipeline.py`: lower → plan →
codegen → load) for fixed sizes, the dynamic runner for symbolic ones, and what
happens when something fails.

`compile_graph` is called by the capture stage for every ATen graph (inference,
training forward, training backward).  If any stage fails, the graph runs eagerly
and the reason is recorded (never a crash, never a half-compiled graph).
"""
from __future__ import annotations

import logging
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
import torch.fx as fx

from . import config, pipeline
from .capture.pad_gemm import pad_gemms
from .codegen.kernel_source import KernelSource
from .dynamic.runner import compile_dynamic, is_symbolic
from .dynamic.shapes import data_dependent_size
from .fallback import graph_falls_back, may_fall_back
from .ir.nodes import Graph
from .lower.registry import Unsupported
from .pipeline import StageTimes
from .runtime import cuda_graphs
from .runtime.launcher import KernelRefused
from .plan.data import Plan

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
    times: StageTimes = field(default_factory=StageTimes)   # where compile time went
    first_call_seconds: float = 0.0  # the first call (kernels compiled or loaded there) included
    gemm_pads: list[str] = field(default_factory=list)  # matrix products padded for cuBLAS (capture/pad_gemm.py)
    aot_cache: str = ""              # "hit": the ATen graph came from AOTAutograd's cache (capture/aot_cache.py)
    graph_runner: object = None      # runtime.cuda_graphs.GraphRunner when replayed (its counts: explain)
    replan_note: str = ""            # why the graph was planned again at its first call (explain)


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


def compile_graph(gm: fx.GraphModule, example_inputs: Sequence[Any], kind: str,
                  records: list | None = None) -> Callable:
    rec = CompiledGraph(kind)
    if records is not None:
        records.append(rec)
    t0 = time.perf_counter()
    try:
        device = _device_of(gm, example_inputs)
        if device.type == "cpu" and not _interpreter_on():
            raise Unsupported("CPU tensors: kernels need a GPU, or TRITON_INTERPRET=1 set before triton is "
                              "imported (the Triton interpreter)")
        nd = data_dependent_size(gm)
        if nd is not None:
            raise Unsupported(f"a size that depends on tensor values (Dynamo's capture_dynamic_output_shape_ops): "
                              f"{nd}; kernels are planned from sizes the inputs give")
        if is_symbolic(gm):  # sizes known only at run time: kernels compiled per mapping bucket
            cuda_graphs.enabled(kind, device, rec, dynamic=True)  # (records why not)
            return compile_dynamic(gm, kind, device, rec)
        graphs = cuda_graphs.enabled(kind, device, rec)
        rec.gemm_pads = pad_gemms(gm, device=device)  # misaligned products padded (static sizes only)
        # lower, plan, codegen (barrier counters are graph-safe; a graph planned for capture
        # prices each launch at the replay's gap, not the host launch path)
        built = pipeline.build_static(gm, device, replayed=graphs)
        if graphs and cuda_graphs.plan_refusal(built.plan):   # it will run without capture: plan for that
            built = pipeline.build_static(gm, device)
        rec.graph, rec.plan, rec.kernels, rec.times = built.graph, built.plan, built.kernels, built.times
        call, rec.wrapper_source = pipeline.load(built, device)                    # kernels, wrapper
    except Exception as e:  # graceful: this graph runs eagerly
        if not config.get("fallback_on_error") and not isinstance(e, Unsupported):
            raise
        rec.eager_reason = f"{type(e).__name__}: {e}"
        rec.plan, rec.kernels = None, {}  # nothing of the plan runs: explain must not describe it
        graph_falls_back(kind, rec.eager_reason, e)  # one warning per graph; raises under strict
        rec.compile_seconds = time.perf_counter() - t0
        return _eager(gm, rec)
    rec.compile_seconds = time.perf_counter() - t0
    if config.get("verbose"):
        log.warning("stitchml %s graph: %d kernels, %d eager ops (%.2fs)", kind, rec.plan.num_kernels,
                    len(rec.plan.steps) - rec.plan.num_kernels, rec.compile_seconds)

    def captured(call: Callable) -> Callable:
        if not graphs:
            return call
        call = cuda_graphs.wrap(call, rec)   # captured at the second call, replayed after (runtime/cuda_graphs.py)
        if isinstance(call, cuda_graphs.GraphRunner):
            rec.graph_runner = call
        return call

    def replanned(error: Exception, tried: set[str]) -> Callable | None:
        """After Triton refused a kernel that no other warp count mends, at the first call:
        the graph planned again in the first way not yet tried that removes what the
        refused kernels are built from, else None.  Without grid barriers, where the plan
        had global launches (each global launch's phases as launches of their own, whose
        kernels the launcher may retry at other warps); without column tails, where a
        looped row walks its whole column blocks and the partial one in two loops (Triton
        3.6 refused such a float16 fuzz kernel at every warp count, a value of the first
        loop used in the second: bench/NOTES.md, forty-fourth session)."""
        if not isinstance(error, KernelRefused):
            return None
        ways = [("barriers", any(g.kind == "global" for g in rec.plan.groups), {},
                 "without grid barriers"),
                ("tails", any(k.column_tail or k.row_align for k in rec.plan.kernels), {"plain_rows": True},
                 "without grid barriers or column tails")]
        for name, applies, extra, what in ways:
            if name in tried or not applies:
                continue
            tried.add(name)
            built = pipeline.build_static(gm, device, cuda_graphs=True, replayed=graphs, **extra)
            again, source = pipeline.load(built, device)
            rec.graph, rec.plan, rec.kernels, rec.wrapper_source = built.graph, built.plan, built.kernels, source
            rec.replan_note = f"planned again {what} at the first call: {str(error)[:300]}"
            log.warning("stitchml: %s graph %s", kind, rec.replan_note)
            return again
        return None

    state: dict = {"call": captured(call)}

    def run(args):
        rec.calls += 1
        if "eager" in state:
            return _run_eager(gm, args)
        if rec.calls > 1:
            return state["call"](args)
        # Triton compiles each kernel at its first launch, i.e. inside the first call:
        # a failure there is a compile failure.  A kernel Triton refuses at every warp
        # count makes the graph planned again without what such kernels are built from
        # (grid barriers, then column tails: `replanned`); anything else (or a refusal
        # left after those) runs this graph eagerly from now on
        inputs = list(args)
        t_first = time.perf_counter()
        try:
            out = state["call"](args)
            rec.first_call_seconds = time.perf_counter() - t_first
            return out
        except Exception as e:
            error = e
        tried: set[str] = set()   # (each way once: the loop ends)
        while True:
            try:
                again = replanned(error, tried)
                if again is None:
                    break
                out = again(list(inputs))
                state["call"] = captured(again)
                rec.first_call_seconds = time.perf_counter() - t_first
                return out
            except Exception as e:
                error = e
        if not may_fall_back():
            raise error
        rec.eager_reason = f"{type(error).__name__} at first launch: {str(error)[:300]}"
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


def _eager(gm: fx.GraphModule, rec: CompiledGraph) -> Callable:
    def run(args):
        rec.calls += 1
        return _run_eager(gm, args)

    run._boxed_call = True
    return run
