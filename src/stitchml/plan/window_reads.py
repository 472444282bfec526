"""Values a kernel would compute again at many index maps (pooling windows), written once instead.

Code generation evaluates a fused member once per distinct index map its readers in the
kernel reach it through: a value read through the nine strided slices of a 3x3 pooling
window is computed at nine positions per output element.  That is what makes a producer
fused into its pool cheap (ResNet-50's stem: batch norm and ReLU computed in the pool
kernel instead of written and read back).  But the work grows with the window: timm's
cspnext SPPF block reads one batch norm + SiLU through its 5x5, 9x9 and 13x13 stride-1
windows, 275 maps, and the fused kernel evaluated the producer (~18 lines) at each of them:
7900 lines that Triton 3.6 compiled for minutes, and ~275 times the producer's arithmetic
per element on the GPU, work the byte model does not see (a fused value costs no bytes).

`heavy_window_reads(g, plan, budget)` finds, in a plan, each member that a kernel
evaluates at more than `budget` operations per element beyond what its readers need
anyway: (its evaluations per element - its most-evaluated reader's) x (operations per
evaluation).  Evaluations per element
follow the kernel's reads back from its members: a value read by members at its own
index (element-wise) is evaluated as often as the most-evaluated of them (one map, code
generation computes it once); read through a view or a concatenation (another map), as
often as the sum over those readers, scaled by the elements the view covers.  The
planner then keeps such a value and its window readers in different kernels
(`Grouper(cuts=...)`): it is written once and the readers load it.  ResNet-50's stem
pool (3x3, stride 2: ~2.3 evaluations per element of a ~6-operation producer, ~8
operations) and PoolFormer's token mixer (a 3x3 stride-1 average pool of a group norm
that planning recomputes in its readers: the residual add under it, ~170 operations)
stay fused under the default budget of 256; cspnext's SPPF (~7000) is cut.  Per-row and
per-sample values (a group norm's rstd) are left alone: code generation computes those
once a row, or reads them from cache.
"""
from __future__ import annotations

from ..ir import nodes as ir
from .data import KernelPlan, Plan
from .graph_view import EXPENSIVE, FREE_POINTWISE, is_free, view_base

# an expensive element-wise op (exp, sigmoid, erf...) counted as this many operations
EXPENSIVE_OPS = 4


def _closure(g: ir.Graph, k: KernelPlan) -> set[int]:
    """The kernel's members and the free nodes between them and its inputs."""
    inputs = set(k.inputs)
    seen = set(k.members)
    stack = list(k.members)
    while stack:
        for r in g[stack.pop()].refs:
            if r not in seen and r not in inputs and is_free(g[r]):
                seen.add(r)
                stack.append(r)
    return seen


def _is_map(n: ir.Node) -> bool:
    """A free node that reads its operand at other positions than its own."""
    return n.kind in (ir.VIEW, ir.CAT)


def evaluations(g: ir.Graph, k: KernelPlan) -> dict[int, float]:
    """Per node of the kernel's closure, how many times code generation evaluates it per
    element (an upper bound: maps that compose to the same position count apart)."""
    return _evaluations(g, k)[0]


def _evaluations(g: ir.Graph, k: KernelPlan) -> tuple[dict[int, float], dict[int, list[int]]]:
    closure = _closure(g, k)
    readers: dict[int, list[int]] = {}
    for nid in closure:
        for r in set(g[nid].refs):
            if r in closure:
                readers.setdefault(r, []).append(nid)
    f: dict[int, float] = {}
    for nid in sorted(closure, reverse=True):   # a node's readers have larger ids
        n = g[nid]
        same, shifted = 0.0, 0.0
        for r in readers.get(nid, ()):
            rn = g[r]
            if rn.kind == ir.VIEW and rn.op == "expand":
                same = max(same, f[r])   # a broadcast value: once a row, or cached
            elif rn.kind == ir.VIEW:
                # each element of a view is one of its source's: a strided slice covers
                # fewer of them, overlapping windows (an unfold) each many times
                shifted += f[r] * rn.numel / max(n.numel, 1)
            elif _is_map(rn):
                # a concatenation's evaluations land on its parts; constant parts (a pad's
                # -inf border) take no evaluation of a value
                shifted += f[r] * rn.numel / max(_data_elems(g, rn), 1)
            else:
                same = max(same, f[r])
        f[nid] = max(same + shifted, 1.0 if nid in k.members else 0.0)
    return f, readers


