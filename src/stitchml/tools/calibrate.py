"""`stitchml calibrate`: measure on this GPU what the cost model needs and store it
per device (plan/devices.py: one file per device name and torch/Triton versions under
the cache dir), so that the model's figures are measured, not typed in.

Measured (CUDA events, median of many runs, buffers far larger than L2):
- copy bandwidth per access pattern (contiguous, transposed read, broadcast read,
  row gather) and dtype (fp32, bf16), bytes read + written per second;
- launch overhead (issue 12): host microseconds per launch of one small stitched
  pointwise kernel through stitchml's `Launcher` exactly as its wrapper launches it,
  of the same kernel through Triton's JIT dispatch, and of Inductor's kernel for the
  same function through the `CachingAutotuner.run` its generated code calls (and
  through the launcher that holds); each compiled function's whole call for context.
  The stitched kernel's time per launch is the cost model's launch cost;
- grid-barrier cost: a persistent grid (the size the global scheme uses) passing
  through 1 and through 33 barriers, the difference over 32;
- atomics: an atomic add against a plain store of the same scattered elements, the
  difference per element;
- the memory latency a walk over row blocks pays a block (`Device.mem_latency_s`,
  `cost.walk_latency`): stitchml's column sum over 1024 bfloat16 columns at two row
  counts, the same grid (so the same combine), without prefetch; the difference in time
  beyond the difference in bytes at the copy bandwidth, over the difference in blocks
  walked (and the same with prefetch, reported);
- what a column block of a row-looped kernel on a capped grid adds beyond its bytes
  (`Device.loop_wait_s`, `cost.loop_latency`): stitchml's RMS norm over 65536 bfloat16
  columns at two row counts, the same persistent grid, without column prefetch, the
  same difference over the difference in blocks loaded;
- per-form efficiency: stitchml's own kernels of each form (pointwise, row_persistent,
  packed_rows, row_looped, combine) timed against their modelled bytes at the copy
  bandwidth, net of the latencies measured above (so they are not counted twice), and the global scheme against its separate-launch twin on two patterns;
- our Triton GEMM template (`patterns/gemm_op.py`, what a GEMM epilogue runs in) on each
  candidate tile configuration against cuBLAS's `addmm` on transformer-sized bf16
  products: the fastest configuration becomes the device's (`Device.triton_gemm_config`)
  and its median ratio `Device.triton_gemm_efficiency`, which the `gemm_epilogue=auto`
  choice needs measured before it fuses anything.

Nothing here runs without a CUDA GPU: `calibrate()` returns None and the table stands.
"""
from __future__ import annotations

import contextlib
import statistics
import sys
import time
from dataclasses import replace
from typing import Any, Callable, Iterator

import torch

from .. import config
from ..plan.cost import memory_seconds
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

# launch overhead: the wrapper's launch through stitchml's Launcher, Triton's JIT, Inductor

LAUNCH_NUMEL = 4096   # one small block of work: the launch, not the kernel, is measured


@contextlib.contextmanager
def recording(cls: type, method: str) -> Iterator[list[tuple[Any, tuple, dict]]]:
    """Every call of `cls.method` during the block, as (instance, args, kwargs)."""
    own = method in vars(cls)
    original = getattr(cls, method)
    seen: list[tuple[Any, tuple, dict]] = []

    def record(self, *args, **kwargs):
        seen.append((self, args, kwargs))
        return original(self, *args, **kwargs)

    setattr(cls, method, record)
    try:
        yield seen
    finally:
        if own:
            setattr(cls, method, original)
        else:
            delattr(cls, method)


