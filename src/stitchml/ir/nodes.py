"""Stitch IR: frozen, hashable nodes and the graph that holds them.

A node describes *what* is computed, never *how*: views are index maps, reductions
name their axes, opaque nodes name the eager call that produces them.  The planner
and code generator read this data; nothing here runs kernels.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import torch


@dataclass(frozen=True)
class Ref:
    """A reference to another node's value inside an op's argument list."""

    id: int


Arg = Any  # Ref | int | float | bool | None | tuple

# Node kinds.  Every kind except OPAQUE / ITEM / INPUT can be stitched into kernels.
INPUT = "input"          # graph placeholder
POINTWISE = "pointwise"  # element-wise op on operands of exactly this node's shape
VIEW = "view"            # pure index map of one operand (permute, expand, reshape, slice, ...)
REDUCE = "reduce"        # sum / amax / amin / prod / argmax / argmin over `dims`
SCAN = "scan"            # inclusive prefix sum / prod / logsumexp along `dim` (same shape as its operand)
CAT = "cat"              # concatenation: an index map with a select on the position
GATHER = "gather"        # index map whose index is a loaded value (embedding, index_select, gather)
RAND = "rand"            # counter-based uniform [0,1) numbers, keyed by element index and a seed
SCATTER_ADD = "scatter_add"  # embedding backward: rows of `src` added into `num` rows at `index`
OPAQUE = "opaque"        # runs eagerly (matrix products, convolutions, ops without a rule)
ITEM = "item"            # one output of a multi-output opaque node

STITCHABLE = frozenset({POINTWISE, VIEW, REDUCE, SCAN, CAT, GATHER, RAND})
# reductions whose partial results combine with the reduction itself, so a row can be
# reduced in pieces: chunks of a split row, column partials per program, one loop
# shared by siblings (argmax/argmin carry an index and are not among them); xor_sum is
# the bitwise XOR of 64-bit integers (hash_tensor)
COMBINABLE_REDUCES = frozenset({"sum", "prod", "amax", "amin", "xor_sum"})


@dataclass(frozen=True)
class Node:
    id: int
    kind: str
    op: str
    args: tuple[Arg, ...]
    shape: tuple[int, ...] | None
    dtype: torch.dtype | None
    # eager strides of the value (what eager would return); used for outputs and buffers
    stride: tuple[int, ...] | None = None
    attrs: tuple[tuple[str, Any], ...] = ()

    def attr(self, name: str, default: Any = None) -> Any:
        for k, v in self.attrs:
            if k == name:
                return v
        return default

    @property
    def refs(self) -> tuple[int, ...]:
        return tuple(_iter_refs(self.args))

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape or ():
            n *= s
        return n


def _iter_refs(args: Iterable[Arg]):
    for a in args:
        if isinstance(a, Ref):
            yield a.id
        elif isinstance(a, (tuple, list)):
            yield from _iter_refs(a)


@dataclass(frozen=True)
class Fallback:
    """An op that runs eagerly, and why."""

    op: str
    reason: str


@dataclass
class Graph:
    """Nodes in topological order, the graph inputs and outputs.

    `outputs` holds Refs or plain Python values (aot_autograd graphs may return ints).
    `eager_calls` maps an opaque node id to the FX target and arguments it replays.
    `input_writes`: graph inputs the graph writes in place (an optimizer step's parameters
    and moments: AOTAutograd's `copy_(input, new value)` kept in inference graphs), as
    input positions; the last `len(input_writes)` entries of `outputs` are their new
    values, in that order, kept alive like outputs but not returned (`returned`).
    """

    nodes: list[Node] = field(default_factory=list)
    inputs: list[int] = field(default_factory=list)
    outputs: list[Arg] = field(default_factory=list)
    fallbacks: list[Fallback] = field(default_factory=list)
    eager_calls: dict[int, tuple[Any, tuple, dict]] = field(default_factory=dict)
    constants: dict[int, Any] = field(default_factory=dict)  # INPUT nodes holding a module's tensor
    input_writes: list[int] = field(default_factory=list)

    def add(self, kind: str, op: str, args: tuple, shape: Sequence[int] | None, dtype: torch.dtype | None,
            stride: Sequence[int] | None = None, attrs: Iterable[tuple[str, Any]] = ()) -> int:
        nid = len(self.nodes)
        self.nodes.append(Node(nid, kind, op, tuple(args), None if shape is None else tuple(shape),
                               dtype, None if stride is None else tuple(stride), tuple(attrs)))
        return nid

    def __getitem__(self, nid: int) -> Node:
        return self.nodes[nid]

    def users(self) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {n.id: [] for n in self.nodes}
        for n in self.nodes:
            for r in dict.fromkeys(n.refs):
                out[r].append(n.id)
        return out

    def output_ids(self) -> list[int]:
        return [o.id for o in self.outputs if isinstance(o, Ref)]

    @property
    def returned(self) -> list[Arg]:
        """The outputs the compiled graph returns (`outputs` less the in-place writes)."""
        return self.outputs[:len(self.outputs) - len(self.input_writes)]

    def written(self) -> list[tuple[int, int]]:
        """(input position, node id of its new value) of each in-place write."""
        new = self.outputs[len(self.outputs) - len(self.input_writes):]
        return [(pos, r.id) for pos, r in zip(self.input_writes, new)]

    def read_by_position(self) -> set[int]:
        """Positions of the graph inputs whose storage an as_strided reads by position
        (INPUT nodes with `storage_of`: `lower/rules_views.storage_read`)."""
        return {n.attr("storage_of") for n in self.nodes if n.kind == INPUT and n.attr("storage_of") is not None}

    def summary(self) -> str:
        lines = []
        for n in self.nodes:
            lines.append(f"%{n.id} = {n.kind}.{n.op}{n.args} {n.shape} {n.dtype} {dict(n.attrs)}")
        lines.append(f"return {self.outputs}")
        return "\n".join(lines)


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, acc = [], 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(strides))


def non_overlapping(shape: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    """No two elements share memory (a strided slice may leave gaps; an expanded view
    overlaps): a kernel can write each element where it lives."""
    dims = sorted((st, sz) for st, sz in zip(stride, shape) if sz != 1)
    span = 1
    for st, sz in dims:
        if st < span:
            return False
        span = st * sz
    return True


# The float8 types are storage types to kernels: a value of one is held as its bits
# (uint8), moved by copies and views, and converted only by `cast`, with eager's own
# rounding written out in integer arithmetic (`codegen/triton_ops.py`, `_to_e4m3fn`):
# the GPU's conversion saturates float8_e5m2 where eager rounds to infinity, and the
# interpreter's has no rule for overflow, so neither is trusted.
FLOAT8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The type a value of `dtype` is computed in inside kernels: half types in float32,
    float8 types as their bits (uint8)."""
    if dtype in (torch.float16, torch.bfloat16):
        return torch.float32
    return torch.uint8 if dtype in FLOAT8_DTYPES else dtype


def prod(xs: Iterable[int]) -> int:
    p = 1
    for x in xs:
        p *= x
    return p
