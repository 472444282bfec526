"""Code generation: plan kernels → Triton source (one op→expression table,
`triton_ops.py`; kernel bodies, `triton_kernel.py`; launch fusion, `composite.py`)."""
from __future__ import annotations

from ..ir.nodes import Graph
from ..plan.data import Plan
from .composite import horizontal, persistent
from .triton_kernel import KernelSource, generate


def generate_all(g: Graph, plan: Plan) -> dict[str, KernelSource]:
    """Every kernel of the plan, plus one composite kernel per launch group."""
    out = {k.name: generate(g, k) for k in plan.kernels}
    for grp in plan.groups:
        members = [out[m] for m in grp.members]
        out[grp.name] = (persistent(grp.name, members, grp.grid) if grp.kind == "global"
                         else horizontal(grp.name, members))
    return out