def per_launch(launch: Callable[[], Any], sync: Callable[[], Any], launches: int = 2000,
               rounds: int = 5) -> dict[str, Any]:
    """Microseconds per launch of `launch()` called `launches` times back to back:
    `host_us` up to the last call returning (what the host spends issuing it),
    `wall_us` until the device has finished them all; medians over `rounds`."""
    launch()   # first launch: compiles or binds; not timed
    sync()
    host, wall = [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(launches):
            launch()
        t1 = time.perf_counter()
        sync()
        t2 = time.perf_counter()
        host.append((t1 - t0) / launches * 1e6)
        wall.append((t2 - t0) / launches * 1e6)
    return {"host_us": statistics.median(host), "wall_us": statistics.median(wall), "launches": launches,
            "rounds": rounds}


def _stitch_fn(x):
    return x * 2.0 + 1.0


def _inductor_fn(x):   # (the same function, its own code object: one compiled entry per backend)
    return x * 2.0 + 1.0


def stitched_launch(device: torch.device, numel: int = LAUNCH_NUMEL) -> tuple[Any, tuple, tuple, dict, Callable,
                                                                          Callable]:
    """`_stitch_fn` compiled by the stitch backend (no CUDA graphs) and called twice
    (the first launch of a launch line goes through the JIT, the second binds nothing
    new): the launch its wrapper made, as (launcher, grid, args, options), what the
    wrapper calls for that line (its `Site`, or the function the site bound), and the
    whole call."""
    from ..capture.backend import StitchBackend
    from ..runtime.launcher import Launcher
    backend = StitchBackend()
    x = torch.randn(numel, device=device)
    compiled = torch.compile(_stitch_fn, backend=backend)
    with config.override(cuda_graphs=False), torch.no_grad(), recording(Launcher, "jit") as seen:
        compiled(x)
        compiled(x)
    if not seen:
        reasons = "; ".join(r.eager_reason or "no kernel" for r in backend.records) or "nothing compiled"
        raise RuntimeError(f"the stitched function launched no kernel ({reasons})")
    launcher, (grid, args, options), _ = seen[-1]
    sites = [s for s in launcher.sites.values() if s.grid == grid]
    if len(sites) != 1:
        raise RuntimeError(f"{len(sites)} launch lines of the stitched kernel at grid {grid} (expected one)")
    line = sites[0].fast or sites[0]
    return launcher, grid, args, options, line, lambda: compiled(x)


def inductor_launch(device: torch.device, numel: int = LAUNCH_NUMEL) -> tuple[Any, tuple, dict, Callable]:
    """`_inductor_fn` compiled by Inductor and called once: the kernel launch its
    generated code made, as (CachingAutotuner, args, kwargs), and the call."""
    if device.type != "cuda":
        raise RuntimeError(f"Inductor generates C++ for {device.type} tensors: no Triton launcher to time")
    from torch._inductor.runtime.triton_heuristics import CachingAutotuner
    x = torch.randn(numel, device=device)
    compiled = torch.compile(_inductor_fn, backend="inductor")
    with torch.no_grad(), recording(CachingAutotuner, "run") as seen:
        compiled(x)
    if not seen:
        raise RuntimeError("Inductor's code launched no kernel through CachingAutotuner.run")
    tuner, args, kwargs = seen[-1]
    return tuner, args, kwargs, lambda: compiled(x)


def _guarded(out: dict, name: str, measure: Callable[[], dict]) -> None:
    try:
        out[name] = measure()
    except Exception as e:   # a missing or changed piece is reported, never fatal
        out[name] = {"unavailable": f"{type(e).__name__}: {str(e)[:300]}"}


def measure_launch_overheads(device: str | torch.device = "cuda", launches: int = 2000,
                             rounds: int = 5) -> dict[str, dict[str, Any]]:
    """Launch overhead of one small pointwise kernel, per way of launching it:
    `stitch_launcher` (the wrapper's launch line: the `Site` it calls, or the function
    the site bound; `static`: through torch's static CUDA launcher), `stitch_triton_entry`
    (the same line bound with the knob `static_launch` off: Triton's compiled entry
    point), `stitch_by_grid` (stitchml's Launcher indexed by grid, the path of
    launches whose grid is a size expression), `triton_jit`
    (the same kernel through `JITFunction.run`), `inductor_run` (Inductor's kernel for
    the same function through `CachingAutotuner.run`, what its generated code calls),
    `inductor_launcher` (the launcher that run ends in), and each backend's whole
    compiled call (`stitch_call`, `inductor_call`: guards, allocation, launch).  Each is
    `per_launch`'s figures, or {"unavailable": reason}."""
    device = torch.device(device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    out: dict[str, dict[str, Any]] = {}
    torch._dynamo.reset()
    try:
        launcher, grid, args, options, line, call = stitched_launch(device)
    except Exception as e:
        why = {"unavailable": f"{type(e).__name__}: {str(e)[:300]}"}
        out.update(stitch_launcher=why, stitch_by_grid=why, triton_jit=why, stitch_call=why)
    else:
        from ..runtime.launcher import Site

        def through_the_line():
            r = per_launch(lambda: line(*args), sync, launches, rounds)
            return {**r, "direct": not isinstance(line, Site), "grid": list(grid), "options": options,
                    "static": bool(getattr(line, "__globals__", {}).get("SRUN"))}
        _guarded(out, "stitch_launcher", through_the_line)

        def through_tritons_entry():
            from ..runtime.launcher import Launcher
            checks = (line if isinstance(line, Site) else line.site).checks
            with config.override(static_launch=False):
                ns: dict = {}
                ns["_L"] = Launcher(launcher.fn).site(ns, "_L", grid, checks, **options)
                ns["_L"](*args)       # binds
            bound = ns["_L"]
            return {**per_launch(lambda: bound(*args), sync, launches, rounds), "direct": not isinstance(bound, Site)}
        _guarded(out, "stitch_triton_entry", through_tritons_entry)

        def by_grid():
            r = per_launch(lambda: launcher[grid](*args, **options), sync, launches, rounds)
            return {**r, "direct": bool(launcher.bound)}
        _guarded(out, "stitch_by_grid", by_grid)
        _guarded(out, "triton_jit", lambda: per_launch(lambda: launcher.fn[grid](*args, **options), sync,
                                                       launches, rounds))
        with torch.no_grad():
            _guarded(out, "stitch_call", lambda: per_launch(call, sync, launches, rounds))
    try:
        tuner, targs, tkwargs, icall = inductor_launch(device)
    except Exception as e:
        why = {"unavailable": f"{type(e).__name__}: {str(e)[:300]}"}
        out.update(inductor_run=why, inductor_launcher=why, inductor_call=why)
    else:
        _guarded(out, "inductor_run", lambda: {**per_launch(lambda: tuner.run(*targs, **tkwargs), sync, launches,
                                                            rounds), "kernel": type(tuner).__name__})

        def through_its_launcher():
            found = list(getattr(tuner, "launchers", None) or [])
            if len(found) != 1:
                raise RuntimeError(f"{len(found)} launchers after the first run (expected one)")
            fn = found[0]
            kind = getattr(fn, "__qualname__", type(fn).__name__)
            return {**per_launch(lambda: fn(*targs, **tkwargs), sync, launches, rounds), "kernel": kind}
        _guarded(out, "inductor_launcher", through_its_launcher)
        with torch.no_grad():
            _guarded(out, "inductor_call", lambda: per_launch(icall, sync, launches, rounds))
    return out


LAUNCH_LABELS = (("stitch_launcher", "stitched kernel, the wrapper's launch line (stitchml Launcher site)"),
                 ("stitch_triton_entry", "same line, Triton's compiled entry point (knob static_launch off)"),
                 ("stitch_by_grid", "same kernel, stitchml Launcher by grid (size-expression grids)"),
                 ("triton_jit", "same kernel, Triton JIT dispatch"),
                 ("inductor_run", "Inductor's kernel, CachingAutotuner.run (its generated code's launch)"),
                 ("inductor_launcher", "Inductor's kernel, the launcher run ends in"),
                 ("stitch_call", "stitch-compiled function, whole call"),
                 ("inductor_call", "Inductor-compiled function, whole call"))


def describe_launch_overheads(res: dict[str, dict[str, Any]]) -> list[str]:
    lines = ["launch overhead, microseconds per launch (host: issuing it; wall: until the device finished):"]
    for key, label in LAUNCH_LABELS:
        r = res.get(key, {"unavailable": "not measured"})
        if "unavailable" in r:
            lines.append(f"  {label}: unavailable: {r['unavailable']}")
            continue
        extra = "" if "direct" not in r else (" (direct path bound)" if r["direct"] else
                                              " (direct path NOT bound: this is the JIT path)")
        if r.get("static"):
            extra += " (torch's static launcher)"
        lines.append(f"  {label}: {r['host_us']:.2f} host, {r['wall_us']:.2f} wall{extra}")
    return lines


def measure_launch(reps: int = 200) -> float:
    """Seconds per launch of an empty Triton kernel launched back to back through the
    JIT (CUDA events): the launch cost when the stitched measurement is unavailable."""
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


def measure_graph_launch(launches: int = 200, reps: int = 20, pdl: bool = False) -> float:
    """Seconds per kernel inside a replayed CUDA graph: `launches` launches of an empty
    kernel captured once on one stream (each waits for the one before), the replay timed
    with CUDA events.  What the planner charges per launch for graphs it plans for
    capture (`Device.replayed`): the GPU's gap between kernels, no host launch path.
    `pdl`: each kernel launched with programmatic dependent launch, waiting on the one
    before and letting the next launch at once (runtime/pdl.py): the gap PDL leaves."""
    import triton

    from ..codegen.triton_fast import _gdc_launch_dependents, _gdc_wait

    @triton.jit
    def _empty(x):
        pass

    @triton.jit
    def _empty_pdl(x):
        _gdc_wait()
        _gdc_launch_dependents()

    buf = torch.zeros(1, device="cuda")

    def chain():
        for _ in range(launches):
            if pdl:
                _empty_pdl[(1,)](buf, launch_pdl=True)
            else:
                _empty[(1,)](buf)

    from ..bench.timing import _graph_of   # (warmed up on a side stream, captured there: the bench's own)
    return _events_median(_graph_of(chain), reps) / launches


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

def walk_latency_from(t: tuple[float, float], mem: tuple[float, float], walks: tuple[int, int]) -> float:
    """Seconds a walked block costs beyond its bytes, from two runs of one kernel that
    differ only in how many blocks its programs walk: (t1 - t0 - (mem1 - mem0)) / (w1 - w0),
    never below 0."""
    if walks[1] <= walks[0]:
        raise ValueError(f"the second run must walk more blocks: {walks}")
    return max((t[1] - t[0] - (mem[1] - mem[0])) / (walks[1] - walks[0]), 0.0)


WALK_ROWS = (16384, 131072)   # rows of the column sums timed by `measure_walk_latency`


def measure_walk_latency(dev: Device, reps: int = 20) -> dict[str, Any]:
    """The memory latency a program walking row blocks pays a block (no prefetch: the
    cost model's `mem_latency_s`), and what is left of it with the next block's loads
    issued first."""
    out: dict[str, Any] = {"rows": list(WALK_ROWS), "cols": 1024, "dtype": "bf16"}
    for prefetch in (False, True):
        runs = []
        for rows in WALK_ROWS:
            x = torch.randn(rows, 1024, device="cuda", dtype=torch.bfloat16)
            seconds, plans = _run_stitched(lambda x: x.sum(0), [x], reps, prefetch_rows=prefetch,
                                           global_barriers=False, horizontal_fusion=False)
            walked = [k for p in plans for k in p.kernels if k.walks_rows]
            if len(walked) != 1:
                raise RuntimeError(f"expected one kernel walking row blocks, the plan has {len(walked)}")
            k = walked[0]
            runs.append((seconds, (k.bytes_read + k.bytes_written) / dev.bandwidth, k.mapping.row_blocks,
                         k.mapping.grid))
            del x
        if runs[0][3] != runs[1][3]:
            raise RuntimeError(f"the two column sums run different grids ({runs[0][3]}, {runs[1][3]})")
        lat = walk_latency_from((runs[0][0], runs[1][0]), (runs[0][1], runs[1][1]), (runs[0][2], runs[1][2]))
        out["prefetch" if prefetch else "plain"] = {"seconds": [r[0] for r in runs], "mem_s": [r[1] for r in runs],
                                                    "walk": [r[2] for r in runs], "grid": runs[0][3],
                                                    "latency_s": lat}
    out["mem_latency_s"] = out["plain"]["latency_s"]
    return out


# rows of the RMS norms over 65536 bfloat16 columns timed by `measure_loop_wait`: both
# row-looped on a persistent grid of one program an SM (H100/H200), walking 8 and 16
# rows of two passes of 8 column blocks of 8192
LOOP_ROWS = (1024, 2048)
LOOP_COLS = 65536


def _rms_norm(x):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype)


def measure_loop_wait(dev: Device, reps: int = 20, device: str = "cuda") -> dict[str, Any]:
    """What a column block of a row-looped kernel on a capped grid adds beyond its bytes
    (`Device.loop_wait_s`, `cost.loop_latency`): stitchml's RMS norm over 65536 bfloat16
    columns at two row counts, the same grid, without column prefetch; the difference in
    time beyond the difference in modelled memory time, over the difference in blocks
    loaded one after another (`KernelPlan.loop_waits`)."""
    out: dict[str, Any] = {"rows": list(LOOP_ROWS), "cols": LOOP_COLS, "dtype": "bf16"}
    runs = []
    for rows in LOOP_ROWS:
        x = torch.randn(rows, LOOP_COLS, device=device, dtype=torch.bfloat16)
        seconds, plans = _run_stitched(_rms_norm, [x], reps, prefetch_columns=False,
                                       global_barriers=False, horizontal_fusion=False)
        kernels = [k for p in plans for k in p.kernels]
        if len(kernels) != 1 or kernels[0].mapping.form != "row_looped" or not kernels[0].loop_waits:
            raise RuntimeError("expected one row-looped kernel, the plan has "
                               + ", ".join(k.mapping.form for k in kernels))
        k = kernels[0]
        if k.mapping.grid > 2 * dev.sms:
            raise RuntimeError(f"the looped kernel's grid ({k.mapping.grid}) is not capped at two programs an SM")
        runs.append((seconds, memory_seconds(k, replace(dev, form_efficiency=())), k.loop_waits,
                     k.mapping.grid))
        del x
    if runs[0][3] != runs[1][3]:
        raise RuntimeError(f"the two RMS norms run different grids ({runs[0][3]}, {runs[1][3]})")
    out.update(seconds=[r[0] for r in runs], mem_s=[r[1] for r in runs], waits=[r[2] for r in runs],
               grid=runs[0][3])
    out["loop_wait_s"] = walk_latency_from((runs[0][0], runs[1][0]), (runs[0][1], runs[1][1]),
                                           (runs[0][2], runs[1][2]))
    return out


def _form_cases(cuda: str = "cuda") -> dict[str, tuple[Callable, Callable[[], list]]]:
    import torch.nn.functional as F
    return {
        "pointwise": (lambda x: torch.sigmoid(x * 2.0 + 1.0), lambda: [torch.randn(8192, 4096, device=cuda)]),
        "row_persistent": (lambda x: torch.softmax(x, -1), lambda: [torch.randn(8192, 4096, device=cuda)]),
        # (rows of 1024 went to row_persistent when programs became one row wide: 128 columns
        # still pack 32 rows a program on H100/H200 — tests/test_prefetch.py checks each
        # case plans its form)
        "packed_rows": (lambda x, w, b: F.layer_norm(x, (128,), w, b),
                        lambda: [torch.randn(262144, 128, device=cuda), torch.randn(128, device=cuda),
                                 torch.randn(128, device=cuda)]),
        "row_looped": (lambda x: torch.softmax(x, -1), lambda: [torch.randn(2048, 32768, device=cuda)]),
        "combine": (lambda x: x.sum(0), lambda: [torch.randn(32768, 1024, device=cuda)]),
    }


def _global_cases(cuda: str = "cuda") -> dict[str, tuple[Callable, Callable[[], list]]]:
    import torch.nn.functional as F

    def ln_bwd(x, w, b, g):
        y = F.layer_norm(x, (x.shape[-1],), w, b)
        return torch.autograd.grad(y, (x, w, b), g)

    def gelu_colsum(x):
        return F.gelu(x).sum(0)
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


def form_efficiency_from(seconds: float, kernels: list, form: str, known: dict[str, float], dev: Device) -> float:
    """The efficiency of `form` that makes the cost model's time for `kernels` (one
    launch each) equal the `seconds` measured: the other forms' kernels priced with the
    efficiencies already `known`, and the latencies the model charges beyond bytes
    (walks, combines, looped blocks: `cost.walk_latency`, calibrated before this) taken
    off, so a form's efficiency does not count them a second time.  In (0.05, 1]; 1.0
    where nothing is left to explain."""
    from ..plan.cost import walk_latency
    unit = replace(dev, form_efficiency=())
    known_dev = replace(dev, form_efficiency=tuple(sorted(known.items())))
    mine = waits = others = 0.0
    for k in kernels:
        if k.mapping.form == form:
            m = memory_seconds(k, unit)
            mine += m
            waits += walk_latency(k, m, unit) - m
        else:
            m = memory_seconds(k, known_dev)
            others += walk_latency(k, m, known_dev)
    left = seconds - len(kernels) * dev.launch_s - others - waits
    return min(max(mine / left, 0.05), 1.0) if left > 0 and mine > 0 else 1.0


def measure_forms(dev: Device, device: str = "cuda") -> dict[str, dict[str, float]]:
    """Per form: the cost model's memory time at copy bandwidth against the measured time
    (`form_efficiency_from`); efficiency = modelled / measured, in (0.05, 1].  Timed
    without prefetch: a prefetched kernel's time is the longer of its bytes and its
    latencies (`cost.walk_latency`), from which no bytes rate can be read."""
    out: dict[str, dict[str, float]] = {}
    known: dict[str, float] = {}
    for form, (fn, make) in _form_cases(device).items():
        seconds, plans = _run_stitched(fn, make(), global_barriers=False, horizontal_fusion=False,
                                       prefetch_rows=False, prefetch_columns=False)
        kernels = [k for p in plans for k in p.kernels]
        if not any(k.mapping.form == form for k in kernels):   # the table value stands, said in the file
            out[form] = {"error": f"the case planned no {form} kernel ({', '.join(k.mapping.form for k in kernels)})"}
            continue
        mine = sum((k.bytes_read + k.bytes_written) / dev.bandwidth for k in kernels if k.mapping.form == form)
        eff = form_efficiency_from(seconds, kernels, form, known, dev)
        known[form] = eff
        out[form] = {"measured_s": seconds, "modelled_mem_s": mine, "efficiency": eff, "kernels": len(kernels)}
    return out


def global_efficiency_from(seconds: float, plans: list, dev: Device) -> float | None:
    """The global-scheme efficiency that makes the cost model's time for `plans` (their
    launch groups as `cost.plan_seconds` prices them, the forms at `dev`'s efficiencies)
    equal the `seconds` measured: only the bytes of global groups' members are slowed by
    it (`cost.group_seconds`), their launches, barriers and latencies are not.  In
    (0.05, 1]; None where no plan has a global group (nothing measured)."""
    from ..plan.cost import atomic_seconds, plan_seconds
    one = replace(dev, form_efficiency=tuple((f, e) for f, e in dev.form_efficiency if f != "global"))
    members = {m for p in plans for g in p.groups if g.kind == "global" for m in g.members}
    if not members:
        return None
    slowed = sum(memory_seconds(k, one) + atomic_seconds(k, one) for p in plans for k in p.kernels
                 if k.name in members)
    rest = sum(plan_seconds(p, one) for p in plans) - slowed
    left = seconds - rest
    return min(max(slowed / left, 0.05), 1.0) if left > 0 else 0.05


def measure_global(dev: Device, device: str = "cuda") -> dict[str, dict[str, Any]]:
    """The global scheme on two patterns, timed beside its separate-launch twin: the
    efficiency that makes the model's time of the global plan equal the measured one
    (`global_efficiency_from`; `dev` carries the forms' calibrated efficiencies).  A
    pattern whose plan chose no global group measures nothing: said in its entry."""
    out: dict[str, dict[str, Any]] = {}
    for name, (fn, make) in _global_cases(device).items():
        inputs = make()
        t_sep, _ = _run_stitched(fn, inputs, global_barriers=False, horizontal_fusion=False)
        t_glob, plans = _run_stitched(fn, inputs, global_barriers=True, horizontal_fusion=False)
        n = sum(len(p.kernels) for p in plans)
        eff = global_efficiency_from(t_glob, plans, dev)
        out[name] = {"separate_s": t_sep, "global_s": t_glob, "kernels": n}
        if eff is None:
            out[name]["error"] = "the planner chose no global group for this pattern"
        else:
            out[name]["efficiency"] = eff
    return out


# M x N x K of the products timed for the Triton GEMM figure: a BERT-base FFN's up and
# down projections at 4096 tokens, and a LLaMA-style square projection
GEMM_SHAPES = ((4096, 3072, 768), (4096, 768, 3072), (4096, 4096, 4096))


def measure_triton_gemm(reps: int = 20, dtype: torch.dtype = torch.bfloat16, device: str = "cuda",
                        shapes: tuple = GEMM_SHAPES, timer: Callable[[Callable[[], Any], int], float] | None = None,
                        configs: tuple | None = None) -> dict[str, Any]:
    """Our GEMM template (bias, no activation) on each candidate tile configuration
    (`gemm_op.CONFIGS`) against `torch.addmm` on the same operands: per shape and
    configuration both times and cuBLAS's over ours. `best` is the configuration with
    the highest median ratio over the shapes and `efficiency` that median (what
    `library_cost._price_epilogue` divides cuBLAS's modelled time by).
    `timer(fn, reps)` -> seconds (CUDA events by default)."""
    from ..patterns import gemm_op
    timer = timer or _events_median
    configs = tuple(configs or gemm_op.CONFIGS)
    name = str(dtype).replace("torch.", "")
    rows = []
    for m, n, k in shapes:
        x = torch.randn(m, k, device=device, dtype=dtype)
        w = torch.randn(n, k, device=device, dtype=dtype) / k ** 0.5
        b = torch.randn(n, device=device, dtype=dtype)
        wt = w.t()
        want = torch.addmm(b, x, wt).float()
        t_lib = timer(lambda: torch.addmm(b, x, wt), reps)
        for tile in configs:
            def ours(tile=tile):
                return gemm_op._launch(x, w, b, None, None, "none", dtype, False, tile)
            # (a configuration that computes something else must not be timed as a GEMM)
            torch.testing.assert_close(ours()[0].float(), want, rtol=2e-2, atol=2e-2 * k ** 0.5)
            t_ours = timer(ours, reps)
            rows.append({"config": tile.name, "m": m, "n": n, "k": k, "cublas_s": t_lib, "triton_s": t_ours,
                         "ratio": t_lib / t_ours})
    by_config = {t.name: statistics.median(r["ratio"] for r in rows if r["config"] == t.name) for t in configs}
    best = max(by_config, key=by_config.__getitem__)
    return {"dtype": name, "shapes": rows, "by_config": by_config, "best": best,
            "efficiency": min(max(by_config[best], 0.05), 1.5)}


def calibrate() -> Device | None:
    """Measure everything on the visible GPU, store it, return the calibrated device;
    None without a CUDA GPU."""
    if not torch.cuda.is_available():
        return None
    from ..plan.launches import wave_capacity
    base = DEVICES[current_device().name]   # table entry: a new calibration starts from it
    copies = {p: {d: measure_copy(p, t) for d, t in DTYPES.items()} for p in PATTERNS}
    overheads = measure_launch_overheads("cuda")
    ours = overheads["stitch_launcher"]
    launch_s = ours["wall_us"] * 1e-6 if "wall_us" in ours else measure_launch()
    dev = replace(base, bandwidth=copies["contiguous"]["fp32"], launch_s=launch_s, source="calibrated")
    dev = replace(dev, barrier_s=measure_barrier(wave_capacity(dev, 4)), atomic_s=measure_atomics())
    try:
        dev = replace(dev, graph_launch_s=measure_graph_launch())
    except Exception as e:   # (a driver without graph capture): the table value stands, said below
        graph_error = f"{type(e).__name__}: {e}"
    else:
        graph_error = ""
    try:   # (not in the cost model yet: the knob pdl is off by default until measured)
        graph_launch_pdl: float | str = measure_graph_launch(pdl=True)
    except Exception as e:   # (a GPU before Hopper, a driver without PDL in graphs)
        graph_launch_pdl = f"{type(e).__name__}: {e}"
    try:
        walk: dict[str, Any] = measure_walk_latency(dev)
        dev = replace(dev, mem_latency_s=walk["mem_latency_s"])
    except Exception as e:   # the table value stands, said in the file
        walk = {"error": f"{type(e).__name__}: {e}"}
    try:
        loop: dict[str, Any] = measure_loop_wait(dev)
        dev = replace(dev, loop_wait_s=loop["loop_wait_s"])
    except Exception as e:   # the table value stands, said in the file
        loop = {"error": f"{type(e).__name__}: {e}"}
    forms = measure_forms(dev)
    eff = {f: v["efficiency"] for f, v in forms.items() if "efficiency" in v}
    glob = measure_global(replace(dev, form_efficiency=tuple(sorted(eff.items()))))
    try:
        gemm = measure_triton_gemm()
        dev = replace(dev, triton_gemm_efficiency=gemm["efficiency"], triton_gemm_source="calibrated",
                      triton_gemm_config=gemm["best"])
    except Exception as e:   # the table value stands (and gemm_epilogue=auto fuses nothing), said below
        gemm = {"error": f"{type(e).__name__}: {e}"}
    measured = [v["efficiency"] for v in glob.values() if "efficiency" in v]
    if measured:   # the worse pattern decides; otherwise the table value stands, said in the file
        eff["global"] = min(measured)
    dev = replace(dev, form_efficiency=tuple(sorted(eff.items())))
    measurements = {"gpu": torch.cuda.get_device_name(), "copy_bandwidth": copies, "launch_s": dev.launch_s,
                    "launch_s_from": "stitch_launcher" if "wall_us" in ours else "empty kernel, Triton JIT",
                    "launch_overhead": overheads,
                    "barrier_s": dev.barrier_s, "atomic_s": dev.atomic_s, "forms": forms, "global_scheme": glob,
                    "graph_launch_s": dev.graph_launch_s, "graph_launch_error": graph_error,
                    "graph_launch_pdl_s": graph_launch_pdl,
                    "walk_latency": walk, "loop_wait": loop,
                    "triton_gemm": gemm}
    path = save_calibration(dev, measurements)
    return replace(dev, calibration_file=str(path))


def main(argv: list[str] | None = None) -> int:
    """`stitchml calibrate`; `--launch-only`: measure and print the launch overheads,
    store nothing; `--walk-only`: the same for the walk latency and the looped block's wait."""
    import argparse
    ap = argparse.ArgumentParser(prog="stitchml calibrate")
    ap.add_argument("--launch-only", action="store_true")
    ap.add_argument("--walk-only", action="store_true")
    args = ap.parse_args(argv or [])
    if args.walk_only:
        if not torch.cuda.is_available():
            print("no CUDA GPU: the walk latency needs one")
            return 0
        res = measure_walk_latency(current_device())
        for name in ("plain", "prefetch"):
            r = res[name]
            print(f"{name}: column sums of {res['rows']} x {res['cols']} {res['dtype']} rows, grid {r['grid']}, "
                  f"walks {r['walk']}: {[round(s * 1e6, 1) for s in r['seconds']]} us "
                  f"(bytes at copy bandwidth {[round(s * 1e6, 1) for s in r['mem_s']]} us): "
                  f"{r['latency_s'] * 1e6:.2f} us a walked block beyond its bytes")
        loop = measure_loop_wait(current_device())
        print(f"looped: RMS norms of {loop['rows']} x {loop['cols']} {loop['dtype']} rows, grid {loop['grid']}, "
              f"blocks loaded a program {loop['waits']}: {[round(s * 1e6, 1) for s in loop['seconds']]} us "
              f"(modelled memory {[round(s * 1e6, 1) for s in loop['mem_s']]} us): "
              f"{loop['loop_wait_s'] * 1e6:.2f} us a looped column block beyond its bytes")
        return 0
    if args.launch_only:
        if not torch.cuda.is_available():
            print("no CUDA GPU: launch overheads need one")
            return 0
        print("\n".join(describe_launch_overheads(measure_launch_overheads("cuda"))))
        return 0
    dev = calibrate()
    if dev is None:
        known = ", ".join(DEVICES)
        print(f"no CUDA GPU: nothing to calibrate; the cost model keeps its table values ({known})")
        return 0
    print(f"{dev.name}: copy bandwidth {dev.bandwidth / 1e12:.2f} TB/s, launch {dev.launch_s * 1e6:.2f} us "
          f"({dev.graph_launch_s * 1e6:.2f} us in a CUDA-graph replay), "
          f"grid barrier {dev.barrier_s * 1e6:.2f} us, atomic add {dev.atomic_s * 1e12:.2f} ps/element, "
          f"memory latency a walked row block {dev.mem_latency_s * 1e6:.2f} us, "
          f"a looped column block {dev.loop_wait_s * 1e6:.2f} us")
    print("form efficiency: " + ", ".join(f"{f} {e:.2f}" for f, e in dev.form_efficiency))
    if dev.triton_gemm_source == "calibrated":
        print(f"Triton GEMM template: {dev.triton_gemm_efficiency:.2f} of cuBLAS's speed with tiles "
              f"{dev.triton_gemm_config} (the best candidate, median of {len(GEMM_SHAPES)} bf16 products; "
              f"gemm_epilogue=auto prices with it)")
    else:
        print("Triton GEMM template: not measured (gemm_epilogue=auto keeps products with cuBLAS)")
    import json
    from pathlib import Path
    stored = json.loads(Path(dev.calibration_file).read_text())
    print("\n".join(describe_launch_overheads(stored["measurements"]["launch_overhead"])))
    print(f"stored: {describe_source(dev)}; the cost model uses these figures from now on")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
