"""Capture: the `torch.compile` backend.  Dynamo hands us an FX graph of torch ops;
AOTAutograd turns it into core-ATen forward and backward graphs using our
decomposition table, and each graph goes through `compiler.compile_graph`."""
from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Sequence

import torch
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.utils import counters

from .. import fallback, patterns
from ..compiler import CompiledGraph, compile_graph
from ..patterns.common import PatternRecord
from ..runtime import precompile
from . import aot_cache
from .logging_breaks import ignore_once_logging
from . import partition
from .decomp import decomposition_table


class StitchBackend:
    """A backend instance; `records` lists every graph it compiled and `patterns` the
    pattern rewrites applied or refused on the Dynamo graphs it was given (for explain)."""

    def __init__(self) -> None:
        ignore_once_logging()   # (transformers may have been imported after stitchml)
        self.records: list[CompiledGraph] = []
        self.patterns: list[PatternRecord] = []
        self.partitions: list[partition.PartitionRecord] = []   # how its training graphs were split
        self.aot_cache_note: str | None = None   # why the last graph's AOTAutograd result is not cached

    def __call__(self, gm: torch.fx.GraphModule, example_inputs) -> Callable:
        precompile.prestart()   # a cold process: compile workers start while this graph is traced and planned
        # Dynamo-level rewrites (issue 15).  patterns.LOG is process-wide (every backend,
        # every model): the backend keeps its own graphs' records, so a report shows only them
        training = torch.is_grad_enabled() and any(
            isinstance(x, torch.Tensor) and x.requires_grad for x in example_inputs)
        fw_kind = "forward" if training else "inference"
        overlap = writes_into_overlap(gm)
        if overlap is not None:   # eager's semantics need the graph as Dynamo traced it
            fallback.graph_falls_back(fw_kind, overlap)
            self.records.append(CompiledGraph(kind=fw_kind, eager_reason=overlap))
            return gm.forward
        self.patterns.extend(patterns.rewrite(gm, example_inputs))

        first = len(self.records)

        def compile_kind(g, ex, kind):
            if kind != "backward":   # (inside this call: a backward may compile much later)
                # a cache hit that failed half-way (an entry torch could not finish loading)
                # left records of graphs that will not run: this cold compile replaces them
                self.records[first:] = [r for r in self.records[first:] if r.aot_cache != "hit"]
                _donate_no_buffers()
            return compile_graph(g, ex, kind, self.records)

        # a warm process takes the ATen graphs from AOTAutograd's cache (capture/aot_cache.py)
        self.aot_cache_note = aot_cache.refusal(example_inputs)
        if self.aot_cache_note is None:
            fw = aot_cache.serializable(compile_kind, fw_kind)
            bw = aot_cache.serializable(compile_kind, "backward")
            scope = aot_cache.caching(self, gm, example_inputs)
        else:
            fw = functools.partial(compile_kind, kind=fw_kind)
            bw = functools.partial(compile_kind, kind="backward")
            scope = contextlib.nullcontext()
        bypassed = counters["aot_autograd"]["autograd_cache_bypass"]
        with scope, partition.recording(self.partitions):
            compiled = aot_autograd(fw_compiler=fw, bw_compiler=bw, inference_compiler=fw,
                                    decompositions=decomposition_table(), partition_fn=partition.partitioner(),
                                    keep_inference_input_mutations=True)(gm, example_inputs)
        if self.aot_cache_note is None and counters["aot_autograd"]["autograd_cache_bypass"] > bypassed:
            self.aot_cache_note = ("torch's AOTAutograd cache bypassed this graph (torch logs why at INFO: "
                                   "torch._functorch._aot_autograd.autograd_cache)")
        return compiled

    def compile_loaded(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any], kind: str) -> Callable:
        """A graph from AOTAutograd's cache (a warm process), compiled like any other."""
        fn = compile_graph(gm, example_inputs, kind, self.records)
        if self.records:
            self.records[-1].aot_cache = "hit"
        return fn


def _donate_no_buffers() -> None:
    """Stitch's backward never writes into the forward's saved tensors, so it takes no
    donated buffers.  AOTAutograd lists them (`bw_donated_idxs`) for a backward compiler
    that would, and then refuses `backward(retain_graph=True)` once the backward is
    compiled — always for a backward compiled with the forward (capture/aot_cache.py)
    or loaded from its cache, and after a first plain backward otherwise.  Called from
    our forward compiler, where the tracing context holds the metadata AOTAutograd
    keeps (its list is shared with the outer metadata the runtime checks)."""
    ctx = torch._guards.TracingContext.try_get()
    donated = getattr(getattr(ctx, "fw_metadata", None), "bw_donated_idxs", None)
    if isinstance(donated, list):
        donated.clear()


def writes_into_overlap(gm: torch.fx.GraphModule) -> str | None:
    """Why the graph must run as traced, or None: an in-place write (`y[mask] = v`,
    `index_put_`, `masked_fill_`...) into a tensor whose elements share memory (an
    expanded view).  Eager deprecates these writes but still makes them (or raises);
    AOTAutograd's functionalisation does neither and returns the unwritten values
    (`aot_eager` is as wrong), so the graph runs eagerly, with this reason."""
    import operator

    from ..patterns.common import inplace_by_name
    for n in gm.graph.nodes:
        inplace = (n.op == "call_function" and n.target is operator.setitem) or inplace_by_name(n)
        if not inplace or not n.args or not isinstance(n.args[0], torch.fx.Node):
            continue
        v = n.args[0].meta.get("example_value")
        if isinstance(v, torch.Tensor) and torch._debug_has_internal_overlap(v) == 1:
            return (f"{n.name} writes in place into {n.args[0].name}, whose elements share memory (an expanded "
                    f"view): AOTAutograd's functionalisation would drop the write")
    return None


DEFAULT = StitchBackend()


def stitch_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable:
    """Entry point registered as `torch.compile(..., backend="stitch")`."""
    return DEFAULT(gm, example_inputs)
