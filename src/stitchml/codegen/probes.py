"""The planner's dry runs of code generation, each run once per kernel content.

Before it settles a kernel the planner asks the code generator about it: which global
reads and stores the kernel would make, at which offsets (`plan/access.py`: transposed
reads, row runs, the dims its accesses are contiguous along; `access.generates`: whether
its index spaces line up at all), and whether a planned kernel generates
(`planner._invalid_kernels`).  Each answer is a full run of the emitters' index
analysis.  Planning a 12-layer BERT training step asked 392 such questions about ~220
distinct kernels, of which 22 were distinct up to node ids: layer 1's kernels again in
layers 2-12 (2-core CPU: 1.2 of the step's 2.4 s of planning).

So each answer is kept under the kernel's canonical text (`codegen/canonical.py`, the
key the kernel-source cache trusts with the generated code itself) and the current code
knobs, with the nodes it names numbered by their place in the kernel's closure, and
handed to the next kernel of the same content renumbered to its own nodes.  Memory
only: nothing here outlives the process, and a changed code generator is a new process.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..ir import index as ix
from ..ir.nodes import Graph
from . import triton_kernel
from .canonical import canonical_kernel, code_knobs

if TYPE_CHECKING:
    from ..plan.data import KernelPlan

Offsets = list[tuple[int, ix.Expr]]

MEMO_MAX = 20_000   # answers kept at most (then forgotten all at once: a bound, not an LRU)
# a kept answer: (loads, stores) with nodes as closure positions, or the refusal's message
_MEMO: dict[tuple, tuple[tuple, tuple] | str] = {}
STATS = {"asked": 0, "analysed": 0}


def access_offsets(g: Graph, k: KernelPlan) -> tuple[Offsets, Offsets]:
    """`triton_kernel.access_offsets(g, k)`, analysed once per kernel content: the
    global reads and element stores `k` would make as (node, offset in the domain's
    variables).  Raises `ix.IndexMismatch` where its index spaces do not line up."""
    STATS["asked"] += 1
    text, nodes = canonical_kernel(g, k)
    key = (text, code_knobs())
    answer = _MEMO.get(key)
    if answer is None:
        STATS["analysed"] += 1
        try:
            loads, stores = triton_kernel.access_offsets(g, k)
        except ix.IndexMismatch as e:
            _keep(key, str(e))
            raise
        place = {nid: i for i, nid in enumerate(nodes)}
        if not all(nid in place for nid, _ in loads + stores):
            return loads, stores   # (an access outside the closure: not renumberable, not kept)
        _keep(key, (tuple((place[n], off) for n, off in loads), tuple((place[n], off) for n, off in stores)))
        return loads, stores
    if isinstance(answer, str):
        raise ix.IndexMismatch(answer)
    loads, stores = answer
    # (offsets are in the domain's variables and the kernel's own value names: no node ids)
    return [(nodes[i], off) for i, off in loads], [(nodes[i], off) for i, off in stores]


def load_offsets(g: Graph, k: KernelPlan) -> Offsets:
    """The global reads of `access_offsets`."""
    return access_offsets(g, k)[0]


def index_mismatch(g: Graph, k: KernelPlan) -> bool:
    """Whether `k`'s index spaces fail to line up (the emitters raise `IndexMismatch`
    for it); any other exception is a bug and propagates."""
    try:
        access_offsets(g, k)
    except ix.IndexMismatch:
        return True
    return False


def _keep(key: tuple, answer: tuple[tuple, tuple] | str) -> None:
    if len(_MEMO) >= MEMO_MAX:
        _MEMO.clear()
    _MEMO[key] = answer


def forget() -> None:
    """Drop every kept answer (tests that change the emitters' behaviour in-process)."""
    _MEMO.clear()
