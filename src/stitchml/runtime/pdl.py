"""Programmatic dependent launch (PDL): the next kernel's launch overlaps this one's tail.

Between two kernels of a stream a GPU drains the first grid, then launches the second
and runs its programs' start-up: on an H200 every stitched kernel of a replayed CUDA
graph cost its bytes plus ~1.5 µs (bench/NOTES.md, thirty-ninth session), so a step of
400 small kernels (ResNet-50 training) spends a quarter of its time between kernels.
Hopper's grid-dependency control lets a kernel launched with the PDL attribute start
while the previous one is still running: its programs wait (`griddepcontrol.wait`)
until that grid has finished and its writes are visible, and the previous kernel says
when the next may start launching (`griddepcontrol.launch_dependents`).

Here (knob `pdl`): every stitched kernel's first statements are `_gdc_wait()` — before
any global memory access, the seeds a replayed graph reads from memory included — and
`_gdc_launch_dependents()` (codegen/triton_fast.py); its launch line passes
`launch_pdl=True` (runtime/steps.py `Launch.pdl`).  Correctness rests on the wait alone:
where the kernel before is not ours (a cuBLAS product, an eager op) it never signals,
and the launch happens at its end as without PDL.  Grid-barrier kernels keep their plain
launch (their grid is sized to be resident at once).  Torch's static launcher takes no
launch attributes, so PDL kernels go through Triton's launcher (a few µs more host work
a launch: a gain only where the host is not the bottleneck, i.e. in CUDA graphs).
"""
from __future__ import annotations

import dataclasses

import torch

from .. import config
from ..codegen.kernel_source import KernelSource

_FIRST = ["_gdc_wait()", "_gdc_launch_dependents()"]


def pdl_wanted(device: torch.device) -> bool:
    """Whether kernels for `device` are launched with PDL (knob `pdl`)."""
    mode = str(config.get("pdl")).lower()
    if mode not in ("off", "auto", "on"):
        raise ValueError(f"STITCHML_PDL={mode!r}: expected off, auto or on")
    if mode == "on":
        return True
    if mode == "off" or device.type != "cuda" or not torch.cuda.is_available():
        return False
    return torch.cuda.get_device_capability(device) >= (9, 0)


def takes_pdl(ks: KernelSource) -> bool:
    """Whether kernel `ks` may be launched with PDL: not a grid-barrier kernel."""
    return not any(kind == "counter" for kind, _ in ks.params)


def launched_with_pdl(kernel: KernelSource | str) -> bool:
    """Whether a kernel (its source, or its text: a dynamic template's) is a
    `pdl_source`, whose launch passes `launch_pdl`: the kernel decides, so the wrapper,
    the compile pool and the launch agree."""
    if isinstance(kernel, str):
        body = kernel.split("):\n", 1)[1] if "):\n" in kernel else ""
        return body.lstrip(" ").startswith(_FIRST[0] + "\n")
    return list(kernel.body[:len(_FIRST)]) == _FIRST


def pdl_source(ks: KernelSource) -> KernelSource:
    """`ks` with the grid-dependency wait and the early launch of dependents first (a
    grid-barrier kernel unchanged)."""
    if not takes_pdl(ks) or launched_with_pdl(ks):
        return ks
    return dataclasses.replace(ks, body=_FIRST + list(ks.body))


def after_wait(body: list[str], lines: list[str]) -> list[str]:
    """`body` with `lines` put first, but after the PDL prologue where there is one (what
    a kernel reads, e.g. its seeds from device memory, must come after the wait)."""
    n = len(_FIRST) if list(body[:len(_FIRST)]) == _FIRST else 0
    return list(body[:n]) + list(lines) + list(body[n:])


def pdl_sources(kernels: dict[str, KernelSource], device: torch.device) -> dict[str, KernelSource]:
    """A graph's kernels as they are launched on `device`: `pdl_source`'s where the knob
    wants PDL there, else unchanged."""
    if not pdl_wanted(device):
        return kernels
    return {name: pdl_source(ks) for name, ks in kernels.items()}


__all__ = ["after_wait", "launched_with_pdl", "pdl_source", "pdl_sources", "pdl_wanted", "takes_pdl"]
