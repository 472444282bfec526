"""Device table for the cost model.

Bandwidths are measured device-to-device copy rates (bytes read + written), not
datasheet peaks: H100 ~3.0 TB/s and H200 ~4.3 TB/s were measured on this project's
lent machines (DESIGN §7); A100 is the commonly reported ~1.6 TB/s copy rate.
Launch and barrier costs are estimates until `stitchml calibrate` measures them
(AStitch measured a barrier-only kernel at ~2.5–2.7 µs on a V100).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from .. import config


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


DEVICES: dict[str, Device] = {
    "H100": Device("H100", 3.0e12, 132, 3.0e-6, 2.0e-6, l2_bytes=50 * 2**20),
    "H200": Device("H200", 4.3e12, 132, 3.0e-6, 2.0e-6, l2_bytes=60 * 2**20),
    "A100": Device("A100", 1.6e12, 108, 3.5e-6, 2.5e-6, smem_per_sm=164 * 1024, l2_bytes=40 * 2**20),
    "cpu": Device("cpu", 2.0e10, 2, 5.0e-6, 1.0e-6, regs_per_sm=2**20, smem_per_sm=2**20, max_warps_per_sm=1,
                  l2_bytes=32 * 2**20),
}


def calibration_path() -> Path:
    return Path(config.get("cache_dir")) / "calibration.json"


def current_device() -> Device:
    """The device the cost model predicts for: the `device` knob, else the visible
    GPU's name matched against the table, else the CPU entry; calibrated values
    (from `stitchml calibrate`) override the table's."""
    name = config.get("device")
    if not name:
        name = "cpu"
        try:
            import torch
            if torch.cuda.is_available():
                gpu = torch.cuda.get_device_name()
                name = next((k for k in DEVICES if k in gpu), "H100")
        except Exception:
            pass
    dev = DEVICES.get(name, DEVICES["H100"])
    path = calibration_path()
    if path.exists():
        try:
            data = json.loads(path.read_text())
            if data.get("name") == dev.name:
                dev = replace(dev, bandwidth=float(data["bandwidth"]), launch_s=float(data["launch_s"]),
                              source="calibrated")
        except (ValueError, KeyError, OSError):
            pass  # a broken calibration file is ignored; the table stands
    return dev


def save_calibration(dev: Device) -> Path:
    path = calibration_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(asdict(dev), indent=2))
    return path
