"""Code generation: plan kernels → Triton source (one op→expression table,
`triton_ops.py`; kernel bodies, `triton_kernel.py`; launch fusion, `composite.py`)."""
from __future__ import annotations

from ..ir.nodes import Graph
from ..plan.data import Plan
from .composite import horizontal, persistent
from .triton_kernel import KernelSource, generate


def generate_all(g: Graph, plan: Plan, device_kind: str = "cuda") -> dict[str, KernelSource]:
    """Every kernel of the plan (through the content-addressed cache), plus one
    composite kernel per launch group."""
    from ..runtime.kernel_cache import cached_kernel, kernel_key
    out = {k.name: cached_kernel(kernel_key(g, k, device_kind), lambda k=k: generate(g, k)) for k in plan.kernels}
    for grp in plan.groups:
        members = [out[m] for m in grp.members]
        out[grp.name] = (persistent(grp.name, members, grp.grid) if grp.kind == "global"
                         else horizontal(grp.name, members))
    return out
