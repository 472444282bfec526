"""`stitchml calibrate`: measure on this GPU what the cost model needs and store it
per device (plan/devices.py: one file per device name and torch/Triton versions under
the cache dir), so that the model's figures are measured, not typed in.

Measured (CUDA events, median of many runs, buffers far larger than L2):
- copy bandwidth per access pattern (contiguous, transposed read, broadcast read,
  row gather) and dtype (fp32, bf16), bytes read + written per second;
- launch cost: time per launch of an empty Triton kernel launched back to back;
- grid-barrier cost: a persistent grid (the size the global scheme uses) passing
  through 1 and through 33 barriers, the difference over 32;
- atomics: an atomic add against a plain store of the same scattered elements, the
  difference per element;
- per-form efficiency: stitchml's own kernels of each form (pointwise, row_persistent,
  packed_rows, row_looped, combine) timed against their modelled bytes at the copy
  bandwidth, and the global scheme against its separate-launch twin on two patterns.

Nothing here runs without a CUDA GPU: `calibrate()` returns None and the table stands.
"""
from __future__ import annotations

import statistics
from dataclasses import replace
from typing import Any, Callable

import torch

from .. import config
from ..plan.devices import DEVICES, Device, current_device, describe_source, save_calibration

BIG = 1 << 30          # bytes per buffer in copy measurements (L2 is 50-60 MB)


def _events_median(fn: Callable[[], Any], reps: int) -> float:
    start = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    end = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    for s, e in zip(start, end):
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(start, end)) / 1e3


# --------------------------------------------------------------------------- copies

def measure_copy(pattern: str, dtype: torch.dtype, nbytes: int = BIG, reps: int = 20) -> float:
    """Bytes moved (read + written) per second for one access pattern."""
    item = torch.tensor([], dtype=dtype).element_size()
    n = nbytes // item
    side = int(n ** 0.5) // 64 * 64
    if pattern == "contiguous":
        src = torch.empty(n, dtype=dtype, device="cuda").uniform_()
        dst = torch.empty_like(src)
        moved, fn = 2 * n * item, lambda: dst.copy_(src)
    elif pattern == "transpose":        # strided read, contiguous write
        src = torch.empty(side, side, dtype=dtype, device="cuda").uniform_()
        dst = torch.empty_like(src)
        moved, fn = 2 * side * side * item, lambda: dst.copy_(src.t())
    elif pattern == "broadcast":        # one row read, every row written
        row = torch.empty(1, side, dtype=dtype, device="cuda").uniform_()
        dst = torch.empty(side, side, dtype=dtype, device="cuda")
        moved, fn = side * side * item + side * item, lambda: dst.copy_(row.expand(side, side))
    elif pattern == "gather":           # rows picked by index (embedding lookups)
        table = torch.empty(side, side, dtype=dtype, device="cuda").uniform_()
        idx = torch.randint(0, side, (side,), device="cuda")
        moved, fn = 2 * side * side * item, lambda: torch.index_select(table, 0, idx)
    else:
        raise ValueError(f"unknown access pattern {pattern!r}")
    return moved / _events_median(fn, reps)


PATTERNS = ("contiguous", "transpose", "broadcast", "gather")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


# --------------------------------------------------------------------------- launches, barriers, atomics

