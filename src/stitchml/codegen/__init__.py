"""Code generation: plan kernels → Triton source (one op→expression table,
`triton_ops.py`; kernel bodies, `triton_kernel.py`; launch fusion, `composite.py`).

Pure: nothing here reads or writes a cache.  The pipeline (`stitchml/pipeline.py`)
passes a caching `kernel_source` from above."""
from __future__ import annotations

from typing import Callable

from ..ir.nodes import Graph
from ..plan.data import KernelPlan, Plan
from .composite import horizontal, persistent
from .kernel_source import KernelSource
from .triton_kernel import generate

KernelSourceFn = Callable[[Graph, KernelPlan], KernelSource]


def generate_all(g: Graph, plan: Plan, kernel_source: KernelSourceFn = generate) -> dict[str, KernelSource]:
    """Every kernel of the plan (by `kernel_source`, the plain generator unless the
    caller caches), plus one composite kernel per launch group."""
    out = {k.name: kernel_source(g, k) for k in plan.kernels}
    for grp in plan.groups:
        members = [out[m] for m in grp.members]
        out[grp.name] = (persistent(grp.name, members, grp.grid) if grp.kind == "global"
                         else horizontal(grp.name, members))
    return out
