"""Timing and memory measurement (DESIGN §6).

GPU: CUDA events around each call after warm-up, the L2 cache flushed before every
rep by zeroing a buffer larger than L2 (so each rep reads its inputs from DRAM, as a
large model would), median and IQR of many reps.  Calls shorter than 10 µs are
replayed from a CUDA graph, so what is timed is the kernels and not the Python and
launch overhead in front of them (tried only for forward steps; capture failures fall
back to plain events and say so).  The JAX contender is timed on the host around
`block_until_ready` (`time_host`).

CPU: `time.perf_counter` around each call.  Without a GPU the Triton kernels run in the
Triton interpreter, one program at a time in numpy, so these numbers say nothing about
performance: results are flagged `meaningful: false`.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

CUDA_GRAPH_BELOW_S = 10e-6    # steps faster than this are timed from a CUDA graph replay
GRAPH_PROBE_BELOW_S = 50e-6   # steps whose plain-event time is below this are tried as a graph
FLUSH_BYTES_MIN = 256 * 2**20
GPU_BUDGET_S = 10.0     # rough wall-clock cap for one (case, contender) timing loop
CPU_BUDGET_S = 20.0      # per (case, contender) on a CPU; --quick uses QUICK_CPU_BUDGET_S
QUICK_CPU_BUDGET_S = 2.0


@dataclass
class Timing:
    samples_s: list[float]
    method: str
    meaningful: bool
    notes: list[str] = field(default_factory=list)

    @property
    def median_s(self) -> float:
        return statistics.median(self.samples_s) if self.samples_s else float("nan")

    @property
    def iqr_s(self) -> float:
        if len(self.samples_s) < 2:
            return 0.0
        q = statistics.quantiles(self.samples_s, n=4, method="inclusive")
        return q[2] - q[0]

    def to_json(self) -> dict[str, Any]:
        return {"method": self.method, "meaningful": self.meaningful, "notes": self.notes,
                "median_s": self.median_s, "iqr_s": self.iqr_s, "n": len(self.samples_s),
                "samples_s": self.samples_s}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def wall_call(step: Callable[[], Any], device: torch.device) -> tuple[Any, float]:
    """One call, timed on the host including a device synchronise."""
    sync(device)
    t0 = time.perf_counter()
    out = step()
    sync(device)
    return out, time.perf_counter() - t0


class L2Flusher:
    """Zeroing a buffer larger than L2 evicts the previous rep's data from it."""

    def __init__(self, device: torch.device):
        l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 0
        self.buf = torch.empty(max(FLUSH_BYTES_MIN, 4 * l2), dtype=torch.int8, device=device)

    def __call__(self) -> None:
        self.buf.zero_()


def _event_samples(run: Callable[[], Any], flush: L2Flusher, reps: int) -> list[float]:
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for s, e in zip(starts, ends):
        flush()
        s.record()
        run()
        e.record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) * 1e-3 for s, e in zip(starts, ends)]


