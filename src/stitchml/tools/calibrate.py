"""`stitchml calibrate`: measure this GPU's copy bandwidth and kernel launch cost and
store them for the cost model (plan/devices.py reads them back).

Copy bandwidth: a device-to-device copy of a buffer far larger than L2, counting bytes
read plus written, median of many CUDA-event-timed runs.  Launch cost: the median time
per launch of an empty Triton kernel, launched back to back.
"""
from __future__ import annotations

import statistics
from dataclasses import replace

import torch

from ..plan.devices import DEVICES, Device, current_device, save_calibration


def _events_median(fn, reps: int) -> float:
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


def measure_bandwidth(nbytes: int = 2 * 2**30, reps: int = 20) -> float:
    src = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda").uniform_()
    dst = torch.empty_like(src)
    seconds = _events_median(lambda: dst.copy_(src), reps)
    return 2 * nbytes / seconds


def measure_launch(reps: int = 200) -> float:
    import triton
    import triton.language as tl

    @triton.jit
    def _empty(x):
        pass

    buf = torch.empty(1, device="cuda")
    per_batch = 50

    def batch():
        for _ in range(per_batch):
            _empty[(1,)](buf)

    return _events_median(batch, max(reps // per_batch, 5)) / per_batch


def calibrate() -> Device | None:
    if not torch.cuda.is_available():
        return None
    base = current_device()
    dev = replace(base, bandwidth=measure_bandwidth(), launch_s=measure_launch(), source="calibrated")
    save_calibration(dev)
    return dev


def main() -> int:
    dev = calibrate()
    if dev is None:
        known = ", ".join(DEVICES)
        print(f"no CUDA GPU: nothing to calibrate; the cost model keeps its table values ({known})")
        return 0
    print(f"{dev.name}: copy bandwidth {dev.bandwidth / 1e12:.2f} TB/s, launch {dev.launch_s * 1e6:.2f} us "
          f"(stored; used by the cost model from now on)")
    return 0
