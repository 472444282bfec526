"""How AOTAutograd splits a joint training graph into forward and backward (knob `remat`).

Min-cut rematerialisation trades a saved [rows, cols] activation (written by the
forward, read by the backward) for recomputing it in a backward kernel that reads its
inputs anyway, which for memory-bound code saves both passes.

One thing it must not recompute: a value that a comparison of two tensors in the
backward depends on.  max/min backward masks `x == max`, max-pool backward finds each
window's arg-max by comparing the window's elements: a value recomputed in a backward
kernel is not always bit-identical to the forward's (fp32 kept between half-precision
ops, another FMA contraction), so the mask can lose its hit or move it.  Those values
(only the first forward value on each path, not what it is computed from) are marked
MUST_SAVE in the joint graph and min-cut runs again; the rest of the graph keeps its
recomputation.  Should a comparison still read a recomputed value after that, the whole
graph takes the default partition, which saves everything the forward computed.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch
from torch.fx import GraphModule, Node

from .. import config
from . import norm_stats

_COMPARISONS = frozenset({"eq", "ne", "lt", "le", "gt", "ge"})
# rounds of marking before giving up on min-cut for a graph (one is enough in every
# graph seen: the marked values are saved, and what the backward derives from them is
# backward work, computed once)
_MAX_ROUNDS = 3


@dataclass
class PartitionRecord:
    """How one training graph was split (shown by `explain`)."""

    method: str                                      # "min-cut" | "default"
    saved: list[str] = field(default_factory=list)   # forward values marked MUST_SAVE
    runs: int = 1                                    # min-cut runs
    precise_stats: int = 0                           # backward uses of norm statistics kept float32

    def line(self) -> str:
        return self._split() + (f"; {self.precise_stats} backward use(s) of batch/layer/group-norm statistics "
                                f"read float32, not the input dtype eager saves them in (capture/norm_stats.py)"
                                if self.precise_stats else "")

    def _split(self) -> str:
        if self.method == "default":
            if self.runs == 0:
                return "default partition (knob remat off: saves every forward value the backward reads)"
            return (f"default partition (saves every forward value the backward reads): after {self.runs} "
                    f"min-cut runs a backward comparison still read a recomputed value")
        if not self.saved:
            return "min-cut rematerialisation"
        return (f"min-cut rematerialisation, {len(self.saved)} forward value(s) saved because a backward "
                f"comparison reads them (not recomputed: {', '.join(self.saved[:6])}"
                f"{', ...' if len(self.saved) > 6 else ''})")


_SINKS: list[list[PartitionRecord]] = []


@contextlib.contextmanager
def recording(sink: list[PartitionRecord]) -> Iterator[None]:
    """Within this block, each split appends its record to `sink` (a backend's list)."""
    _SINKS.append(sink)
    try:
        yield
    finally:
        _SINKS.remove(sink)


def _record(rec: PartitionRecord) -> None:
    if _SINKS:
        _SINKS[-1].append(rec)


def _compares_tensors(node: Node) -> bool:
    """A comparison of two tensors (a comparison with a Python scalar is left alone:
    `relu_out <= 0` keeps its sign under recomputation)."""
    if node.op != "call_function" or getattr(node.target, "_opname", None) not in _COMPARISONS:
        return False
    return sum(isinstance(a, Node) for a in node.args[:2]) == 2


def forward_values(joint: GraphModule, num_fwd_outputs: int) -> set[str]:
    """Names of the joint graph's nodes that the forward computes: the ancestors of its
    first `num_fwd_outputs` outputs (placeholders excluded)."""
    from torch.utils._pytree import arg_tree_leaves
    (out,) = [n for n in joint.graph.nodes if n.op == "output"]
    # (the output's leaves, flattened as the partitioner does: forward outputs first)
    stack = [a for a in arg_tree_leaves(*out.args)[:num_fwd_outputs] if isinstance(a, Node)]
    seen: set[str] = set()
    while stack:
        n = stack.pop()
        if n.name in seen or n.op == "placeholder":
            continue
        seen.add(n.name)
        stack.extend(n.all_input_nodes)
    return seen


def recomputed_compared(bw: GraphModule, forward: set[str]) -> list[str]:
    """Forward values that the backward recomputes and a comparison of two tensors
    depends on: the first such value on each path from a comparison up its inputs (a
    comparison the forward made and the backward recomputes is itself one)."""
    found: list[str] = []
    seen: set[str] = set()
    stack = [n for n in bw.graph.nodes if _compares_tensors(n)]
    while stack:
        n = stack.pop()
        if n.name in seen or n.op != "call_function":
            continue
        seen.add(n.name)
        if n.name in forward and not _exact_integer(n):
            found.append(n.name)
            continue
        stack.extend(n.all_input_nodes)
    return sorted(found)


def _exact_integer(node: Node) -> bool:
    """Integer arithmetic of integer tensors (no bool, no float operand): recomputed, it
    is bit-identical, so a comparison may read it recomputed (a max-pool's flat argmax
    index from its saved one-byte window offset); the walk goes on to its operands."""
    def integral(v) -> bool:
        return isinstance(v, torch.Tensor) and not v.dtype.is_floating_point and not v.dtype.is_complex \
            and v.dtype != torch.bool
    if not integral(node.meta.get("val")):
        return False
    return all(integral(a.meta.get("val")) for a in node.all_input_nodes)


def remat_partition(joint_module: GraphModule, joint_inputs: Any, **kwargs: Any) -> tuple[GraphModule, GraphModule]:
    """Min-cut rematerialisation, with the values that backward comparisons depend on
    saved (module docstring)."""
    from torch._functorch.partitioners import default_partition, min_cut_rematerialization_partition
    from torch.utils.checkpoint import CheckpointPolicy
    precise = norm_stats.keep_precise(joint_module)
    # min-cut dead-code-eliminates the joint graph and replaces it by its CSE'd copy (the
    # same computation, names and node metadata), so the names it gives the split graphs
    # are those of the joint graph it leaves, and a mark set there is seen by the next call
    fw, bw = min_cut_rematerialization_partition(joint_module, joint_inputs, **kwargs)
    forward = forward_values(joint_module, kwargs["num_fwd_outputs"])
    saved: list[str] = []
    runs = 1
    while True:
        recomputed = recomputed_compared(bw, forward)
        if not recomputed:
            _record(PartitionRecord("min-cut", saved, runs, precise))
            return fw, bw
        nodes = {n.name: n for n in joint_module.graph.nodes}
        # (a name min-cut made up is not ours to mark)
        if runs > _MAX_ROUNDS or any(name not in nodes for name in recomputed):
            break
        for name in recomputed:
            nodes[name].meta["recompute"] = CheckpointPolicy.MUST_SAVE
        saved += recomputed
        fw, bw = min_cut_rematerialization_partition(joint_module, joint_inputs, **kwargs)
        runs += 1
    _record(PartitionRecord("default", saved, runs, precise))
    return default_partition(joint_module, joint_inputs, **kwargs)


def saving_partition(joint_module: GraphModule, joint_inputs: Any, **kwargs: Any) -> tuple[GraphModule, GraphModule]:
    """torch's default partition (every intermediate the backward uses saved), after the
    norm-statistics rewrite (`norm_stats.keep_precise`)."""
    from torch._functorch.partitioners import default_partition
    precise = norm_stats.keep_precise(joint_module)
    _record(PartitionRecord("default", [], 0, precise))
    return default_partition(joint_module, joint_inputs, **kwargs)


def partitioner() -> Callable:
    """The partition function AOTAutograd gets: `remat_partition` with the knob `remat`
    on, else `saving_partition` (saves every intermediate the backward uses)."""
    return remat_partition if config.get("remat") else saving_partition


__all__ = ["PartitionRecord", "forward_values", "partitioner", "recomputed_compared", "recording", "remat_partition",
           "saving_partition"]
