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
    extra: dict[str, Any] = field(default_factory=dict)   # more figures of the same measurement

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
                "samples_s": self.samples_s, **self.extra}


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
    """Capture `step` into a CUDA graph (warmed up on a side stream, as capture requires).
    The capture runs on that same side stream: a backward-only step re-runs its forward
    on the stream it is called from (autograd runs backward ops on their forward's
    stream), once during warm-up, so the captured call is the backward alone."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        step()
    torch.cuda.synchronize()
    return graph.replay


def time_gpu(step: Callable[[], Any], device: torch.device, reps: int, *, allow_graph: bool,
             graph: str = "auto") -> Timing:
    """`graph`: "auto" (replay from a CUDA graph only steps under 10 µs, when
    `allow_graph`), "always" (forward+backward micro rows: every contender's step is
    replayed from a graph, so autograd's host work is not timed; the plain-event median
    is kept in the notes; a failed capture falls back to plain events and says so), or
    "never" (model rows: host overhead is part of what is measured)."""
    if graph == "always":
        return _time_gpu_graphed(step, device, reps)
    if graph == "never":
        allow_graph = False
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


def _time_gpu_graphed(step: Callable[[], Any], device: torch.device, reps: int) -> Timing:
    flush = L2Flusher(device)
    for _ in range(3):
        step()
    plain = _event_samples(step, flush, 10)
    notes = [f"plain CUDA events (host overhead included): median {statistics.median(plain) * 1e6:.1f} µs"]
    try:
        replay = _graph_of(step)
    except Exception as e:  # capture is best effort: the plain events stand, and say so
        torch.cuda.synchronize()
        notes.append(f"CUDA graph capture failed ({type(e).__name__}: {str(e)[:160]}); timed with plain events "
                     "(host overhead included; see device time)")
        timing = time_gpu(step, device, reps, allow_graph=False)
        timing.notes = notes + timing.notes
        timing.extra["graph_capture_failed"] = True
        return timing
    est = statistics.median(_event_samples(replay, flush, 5))
    n = reps
    if est * reps > GPU_BUDGET_S:
        n = max(10, int(GPU_BUDGET_S / max(est, 1e-9)))
        notes.append(f"reps cut from {reps} to {n} to stay within ~{GPU_BUDGET_S:.0f} s")
    samples = _event_samples(replay, flush, n)
    del replay
    # back on this stream once, untimed, AFTER the replays (a backward-only step re-runs its
    # forward here and drops the one the graph reads): what runs next (memory, profiler) is plain
    step()
    torch.cuda.synchronize()
    return Timing(samples, "cuda-graph replay (every contender), cuda-events, L2 flushed", True, notes,
                  {"plain_events_median_s": statistics.median(plain)})


# --------------------------------------------------------------------------- device (kernel) time, host time

@dataclass
class DeviceProfile:
    """Per step: the sum of the durations of the device activities the profiler saw
    (kernels, memsets, copies), and how many of each.  busy = kernel time: it excludes
    the gaps in which the GPU waits for the host.  `by_name`: per activity name, the
    median over the profiled steps of its summed duration, and its launches per step
    (what the bench matches against stitchml's per-kernel predictions)."""

    samples_s: list[float]
    kernels: int
    activities: int
    method: str = "torch.profiler (CUDA activity), sum of device-activity durations per step"
    by_name: dict[str, tuple[float, int]] = field(default_factory=dict)

    @property
    def median_s(self) -> float:
        return statistics.median(self.samples_s) if self.samples_s else float("nan")

    def to_json(self) -> dict[str, Any]:
        t = Timing(self.samples_s, self.method, True)
        return {"method": self.method, "median_s": t.median_s, "iqr_s": t.iqr_s, "n": len(self.samples_s),
                "samples_s": self.samples_s, "kernels_per_step": self.kernels,
                "activities_per_step": self.activities,
                "per_kernel": {n: {"median_s": s, "launches": k} for n, (s, k) in sorted(self.by_name.items())}}


def summarise_device_events(events: Any) -> tuple[float, int, int]:
    """(seconds, kernels, activities) over the device events of one profiled step.
    `events` are profiler FunctionEvents; the device ones have device_type CUDA and a
    time_range on the GPU clock.  Memsets and copies count as activities, not kernels."""
    cuda = torch.autograd.DeviceType.CUDA
    total_us, kernels, acts = 0.0, 0, 0
    for evt in events:
        if getattr(evt, "device_type", None) != cuda:
            continue
        acts += 1
        name = str(getattr(evt, "name", "") or getattr(evt, "key", ""))
        if not name.lower().startswith(("memcpy", "memset")):
            kernels += 1
        tr = getattr(evt, "time_range", None)
        total_us += tr.elapsed_us() if tr is not None else 0.0
    return total_us * 1e-6, kernels, acts


def device_time_by_name(events: Any) -> dict[str, tuple[float, int]]:
    """{activity name: (seconds, launches)} over the device events of one profiled step."""
    cuda = torch.autograd.DeviceType.CUDA
    out: dict[str, tuple[float, int]] = {}
    for evt in events:
        if getattr(evt, "device_type", None) != cuda:
            continue
        name = str(getattr(evt, "name", "") or getattr(evt, "key", ""))
        tr = getattr(evt, "time_range", None)
        s, n = out.get(name, (0.0, 0))
        out[name] = (s + (tr.elapsed_us() * 1e-6 if tr is not None else 0.0), n + 1)
    return out


def median_by_name(steps: list[dict[str, tuple[float, int]]]) -> dict[str, tuple[float, int]]:
    """Per name, the median over steps of its seconds (0 in a step it is absent from)
    and its largest launch count in one step."""
    names = {n for st in steps for n in st}
    return {n: (statistics.median(st.get(n, (0.0, 0))[0] for st in steps), max(st.get(n, (0.0, 0))[1] for st in steps))
            for n in names}


def profile_device(step: Callable[[], Any], device: torch.device, reps: int = 5) -> DeviceProfile | None:
    """Kernel time per step from torch.profiler: each rep is profiled on its own (the
    L2 flush runs before the profiler starts, so it is not counted).  None on the CPU
    or when the profiler gives nothing."""
    if device.type != "cuda":
        return None
    try:
        from torch.profiler import ProfilerActivity, profile
        flush = L2Flusher(device)
        samples, kernels, acts, named = [], 0, 0, []
        for _ in range(reps):
            flush()
            torch.cuda.synchronize(device)
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                step()
                torch.cuda.synchronize(device)
            events = prof.events()
            s, kernels, acts = summarise_device_events(events)
            if acts == 0:
                return None
            samples.append(s)
            named.append(device_time_by_name(events))
        return DeviceProfile(samples, kernels, acts, by_name=median_by_name(named))
    except Exception:   # the profiler is a measurement aid: its failure must not fail a row
        return None


def time_host_per_step(step: Callable[[], Any], device: torch.device, reps: int) -> Timing:
    """Host time per step: the device is idle when each call starts (synchronised), and
    the clock stops when the call returns, before synchronising: what the Python thread
    spends issuing the step (a step that syncs inside, or fills the launch queue, is
    counted up to that wait).  Also the thread's CPU time, in the notes."""
    samples, cpu = [], []
    for _ in range(reps):
        sync(device)
        t0, c0 = time.perf_counter(), time.thread_time()
        step()
        samples.append(time.perf_counter() - t0)
        cpu.append(time.thread_time() - c0)
        sync(device)
    meaningful = device.type == "cuda"
    return Timing(samples, "host perf_counter from a synchronised start to the call's return (no sync)",
                  meaningful, [], {"thread_cpu_median_s": statistics.median(cpu)})


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
