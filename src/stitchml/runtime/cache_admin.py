"""`stitchml cache info|clear`: what stitchml keeps on disk under `cache_dir`.

| folder | what | key |
|---|---|---|
| `plans/` | planned + generated graphs (`plan_cache.py`) | lowered graph, knobs, device, versions, stitchml source |
| `generated/` | kernel sources (`kernel_cache.py`) | kernel content with node ids renumbered, code generator |
| `kernels/` | kernel modules Triton imports | the kernel text |
| `calibration/` | `stitchml calibrate` measurements | device name, torch and Triton versions |

Compiled binaries live in Triton's own cache (keyed by kernel source, target GPU,
compile options and Triton's version), which `precompile.py` fills in parallel; the
ATen graphs AOTAutograd made, in torch's AOTAutograd cache (`capture/aot_cache.py`:
shared with Inductor, so `clear` leaves it; stitch's entries are keyed by its source
and knobs, so an edited stitchml or a changed knob never reads them).
"""
from __future__ import annotations

import shutil

from .kernel_cache import cache_root

FOLDERS = {"plans": "planned graphs", "generated": "kernel sources", "kernels": "kernel modules",
           "calibration": "device calibrations"}


def info() -> str:
    root = cache_root()
    lines = [f"stitchml cache at {root}"]
    for name, what in FOLDERS.items():
        d = root / name
        files = [p for p in d.rglob("*") if p.is_file()] if d.exists() else []
        size = sum(p.stat().st_size for p in files)
        lines.append(f"  {name + '/':13} {what:22} {len(files)} entries, {size / 1e6:.2f} MB")
    try:
        import triton
        lines.append(f"  compiled binaries: Triton's cache ({triton.knobs.cache.dir})")
    except Exception:  # an older Triton without knobs
        lines.append("  compiled binaries: Triton's cache (TRITON_CACHE_DIR, default ~/.triton/cache)")
    try:
        from torch._inductor.runtime.cache_dir_utils import cache_dir
        lines.append(f"  AOTAutograd results: torch's cache ({cache_dir()}/aotautograd, shared with Inductor; "
                     "knob aot_cache)")
    except Exception:  # pragma: no cover (a torch without it has no bundled cache either)
        pass
    return "\n".join(lines)


CLEARED = ("plans", "generated", "kernels")   # calibrations are measurements, not a cache: kept


def clear() -> str:
    """Remove stitchml's cached plans, sources and modules (not calibrations, and not
    Triton's cache, which other programs share)."""
    root = cache_root()
    removed = 0
    for name in CLEARED:
        d = root / name
        if d.exists():
            removed += sum(1 for p in d.rglob("*") if p.is_file())
            shutil.rmtree(d, ignore_errors=True)
    from . import kernel_cache, plan_cache
    kernel_cache.drop_memory()
    plan_cache.drop_memory()
    return f"removed {removed} files under {root}"


__all__ = ["clear", "info"]