def measure_launch(reps: int = 200) -> float:
    import triton

    @triton.jit
    def _empty(x):
        pass

    buf = torch.empty(1, device="cuda")
    per_batch = 50

    def batch():
        for _ in range(per_batch):
            _empty[(1,)](buf)

    return _events_median(batch, max(reps // per_batch, 5)) / per_batch


def measure_barrier(grid: int, reps: int = 20) -> float:
    """Seconds per grid barrier with `grid` resident programs (the global scheme's
    barrier: release-add then acquire-spin on a counter that only grows)."""
    import triton
    import triton.language as tl

    @triton.jit
    def _barriers(counter, base, grid, N: tl.constexpr):
        for i in tl.static_range(N):
            tl.debug_barrier()
            tl.atomic_add(counter, 1, sem="release", scope="gpu")
            target = base + (i + 1) * grid
            seen = tl.atomic_add(counter, 0, sem="acquire", scope="gpu")
            while seen < target:
                seen = tl.atomic_add(counter, 0, sem="acquire", scope="gpu")
            tl.debug_barrier()

    def timed(n: int) -> float:
        counter = torch.zeros(1, dtype=torch.int64, device="cuda")
        state = {"base": 0}

        def run():
            _barriers[(grid,)](counter, state["base"], grid, N=n, num_warps=4)
            state["base"] += n * grid
        return _events_median(run, reps)

    return max((timed(33) - timed(1)) / 32, 0.0)


def measure_atomics(n: int = 1 << 24, targets: int = 1 << 16, reps: int = 20) -> float:
    """Extra seconds per element of an atomic add over a plain scattered store."""
    import triton
    import triton.language as tl

    @triton.jit
    def _scatter(dst, src, idx, n, BLOCK: tl.constexpr, ATOMIC: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        v = tl.load(src + offs, mask=m)
        i = tl.load(idx + offs, mask=m)
        if ATOMIC:
            tl.atomic_add(dst + i, v, mask=m)
        else:
            tl.store(dst + i, v, mask=m)

    src = torch.randn(n, device="cuda")
    idx = torch.randint(0, targets, (n,), device="cuda", dtype=torch.int32)
    dst = torch.zeros(targets, device="cuda")
    grid = (triton.cdiv(n, 1024),)
    t_atomic = _events_median(lambda: _scatter[grid](dst, src, idx, n, BLOCK=1024, ATOMIC=True), reps)
    t_store = _events_median(lambda: _scatter[grid](dst, src, idx, n, BLOCK=1024, ATOMIC=False), reps)
    return max((t_atomic - t_store) / n, 0.0)


# --------------------------------------------------------------------------- stitchml's own kernels

def _form_cases() -> dict[str, tuple[Callable, Callable[[], list]]]:
    import torch.nn.functional as F
    cuda = "cuda"
    return {
        "pointwise": (lambda x: torch.sigmoid(x * 2.0 + 1.0), lambda: [torch.randn(8192, 4096, device=cuda)]),
        "row_persistent": (lambda x: torch.softmax(x, -1), lambda: [torch.randn(8192, 4096, device=cuda)]),
        "packed_rows": (lambda x, w, b: F.layer_norm(x, (1024,), w, b),
                        lambda: [torch.randn(32768, 1024, device=cuda), torch.randn(1024, device=cuda),
                                 torch.randn(1024, device=cuda)]),
        "row_looped": (lambda x: torch.softmax(x, -1), lambda: [torch.randn(2048, 32768, device=cuda)]),
        "combine": (lambda x: x.sum(0), lambda: [torch.randn(32768, 1024, device=cuda)]),
    }


def _global_cases() -> dict[str, tuple[Callable, Callable[[], list]]]:
    import torch.nn.functional as F

    def ln_bwd(x, w, b, g):
        y = F.layer_norm(x, (x.shape[-1],), w, b)
        return torch.autograd.grad(y, (x, w, b), g)

    def gelu_colsum(x):
        return F.gelu(x).sum(0)
    cuda = "cuda"
    return {
        "layer_norm_bwd": (ln_bwd, lambda: [torch.randn(16384, 1024, device=cuda, requires_grad=True),
                                            torch.randn(1024, device=cuda, requires_grad=True),
                                            torch.randn(1024, device=cuda, requires_grad=True),
                                            torch.randn(16384, 1024, device=cuda)]),
        "gelu_colsum": (gelu_colsum, lambda: [torch.randn(16384, 4096, device=cuda)]),
    }


def _run_stitched(fn: Callable, inputs: list, reps: int = 20, **knobs: Any):
    """(median seconds per call, plans of the compiled graphs)."""
    from ..capture.backend import StitchBackend
    torch._dynamo.reset()
    backend = StitchBackend()
    with config.override(**knobs):
        compiled = torch.compile(fn, backend=backend)
        seconds = _events_median(lambda: compiled(*inputs), reps)
    return seconds, [r.plan for r in backend.records if r.plan is not None]


def measure_forms(dev: Device) -> dict[str, dict[str, float]]:
    """Per form: modelled memory seconds at copy bandwidth against the measured time
    (less the launches); efficiency = modelled / measured, in (0.05, 1]."""
    out: dict[str, dict[str, float]] = {}
    known: dict[str, float] = {}
    for form, (fn, make) in _form_cases().items():
        seconds, plans = _run_stitched(fn, make(), global_barriers=False, horizontal_fusion=False)
        kernels = [k for p in plans for k in p.kernels]
        mem = {k.name: (k.bytes_read + k.bytes_written) / dev.bandwidth for k in kernels}
        # time left for this form's kernels once the others are priced with what is known
        others = sum(mem[k.name] / known.get(k.mapping.form, 1.0) for k in kernels if k.mapping.form != form)
        mine = sum(mem[k.name] for k in kernels if k.mapping.form == form)
        left = seconds - len(kernels) * dev.launch_s - others
        eff = min(max(mine / left, 0.05), 1.0) if left > 0 and mine > 0 else 1.0
        known[form] = eff
        out[form] = {"measured_s": seconds, "modelled_mem_s": mine, "efficiency": eff, "kernels": len(kernels)}
    return out


def measure_global(dev: Device) -> dict[str, dict[str, float]]:
    """The global scheme against its separate-launch twin: the efficiency that makes
    the model's global-group time equal the measured one."""
    out = {}
    for name, (fn, make) in _global_cases().items():
        inputs = make()
        t_sep, plans = _run_stitched(fn, inputs, global_barriers=False, horizontal_fusion=False)
        t_glob, _ = _run_stitched(fn, inputs, global_barriers=True, horizontal_fusion=False)
        n = sum(len(p.kernels) for p in plans)
        mem_sep = max(t_sep - n * dev.launch_s, 1e-9)
        denom = t_glob - dev.launch_s - (n - 1) * dev.barrier_s
        eff = min(max(mem_sep / denom, 0.05), 1.0) if denom > 0 else 0.05
        out[name] = {"separate_s": t_sep, "global_s": t_glob, "kernels": n, "efficiency": eff}
    return out


def calibrate() -> Device | None:
    """Measure everything on the visible GPU, store it, return the calibrated device;
    None without a CUDA GPU."""
    if not torch.cuda.is_available():
        return None
    from ..plan.launches import wave_capacity
    base = DEVICES[current_device().name]   # table entry: a new calibration starts from it
    copies = {p: {d: measure_copy(p, t) for d, t in DTYPES.items()} for p in PATTERNS}
    dev = replace(base, bandwidth=copies["contiguous"]["fp32"], launch_s=measure_launch(), source="calibrated")
    dev = replace(dev, barrier_s=measure_barrier(wave_capacity(dev, 4)), atomic_s=measure_atomics())
    forms = measure_forms(dev)
    glob = measure_global(dev)
    eff = {f: v["efficiency"] for f, v in forms.items()}
    eff["global"] = min(v["efficiency"] for v in glob.values())   # the worse pattern decides
    dev = replace(dev, form_efficiency=tuple(sorted(eff.items())))
    measurements = {"gpu": torch.cuda.get_device_name(), "copy_bandwidth": copies, "launch_s": dev.launch_s,
                    "barrier_s": dev.barrier_s, "atomic_s": dev.atomic_s, "forms": forms, "global_scheme": glob}
    path = save_calibration(dev, measurements)
    return replace(dev, calibration_file=str(path))


def main() -> int:
    dev = calibrate()
    if dev is None:
        known = ", ".join(DEVICES)
        print(f"no CUDA GPU: nothing to calibrate; the cost model keeps its table values ({known})")
        return 0
    print(f"{dev.name}: copy bandwidth {dev.bandwidth / 1e12:.2f} TB/s, launch {dev.launch_s * 1e6:.2f} us, "
          f"grid barrier {dev.barrier_s * 1e6:.2f} us, atomic add {dev.atomic_s * 1e12:.2f} ps/element")
    print("form efficiency: " + ", ".join(f"{f} {e:.2f}" for f, e in dev.form_efficiency))
    print(f"stored: {describe_source(dev)}; the cost model uses these figures from now on")
    return 0
