"""What a result was measured on: GPU or CPU model, driver, library versions, the
date, and the device-to-device copy bandwidth measured at the start of the run
(the ceiling every case's achieved GB/s is compared with, DESIGN §6)."""
from __future__ import annotations

import datetime as _dt
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import torch


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def _stitchml_version() -> str:
    # from the package itself: on the GPU machines it runs from source (PYTHONPATH=src), not installed
    from .. import __version__
    return __version__


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _nvidia_smi(query: str) -> str:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return "unknown (no nvidia-smi)"
    try:
        out = subprocess.run([exe, f"--query-gpu={query}", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _git_commit() -> str:
    # read-only: which source tree produced these numbers
    try:
        here = Path(__file__).resolve().parent
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=10)
        if out.returncode == 0:
            return out.stdout.strip() + (" (modified)" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown"


def measure_copy_bandwidth(device: torch.device, quick: bool) -> dict[str, Any]:
    """Device-to-device copy of a large tensor; bandwidth counts bytes read + written
    (the convention of plan/devices.py, whose H100/H200 figures were measured this way)."""
    if device.type == "cuda":
        nbytes = 2**30 if not quick else 2**28
        src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).uniform_()
        dst = torch.empty_like(src)
        for _ in range(3):
            dst.copy_(src)
        samples = []
        for _ in range(10 if quick else 30):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            dst.copy_(src)
            e.record()
            torch.cuda.synchronize()
            samples.append(s.elapsed_time(e) * 1e-3)
        method = "cuda-events, tensor.copy_, median of reps"
    else:
        nbytes = 2**24 if quick else 2**28
        src = torch.rand(nbytes // 4)
        dst = torch.empty_like(src)
        dst.copy_(src)
        samples = []
        for _ in range(5 if quick else 20):
            t0 = time.perf_counter()
            dst.copy_(src)
            samples.append(time.perf_counter() - t0)
        method = "time.perf_counter, tensor.copy_ on the CPU, median of reps"
    med = statistics.median(samples)
    return {"bytes_per_s": 2 * nbytes / med, "tensor_bytes": nbytes, "method": method,
            "counts": "bytes read + bytes written", "samples_s": samples}


def capture(device: torch.device, quick: bool, interpreted: bool) -> dict[str, Any]:
    from ..plan.devices import current_device
    env: dict[str, Any] = {
        "date_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "triton": _version("triton"),
        "jax": _version("jax"),
        "jaxlib": _version("jaxlib"),
        "transformers": _version("transformers"),
        "stitchml": _stitchml_version(),
        "git_commit": _git_commit(),
        "device": device.type,
        "triton_interpret": os.environ.get("TRITON_INTERPRET", ""),
        "interpreted": interpreted,
        "timings_meaningful": device.type == "cuda" and not interpreted,
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update({
            "gpu": torch.cuda.get_device_name(device),
            "gpu_count": torch.cuda.device_count(),
            "driver": _nvidia_smi("driver_version"),
            "compute_capability": f"{props.major}.{props.minor}",
            "sms": props.multi_processor_count,
            "gpu_memory_bytes": props.total_memory,
            "l2_bytes": getattr(props, "L2_cache_size", None),
        })
    else:
        env.update({"gpu": None, "driver": None})
    dev = current_device()
    env["stitchml_cost_model_device"] = {"name": dev.name, "bandwidth": dev.bandwidth, "source": dev.source}
    env["copy_bandwidth"] = measure_copy_bandwidth(device, quick)
    return env


def device_tag(device: torch.device) -> str:
    """A short name for result directories: h100, h200, a100, ... or cpu."""
    if device.type != "cuda":
        return "cpu"
    name = torch.cuda.get_device_name(device).lower()
    for tag in ("h200", "h100", "a100", "l40", "a10", "v100"):
        if tag in name:
            return tag
    return "".join(c for c in name.split()[-1] if c.isalnum()) or "gpu"
