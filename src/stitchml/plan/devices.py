"""Device table for the cost model, and the calibrations that override it.

Bandwidths are measured device-to-device copy rates (bytes read + written), not
datasheet peaks: H100 ~3.0 TB/s and H200 ~4.3 TB/s were measured on this project's
lent machines (DESIGN §7); A100 is the commonly reported ~1.6 TB/s copy rate.
Launch and barrier costs are estimates until `stitchml calibrate` measures them
(AStitch measured a barrier-only kernel at ~2.5–2.7 µs on a V100).

A calibration is one JSON file per (device name, torch version, triton version) under
`<cache_dir>/calibration/`: a measurement taken with another torch or Triton (whose
launch path and code generation differ) is not used.  The file holds every figure
`stitchml calibrate` measured; the cost model reads the ones it uses (copy bandwidth,
launch, barrier, atomics, per-form efficiency) and says it is `calibrated`.
"""
from __future__ import annotations

import functools
import json
import re
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import config

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Device:
    name: str
    bandwidth: float        # bytes/s, measured copy (read + write)
    sms: int                # streaming multiprocessors (cores for the CPU entry)
    launch_s: float         # per-kernel launch + ramp cost
    barrier_s: float        # one grid-wide barrier
    regs_per_sm: int = 65536
    smem_per_sm: int = 228 * 1024
    max_warps_per_sm: int = 64
    l2_bytes: int = 50 * 2**20
    source: str = "table"   # table | calibrated
    atomic_s: float = 0.0   # extra time per element of an atomic add (0 = not modelled)
    # measured efficiency of each kernel form relative to a plain copy (1.0 = copy speed);
    # a tuple of (form, factor) pairs so the Device stays hashable
    form_efficiency: tuple[tuple[str, float], ...] = ()
    calibration_file: str = ""  # where the calibrated figures came from
    # per-kernel cost inside a replayed CUDA graph: no host launch path, only the GPU's
    # gap between dependent kernels (table value ~1.5 us on Hopper until calibrated)
    graph_launch_s: float = 1.5e-6
    # a DRAM load's latency as a program that waits for its loads sees it: the step time of
    # a walk over row blocks (`cost.walk_latency`).  Fitted on the H200 (2026-11-30,
    # bench/NOTES.md forty-eighth session): four column-partial kernels of 16-block walks
    # gave 0.65-0.83 us a block beyond their bytes over bandwidth
    mem_latency_s: float = 0.75e-6
    # what each column block of a row-looped kernel on a capped grid (one round of at most
    # two programs an SM) adds beyond its bytes: the program issues a block's loads, waits,
    # computes, then issues the next (`cost.loop_latency`).  Fitted on the H200 (2026-11-30,
    # bench/NOTES.md fiftieth session): three [1, 8192]-block looped rows of 32768 bf16
    # values, 32-64 blocks a program, gave 0.22-0.25 us a block beyond their bytes over
    # bandwidth (less than a walk's full latency: the other program's loads and the same
    # program's stores overlap the wait); `stitchml calibrate` measures it
    # (`tools/calibrate.py::measure_loop_wait`)
    loop_wait_s: float = 0.23e-6
    # priced as a replayed CUDA graph (`replayed`): a global launch's barrier counter is then
    # zeroed by a memset node before it (a replay repeats the host's base of 0), one more
    # node on the stream, priced like a launch
    replay: bool = False
    # SM clock under load (boost), for the SASS issue budget of `tools/aot_check`
    clock_hz: float = 1.98e9
    # library ops (`plan/library_cost.py`): dense matrix-product rates by operand type
    # (datasheet; float32 runs on CUDA cores unless TF32 is allowed), the fraction of it
    # a large aligned cuBLAS product sustains, and that of the align-1/2 kernels an
    # unaligned leading dimension gets; fused attention's rate (flash/cuDNN, head dim 64)
    # and fixed cost per wave of 128-query tiles (forward, backward); convolutions and
    # our Triton GEMM relative to a cuBLAS product; a K step's latency (64 deep: what a
    # product too small to fill the SMs waits on) and a tile's prologue and epilogue.
    # Hopper figures fitted to the H200's profiler tables (bench/NOTES.md, twentieth
    # session; attention refitted in the twenty-ninth to 2026-11-28's table with the
    # calls' real key counts: the causal masks were tensors, every key tile computed);
    # the convolution and Triton-GEMM factors are guesses, never measured
    matmul_flops: tuple[tuple[str, float], ...] = (("bf16", 989e12), ("fp16", 989e12), ("tf32", 495e12),
                                                   ("fp32", 67e12), ("fp64", 67e12))
    gemm_efficiency: float = 0.80
    gemm_step_s: float = 0.33e-6
    gemm_tile_s: float = 0.4e-6
    misaligned_gemm_efficiency: float = 0.13
    attention_flops: float = 306e12
    attention_tile_s: float = 5.3e-6
    attention_bwd_tile_s: float = 13.9e-6
    conv_efficiency: float = 0.6
    triton_gemm_efficiency: float = 0.7
    # whether `triton_gemm_efficiency` was measured (`stitchml calibrate` times our GEMM
    # template against cuBLAS) or is the table's guess: the GEMM-epilogue choice
    # (`patterns/gemm_epilogue.py`, knob `gemm_epilogue=auto`) fuses only on a measured one
    triton_gemm_source: str = "table"
    # the template's fastest tile configuration measured there (`gemm_op.TileConfig.name`;
    # "" = the template's default)
    triton_gemm_config: str = ""

    def matmul_rate(self, dtype: torch.dtype | None) -> float:
        """Dense matrix-product flops/s for operands of `dtype` (datasheet)."""
        import torch
        key = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float64: "fp64"}.get(dtype, "fp32")
        if key == "fp32" and torch.get_float32_matmul_precision() != "highest":
            key = "tf32"
        rates = dict(self.matmul_flops)
        return rates.get(key, rates.get("fp32", 1e12))

    def efficiency(self, form: str) -> float:
        for f, e in self.form_efficiency:
            if f == form:
                return max(min(e, 1.0), 0.05)
        return 1.0

    @property
    def warp_issue_rate(self) -> float:
        """Warp-instructions a second at the full issue rate: four schedulers an SM issue
        one a cycle each."""
        return self.sms * 4 * self.clock_hz

    @property
    def issue_budget(self) -> float:
        """Instructions a thread can issue per byte the device copies (`warp_issue_rate`
        x 32 lanes against the copy bandwidth).  A streaming kernel whose hot loop issues
        more per byte than this cannot reach the bandwidth."""
        return self.warp_issue_rate * 32 / self.bandwidth

    def replayed(self) -> "Device":
        """This device as a graph replayed in a CUDA graph sees it: each kernel costs the
        graph's launch gap instead of the host launch path.  The planner prices launches
        this way for graphs it plans for capture, so a grid barrier or a horizontal launch
        is chosen only where it saves what a replay really pays per launch."""
        return replace(self, launch_s=self.graph_launch_s, replay=True)