def _data_elems(g: ir.Graph, cat: ir.Node) -> int:
    """Elements of a concatenation's parts that are not constants."""
    return sum(g[r].numel for r in cat.refs
               if not (view_base(g, r).kind == ir.POINTWISE and view_base(g, r).op in FREE_POINTWISE))


def _operations(g: ir.Graph, nid: int, closure: set[int], inputs: set[int]) -> int:
    """Operations one evaluation of `nid` costs in its kernel: the element-wise ops up to
    the kernel's inputs and reductions (a reduction's row value is computed once a row),
    a load per input read."""
    seen: set[int] = set()
    stack = [nid]
    ops = 0
    while stack:
        m = stack.pop()
        if m in seen:
            continue
        seen.add(m)
        n = g[m]
        if m in inputs or m not in closure:
            ops += 1   # a load
            continue
        if n.kind == ir.POINTWISE:
            ops += EXPENSIVE_OPS if n.op in EXPENSIVE else 1
        elif n.kind != ir.VIEW:
            ops += 1
            if n.kind != ir.CAT:   # a reduction, scan, gather...: its result, not its inputs again
                continue
        stack.extend(n.refs)
    return ops


def heavy_window_reads(g: ir.Graph, plan: Plan, budget: float) -> dict[int, str]:
    """Members to be written once and read by their window readers, with the reason.

    A member is cut where its evaluations multiply: beyond those of the members that
    read it (through free nodes), which it would need anyway.  A batch norm's
    per-channel scale, read through an expand by a normalisation evaluated at every
    window offset, is evaluated as often as that normalisation: cutting the
    normalisation's output (the value the windows read) removes both."""
    out: dict[int, str] = {}
    if budget <= 0:
        return out
    users = g.users()
    for k in plan.kernels:
        if k.combine_of or len(k.members) < 2:
            continue
        f, readers = _evaluations(g, k)
        closure = set(f)
        inputs = set(k.inputs)
        member = set(k.members)
        size = k.domain.rows * k.domain.cols
        for nid in k.members:
            n = g[nid]
            if f[nid] <= 2 or is_free(n) or n.numel * 8 <= size:
                continue   # (a per-row or per-sample value: computed once a row, or cached)
            base = max((f[r] for r in _nearest_members(g, nid, readers)), default=1.0)
            extra_evals = f[nid] - base
            if extra_evals < 2:
                continue
            ops = _operations(g, nid, closure, inputs)
            extra = extra_evals * ops
            if extra > budget and window_readers(g, nid, users) & member:
                out[nid] = (f"read through index maps (pooling windows) that would evaluate it {f[nid]:.0f} times "
                            f"an element at {ops} operations each: written once and read instead "
                            f"({extra:.0f} operations an element over the budget of {budget:g}, "
                            "knob window_recompute_ops)")
    return out


def _nearest_members(g: ir.Graph, nid: int, readers: dict[int, list[int]]) -> set[int]:
    """The kernel's non-free nodes that read `nid`, looking through free nodes."""
    out: set[int] = set()
    stack, seen = list(readers.get(nid, ())), set()
    while stack:
        u = stack.pop()
        if u in seen:
            continue
        seen.add(u)
        if is_free(g[u]):
            stack.extend(readers.get(u, ()))
        else:
            out.add(u)
    return out


def window_readers(g: ir.Graph, nid: int, users: dict[int, list[int]] | None = None) -> set[int]:
    """Non-free nodes that read `nid` through at least one view or concatenation (at
    other positions), looking through free nodes."""
    users = users if users is not None else g.users()
    out: set[int] = set()
    stack = [(u, False) for u in users.get(nid, ())]
    seen: set[tuple[int, bool]] = set()
    while stack:
        u, shifted = stack.pop()
        if (u, shifted) in seen:
            continue
        seen.add((u, shifted))
        n = g[u]
        if is_free(n):
            stack.extend((w, shifted or _is_map(n)) for w in users.get(u, ()))
        elif shifted:
            out.add(u)
    return out