def _graph_of(step: Callable[[], Any]) -> Callable[[], Any]:
    """Capture `step` into a CUDA graph (warmed up on a side stream, as capture requires)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph.replay


def time_gpu(step: Callable[[], Any], device: torch.device, reps: int, *, allow_graph: bool) -> Timing:
    flush = L2Flusher(device)
    for _ in range(3):          # warm-up (the compile already happened in the first call)
        step()
    probe = _event_samples(step, flush, 5)
    est = statistics.median(probe)
    notes = []
    n = reps
    if est * reps > GPU_BUDGET_S:
        n = max(10, int(GPU_BUDGET_S / max(est, 1e-9)))
        notes.append(f"reps cut from {reps} to {n} to stay within ~{GPU_BUDGET_S:.0f} s")
    method = "cuda-events, L2 flushed"
    run = step
    # The flush (~0.1 ms of DRAM writes) is queued before each rep, so the host launches the
    # step while the GPU is still flushing and launch latency mostly hides behind it.  A
    # step that may be near or under 10 µs is replayed from a CUDA graph instead, which
    # removes the launch overhead entirely; the graph is kept if its replay is under 10 µs.
    if est < GRAPH_PROBE_BELOW_S:
        if allow_graph:
            try:
                replay = _graph_of(step)
                est_graph = statistics.median(_event_samples(replay, flush, 5))
                if est_graph < CUDA_GRAPH_BELOW_S:
                    run, method = replay, "cuda-graph replay, cuda-events, L2 flushed"
                else:
                    notes.append(f"graph replay {est_graph * 1e6:.1f} µs >= 10 µs: timed without a graph")
            except Exception as e:  # capture is best effort; the plain events stand
                torch.cuda.synchronize()
                notes.append(f"CUDA graph capture failed ({type(e).__name__}: {str(e)[:120]}); plain events "
                             "include launch overhead")
        elif est < CUDA_GRAPH_BELOW_S:
            notes.append("sub-10 µs step not graph-captured (backward steps are not); includes launch overhead")
    return Timing(_event_samples(run, flush, n), method, True, notes)


def time_cpu(step: Callable[[], Any], reps: int, *, interpreted: bool, warm_s: float, budget_s: float) -> Timing:
    """`warm_s` (the warm call already made) is the first sample: under the interpreter
    a call can take seconds, and every call saved shortens a smoke test."""
    # at most `reps`, else about the budget (a single sample when one call exceeds it)
    n = max(1, min(reps, int(budget_s / max(warm_s, 1e-9))))
    notes = [] if n == reps else [f"reps cut from {reps} to {n} to stay within ~{budget_s:.0f} s"]
    samples = [warm_s]
    for _ in range(n - 1):
        t0 = time.perf_counter()
        step()
        samples.append(time.perf_counter() - t0)
    why = ("CPU: Triton kernels run in the interpreter, timings are NOT meaningful" if interpreted
           else "CPU timing")
    return Timing(samples, "time.perf_counter (first sample = the warm call)", False, [why] + notes)


def peak_memory(step: Callable[[], Any], device: torch.device) -> tuple[int | None, str]:
    """Bytes allocated at the peak of one call above what was allocated before it
    (workspace + outputs); None on the CPU, where torch's allocator is invisible."""
    if device.type != "cuda":
        return None, "n/a on CPU (torch's CPU allocations are not visible to tracemalloc)"
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    out = step()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - base
    del out
    return peak, "torch.cuda.max_memory_allocated above the pre-call allocation"


def count_cuda_kernels(step: Callable[[], Any]) -> int | None:
    """Device activities (kernels, memsets, copies) of one call, from the profiler."""
    try:
        from torch.profiler import ProfilerActivity, profile
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            step()
            torch.cuda.synchronize()
        n = 0
        for evt in prof.events():
            if getattr(evt, "device_type", None) == torch.autograd.DeviceType.CUDA:
                n += 1
        return n or None
    except Exception:
        return None


def time_host(step: Callable[[], Any], device: torch.device, reps: int, warm_s: float) -> Timing:
    """Wall clock around a call that blocks until its results are ready (JAX): the L2
    flush is a torch kernel, synchronised before the clock starts."""
    flush = L2Flusher(device) if device.type == "cuda" else None
    budget = GPU_BUDGET_S if device.type == "cuda" else CPU_BUDGET_S
    n = min(reps, max(3, int(budget / max(warm_s, 1e-9))))
    notes = [] if n == reps else [f"reps cut from {reps} to {n} to stay within ~{budget:.0f} s"]
    samples = []
    for _ in range(n):
        if flush is not None:
            flush()
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        step()
        samples.append(time.perf_counter() - t0)
    meaningful = device.type == "cuda"
    method = "host wall clock around block_until_ready" + (", L2 flushed" if flush is not None else "")
    return Timing(samples, method, meaningful, notes)