DEVICES: dict[str, Device] = {
    "H100": Device("H100", 3.0e12, 132, 3.0e-6, 2.0e-6, l2_bytes=50 * 2**20),
    "H200": Device("H200", 4.3e12, 132, 3.0e-6, 2.0e-6, l2_bytes=60 * 2**20),
    # A100: the Hopper fit scaled by the datasheet tensor-core rate (312 against 989 TFLOP/s)
    "A100": Device("A100", 1.6e12, 108, 3.5e-6, 2.5e-6, smem_per_sm=164 * 1024, l2_bytes=40 * 2**20,
                   clock_hz=1.41e9, matmul_flops=(("bf16", 312e12), ("fp16", 312e12), ("tf32", 156e12),
                                                  ("fp32", 19.5e12), ("fp64", 19.5e12)),
                   attention_flops=96e12),
    "cpu": Device("cpu", 2.0e10, 2, 5.0e-6, 1.0e-6, regs_per_sm=2**20, smem_per_sm=2**20, max_warps_per_sm=1,
                  l2_bytes=32 * 2**20, matmul_flops=(("bf16", 2e10), ("fp16", 2e10), ("tf32", 1e11),
                                                     ("fp32", 1e11), ("fp64", 5e10)),
                  attention_flops=5e10, attention_tile_s=1e-6, attention_bwd_tile_s=2e-6),
}


class UnknownDevice(ValueError):
    """A device name the table lacks (raised with the names it has)."""


def table_device(name: str) -> Device:
    """The table entry for `name` (case-insensitive), or UnknownDevice."""
    for k, d in DEVICES.items():
        if k.lower() == str(name).strip().lower():
            return d
    raise UnknownDevice(f"unknown device {name!r}: the device table has {', '.join(DEVICES)}")


def _versions() -> tuple[str, str]:
    try:
        import torch
        tv = torch.__version__.split("+")[0]
    except Exception:  # pragma: no cover
        tv = "none"
    try:
        import triton
        rv = triton.__version__
    except Exception:  # pragma: no cover
        rv = "none"
    return tv, rv


