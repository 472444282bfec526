"""Launch fusion built from finished kernel bodies.

- horizontal (HFuse): independent kernels in one launch; program ids [0, g0) run
  body 0, [g0, g0 + g1) run body 1, and so on.
- global (AStitch's global scheme): dependent kernels as phases of one persistent
  launch.  Every program walks each phase's virtual program ids with a grid stride;
  a grid barrier separates phases.  The grid must not exceed the programs resident in
  one wave, or programs spinning at the barrier starve those not yet scheduled.
  The phase-split twin is simply the member kernels launched one by one.
"""
from __future__ import annotations

import re

from .triton_kernel import KernelSource

BARRIER = '''
@triton.jit
def _grid_barrier(counter, target):
    # every program adds 1; all wait until the count reaches `target`.  The counter
    # only grows: the host passes a new base per launch, so no reset is needed.
    tl.debug_barrier()
    tl.atomic_add(counter, 1, sem="release", scope="gpu")
    seen = tl.atomic_add(counter, 0, sem="acquire", scope="gpu")
    while seen < target:
        seen = tl.atomic_add(counter, 0, sem="acquire", scope="gpu")
    tl.debug_barrier()
'''

_ASSIGN = re.compile(r"^\s*(\w+)\s*=")
_LOOP = re.compile(r"^\s*for (\w+) in")


def _renamed(ks: KernelSource, prefix: str, pid: str) -> tuple[list[str], list[str]]:
    names = set(ks.param_names)
    for line in ks.body:
        for pat in (_ASSIGN, _LOOP):
            m = pat.match(line)
            if m:
                names.add(m.group(1))
    pattern = re.compile(r"\b(" + "|".join(sorted(map(re.escape, names), key=len, reverse=True)) + r")\b")

    def sub(text: str) -> str:
        return pattern.sub(lambda m: prefix + m.group(1), text).replace("tl.program_id(0)", pid)

    return [sub(line) for line in ks.body], [prefix + p for p in ks.param_names]


def horizontal(name: str, members: list[KernelSource]) -> KernelSource:
    body = ["pid = tl.program_id(0)"]
    params: list = []
    names: list[str] = []
    start = 0
    for i, ks in enumerate(members):
        lines, pnames = _renamed(ks, f"h{i}_", f"(pid - {start})")
        cond = f"pid < {start + ks.grid}"
        body.append(("if " if i == 0 else "elif ") + cond + ":")
        body.extend("    " + x for x in lines)
        params += ks.params
        names += pnames
        start += ks.grid
    return KernelSource(name, params, names, body, start, max(k.num_warps for k in members), {})


def persistent(name: str, phases: list[KernelSource], grid: int) -> KernelSource:
    body = ["pid = tl.program_id(0)"]
    params: list = []
    names: list[str] = []
    for i, ks in enumerate(phases):
        lines, pnames = _renamed(ks, f"g{i}_", f"g{i}_vpid")
        body.append(f"for g{i}_vpid in range(pid, {ks.grid}, {grid}):")
        body.extend("    " + x for x in lines)
        if i + 1 < len(phases):
            body.append(f"_grid_barrier(counter, base + {(i + 1) * grid})")
        params += ks.params
        names += pnames
    params += [("counter", -1), ("base", -1)]
    names += ["counter", "base"]
    return KernelSource(name, params, names, body, grid, max(k.num_warps for k in phases), {})