def calibration_path(name: str, versions: tuple[str, str] | None = None) -> Path:
    """`<cache_dir>/calibration/<device>-torch<v>-triton<v>.json`."""
    tv, rv = versions or _versions()
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{name}-torch{tv}-triton{rv}")
    return Path(config.get("cache_dir")) / "calibration" / f"{safe}.json"


_cache: dict[tuple, Device] = {}


def load_calibration(base: Device, versions: tuple[str, str] | None = None) -> Device:
    """`base` with the figures of its calibration file applied (source='calibrated'),
    or `base` unchanged when there is none or it is unreadable (the table stands)."""
    path = calibration_path(base.name, versions)
    try:
        stamp = path.stat().st_mtime_ns
    except OSError:
        return base
    key = (base, str(path), stamp)
    if key in _cache:
        return _cache[key]
    try:
        data = json.loads(path.read_text())
        if data.get("name") != base.name:
            raise ValueError("calibration of another device")
        eff = tuple(sorted((str(f), float(e)) for f, e in (data.get("form_efficiency") or {}).items()))
        dev = replace(base, bandwidth=float(data["bandwidth"]), launch_s=float(data["launch_s"]),
                      barrier_s=float(data.get("barrier_s", base.barrier_s)),
                      atomic_s=float(data.get("atomic_s", base.atomic_s)), form_efficiency=eff,
                      graph_launch_s=float(data.get("graph_launch_s", base.graph_launch_s)),
                      mem_latency_s=float(data.get("mem_latency_s", base.mem_latency_s)),
                      loop_wait_s=float(data.get("loop_wait_s", base.loop_wait_s)),
                      source="calibrated", calibration_file=str(path))
        # our Triton GEMM against cuBLAS, where this calibration measured it (a file's
        # top-level `triton_gemm_efficiency` is only the table value it was written with)
        tg = (data.get("measurements") or {}).get("triton_gemm") or {}
        if "efficiency" in tg:
            dev = replace(dev, triton_gemm_efficiency=float(tg["efficiency"]), triton_gemm_source="calibrated",
                          triton_gemm_config=str(tg.get("best", "")))
    except (ValueError, KeyError, TypeError, OSError):
        dev = base  # a broken calibration file is ignored; the table stands
    _cache[key] = dev
    return dev


def get_device(name: str | None = None) -> Device:
    """The named device (calibrated if a calibration exists); None = `current_device()`."""
    if not name:
        return current_device()
    return load_calibration(table_device(name))


def current_device() -> Device:
    """The device the cost model predicts for: the `device` knob, else the visible
    GPU's name matched against the table, else the CPU entry; calibrated values
    (from `stitchml calibrate`) override the table's.  An unknown `device` knob is an
    error (UnknownDevice), not a silent guess."""
    return load_calibration(table_device(config.get("device") or _visible_device()))


@functools.lru_cache(maxsize=None)
def _visible_device() -> str:
    """The table entry of the visible GPU (looked up once a process: launches of the
    fused ops ask for their device's calibration at every call), else "cpu"."""
    try:
        import torch
        if torch.cuda.is_available():
            gpu = torch.cuda.get_device_name()
            return next((k for k in DEVICES if k in gpu), "H100")
    except Exception:
        pass
    return "cpu"


def save_calibration(dev: Device, measurements: dict[str, Any] | None = None,
                     versions: tuple[str, str] | None = None) -> Path:
    """Write `dev`'s figures plus everything measured (`measurements`) to its
    calibration file, atomically."""
    path = calibration_path(dev.name, versions)
    path.parent.mkdir(parents=True, exist_ok=True)
    tv, rv = versions or _versions()
    data = asdict(dev)
    data["form_efficiency"] = dict(dev.form_efficiency)
    data.update(source="calibrated", torch=tv, triton=rv, measurements=measurements or {})
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str))
    tmp.replace(path)
    return path


def describe_source(dev: Device) -> str:
    """One line for reports: where the device's figures come from."""
    if dev.source == "calibrated":
        gemm = (f"our GEMM template {dev.triton_gemm_efficiency:.2f} of cuBLAS ({dev.triton_gemm_config})"
                if dev.triton_gemm_source == "calibrated" else "our GEMM template not measured")
        return f"calibrated ({dev.calibration_file}; {gemm})"
    return "table values (not calibrated: run `stitchml calibrate` on the GPU)"


__all__ = ["Device", "DEVICES", "UnknownDevice", "table_device", "get_device", "current_device",
           "calibration_path", "load_calibration", "save_calibration", "describe_source"]
