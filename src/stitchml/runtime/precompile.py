"""Compiling a graph's distinct kernels in parallel, before the first launch.

Triton compiles a kernel when it is first launched, one after another inside the
graph's first call.  Here a process pool compiles every distinct kernel of the graph
at once:

- on a GPU (`precompile`), each worker *warms up* the kernel's Triton function with
  the argument types it will be launched with (pointers 16-byte aligned, as every
  buffer stitchml allocates is), which compiles it into Triton's on-disk cache; the
  first launch in this process then finds it there and only loads the binary;
- without a GPU (`compile_for_target`), each worker compiles the kernel for a named
  target (e.g. sm_90) with Triton's own toolchain: the ahead-of-time check, timed.

Correctness never depends on the pool: Triton's JIT computes its own cache key at
the first launch, and anything the pool did not compile (or compiled for other
arguments) is compiled there.

A job the pool compiled leaves a marker under `cache_dir/compiled/` (keyed by the
kernel module, its argument types and launch options, the GPU's compute capability,
the Triton and torch versions and Triton's cache folder).  A later process skips the
marked jobs: its first launch finds the binary in Triton's cache, and no pool is
started at all when every job is marked.  Measured on an H200 (bench/NOTES.md,
2026-11-25) before the markers: a second process spent 9–11 s spawning workers that
only found Triton's cache warm (LLaMA-style step 9.4 s, its cold compile 2.4 s).
A marker that lies (Triton's cache cleared by hand) costs time, never correctness.
A kernel Triton refuses at its planned warps is retried at others in the worker, as the
launcher retries at a launch (`launcher.compiling_warps`); the warps that compiled go
into `launcher.REFUSED` for this process's launches and into the job's marker for a
later process's, so no launch compiles the refused kernel again.

The pool is reused for every graph of the process.  Its workers come from Python's
*fork server* (knob `compile_pool_method`, default `forkserver`): one clean process,
started without CUDA, imports torch, Triton and this module once, and each worker is
a fork of it (a forked CUDA context would be unusable; the server never has one).
With `spawn` every worker imported torch, stitchml and the parent's main module
itself: 16 such imports at once were most of the 9-11 s the H200 spent starting the
pool (2026-11-25).  A cold process also *pre-starts* the pool (`prestart`, knob
`compile_pool_prestart`) when its first graph reaches the backend, so the workers are
up while Dynamo's graph goes through AOTAutograd, lowering and planning; a warm
process (markers present) starts none unless a kernel needs compiling.
Workers never run the caller's main script again (`_main_kept_out`): a training
script without a main guard would otherwise train once more in each of them.
Knobs: `compile_workers`, `compile_pool_method`, `compile_pool_prestart`.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.machinery
import os
import sys
import time
from functools import lru_cache
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Sequence

import torch

from .. import config
from ..codegen.kernel_source import KernelSource
from ..codegen.triton_ops import SIG_DTYPE
from .kernel_cache import load_kernels, module_path
from .launcher import compiling_warps, launch_options, note_refusal, refusal_reason
from .pdl import launched_with_pdl

if TYPE_CHECKING:
    from ..ir.nodes import Graph

_POOL: list[ProcessPoolExecutor] = []
_DONE: set[str] = set()   # module paths already compiled by this process's pool
STATS = {"submitted": 0, "compiled": 0, "failed": 0, "marked": 0}

def workers() -> int:
    n = int(config.get("compile_workers"))
    return min(os.cpu_count() or 1, 16) if n < 0 else n


# What the fork server imports once for every worker it forks.  Not the main module
# (Python's default preload): a script that asks `torch.cuda.is_available()` at its top
# level would initialise CUDA in the server, and no fork of it could use the GPU (and
# no worker needs it: `_main_kept_out`).  Importing these touches no CUDA API.
_PRELOAD = ["torch", "triton.compiler", __name__]


def _context():
    """The multiprocessing context the pool's workers start from (knob
    `compile_pool_method`; `spawn` where the platform has no fork server)."""
    import multiprocessing
    method = config.get("compile_pool_method")
    if method not in ("forkserver", "spawn"):
        raise ValueError(f"STITCHML_COMPILE_POOL_METHOD={method!r}: expected 'forkserver' or 'spawn'")
    if method == "forkserver" and "forkserver" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("forkserver")
        # (process-wide: the fork server is one per process.  Set only while none runs,
        # so a server someone else started keeps its own preload list)
        from multiprocessing import forkserver
        if getattr(forkserver._forkserver, "_forkserver_pid", None) is None:
            ctx.set_forkserver_preload(_PRELOAD)
        return ctx
    return multiprocessing.get_context("spawn")


def pool() -> ProcessPoolExecutor:
    if not _POOL:
        _POOL.append(ProcessPoolExecutor(max_workers=max(workers(), 1), mp_context=_context()))
    return _POOL[0]


@contextlib.contextmanager
def _main_kept_out():
    """While workers start: tell them the main module needs no importing.  A spawned or
    fork-server worker otherwise runs the caller's main script (or `-m` module) again
    from the top before its first job, so a training script without an
    `if __name__ == "__main__":` guard (which Linux's default `fork` never needed, and
    DataLoader workers fork) would load its model and train once more in every worker.
    The jobs are this module's functions: nothing of the main module is unpickled.
    Python's worker bootstrap skips a main module whose spec is named `__main__`."""
    main = sys.modules.get("__main__")
    if main is None or (getattr(main, "__file__", None) is None and getattr(main, "__spec__", None) is None):
        yield   # an interactive session or `-c`: nothing would be imported
        return
    saved = getattr(main, "__spec__", None)
    main.__spec__ = importlib.machinery.ModuleSpec("__main__", None)
    try:
        yield
    finally:
        main.__spec__ = saved


def _submit(fn, *args) -> Future:
    """`pool().submit`, the worker it may start kept from importing the main module."""
    with _main_kept_out():
        return pool().submit(fn, *args)


def shutdown() -> None:
    while _POOL:
        _POOL.pop().shutdown(wait=True, cancel_futures=True)


def _ready() -> int:
    """(Worker) Import what a compile job needs; the worker's pid."""
    import importlib
    importlib.import_module("triton.compiler")
    time.sleep(0.2)   # hold this worker so the next probe reaches another one
    return os.getpid()


def prestart() -> bool:
    """Start the pool's workers in the background (no waiting) where a graph's kernels
    will be compiled by it: a GPU, no interpreter, a pool of two or more workers, the
    knob `compile_pool_prestart` on, and no compiled-kernel markers under the cache
    folder (a warm cache: the pool starts only if a kernel turns out to need it).
    Whether it started them."""
    from ..compiler import _interpreter_on
    if _POOL or not config.get("compile_pool_prestart") or workers() < 2 or _interpreter_on() \
            or not torch.cuda.is_available():
        return False
    folder = Path(config.get("cache_dir")) / "compiled"
    try:
        if folder.is_dir() and any(folder.iterdir()):
            return False
    except OSError:
        pass
    for _ in range(workers()):   # each submission starts a worker while none is idle
        _submit(_ready)
    return True


def start_pool() -> float:
    """Start every worker of the pool and wait until each has imported Triton (spawned
    workers import torch, Triton and stitchml first); the seconds it took."""
    t0 = time.perf_counter()
    seen: set[int] = set()
    for _ in range(8):
        seen |= {f.result() for f in [_submit(_ready) for _ in range(workers())]}
        if len(seen) >= workers():
            break
    return time.perf_counter() - t0


@dataclass(frozen=True)
class Job:
    """One kernel to compile: where its module is, and how it is launched."""

    path: str
    arg_types: tuple[Any, ...]   # torch dtypes (pointers) or sample ints (scalars)
    signature: tuple[tuple[str, str], ...]   # Triton type per parameter (for a named target)
    num_warps: int
    maxnreg: int | None = None
    pdl: bool = False   # launched with programmatic dependent launch (runtime/pdl.py)

    def options(self) -> dict:
        """Its launch options, as a wrapper's launch line passes them (`launcher.launch_options`)."""
        return launch_options(self.num_warps, self.maxnreg, self.pdl)


def job_for(ks: KernelSource, graph: Graph, text: str | None = None,
            sizes: Sequence[tuple[str, int | float]] = ()) -> Job:
    """The compile job of kernel `ks` (whose node ids refer to `graph`), as loaded from
    `text` (default `ks.source`; a dynamic template's text has size arguments `sz0, sz1,
    …` after the kernel's own, given as (Triton type, value at the template's sizes))."""
    types: list[Any] = []
    sig: list[tuple[str, str]] = []
    for (kind, nid), name in zip(ks.params, ks.param_names):
        if kind in ("in", "out"):
            dt = graph[nid].dtype
        elif kind == "partial":
            dt = graph[nid].dtype
            dt = torch.float32 if dt in (torch.float16, torch.bfloat16) else dt
        elif kind == "counter" or (kind == "seed" and name.endswith("_ptr")):   # device-memory seed
            dt = torch.int64
        else:   # seed, base: run-time integers (not specialised on: do_not_specialize)
            types.append(7)
            sig.append((name, "i32"))
            continue
        types.append(dt)
        sig.append((name, "*" + SIG_DTYPE[dt]))
    for i, (ty, value) in enumerate(sizes):
        # the value itself: Triton specialises integers on == 1 and % 16, so a sample
        # number would compile a variant the launch does not use
        types.append(value)
        sig.append((f"sz{i}", ty))
    maxnreg = None
    if any(kind == "counter" for kind, _ in ks.params):
        from ..plan.launches import MAXNREG
        maxnreg = MAXNREG
    return Job(str(module_path(text if text is not None else ks.source)), tuple(types), tuple(sig),
               ks.num_warps, maxnreg, launched_with_pdl(text if text is not None else ks))


def _load_function(path: str):
    from .kernel_cache import exec_kernel_module
    return exec_kernel_module(Path(path), f"stitchml_pre_{Path(path).stem}").KERNEL


def _triton_env() -> dict[str, str]:
    """The caller's Triton settings (`TRITON_*` variables, the cache folder among them)
    as they are now, for a job to take into its worker."""
    return {k: v for k, v in os.environ.items() if k.startswith("TRITON_")}


def _adopt_env(env: dict[str, str] | None) -> None:
    """(Worker) Take the submitting process's Triton settings.  A worker lives as long
    as the pool and kept the environment of its start: a caller that pointed
    TRITON_CACHE_DIR elsewhere since (the bench gives every models row empty cache
    folders) would otherwise have its kernels compiled into a folder its own first
    launch never reads, and compile each one again there."""
    if env is None:
        return
    for k in [k for k in os.environ if k.startswith("TRITON_") and k not in env]:
        del os.environ[k]
    os.environ.update(env)


def _warm_up(job: Job, env: dict[str, str] | None = None,
             retry: bool = False) -> tuple[float, tuple[int, str, str] | None]:
    """(Worker) Compile `job` for the current GPU into Triton's cache: (seconds, None),
    or where Triton refused it at its warps and `retry` (not a grid-barrier kernel):
    (seconds, (the warps it compiled at, the function's name, the refusal)) — as the
    launcher retries (`launcher.compiling_warps`)."""
    _adopt_env(env)
    t0 = time.perf_counter()
    options = job.options()
    fn = _load_function(job.path)
    try:
        fn.warmup(*job.arg_types, grid=(1,), **options)
        return time.perf_counter() - t0, None
    except Exception as error:
        if not retry or job.maxnreg:
            raise
        warps = compiling_warps(lambda w: fn.warmup(*job.arg_types, grid=(1,), **{**options, "num_warps": w}),
                                job.num_warps)
        if warps is None:
            raise
        return time.perf_counter() - t0, (warps, fn.fn.__name__, refusal_reason(error))


def _compile_for(job: Job, arch: int, env: dict[str, str] | None = None) -> tuple[float, int | None]:
    """(Worker) Compile `job` for sm_`arch` without a GPU; (seconds, cubin bytes)."""
    _adopt_env(env)
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    t0 = time.perf_counter()
    fn = _load_function(job.path)
    compiled = triton.compile(ASTSource(fn, dict(job.signature), {}), target=GPUTarget("cuda", arch, 32),
                              options=job.options())
    cubin = compiled.asm.get("cubin")
    return time.perf_counter() - t0, (len(cubin) if cubin else None)


def distinct(jobs: Iterable[Job]) -> list[Job]:
    """One job per module (kernels equal up to their name share one)."""
    out: dict[str, Job] = {}
    for job in jobs:
        out.setdefault(job.path, job)
    return list(out.values())


def distinct_jobs(kernels: dict[str, KernelSource], graph: Graph, launched: Iterable[str] | None = None) -> list[Job]:
    """One job per distinct kernel body of a graph (their modules written).  With
    `launched` (`Plan.launched`) only those kernels: the members of a launch group run
    inside its composite kernel and need no binary of their own."""
    if launched is not None:
        kernels = {name: kernels[name] for name in launched}
    load_kernels({name: ks.source for name, ks in kernels.items()})   # publish the module files
    return distinct(job_for(ks, graph) for ks in kernels.values())


@lru_cache(maxsize=1)
def _device_and_versions() -> tuple:
    import triton
    return (torch.cuda.get_device_capability(), triton.__version__, torch.__version__)


def _target() -> tuple:
    """What a compiled binary depends on besides the kernel and its launch: the GPU's
    compute capability, the versions, and where Triton keeps its cache (read each time:
    a caller may point it elsewhere between graphs)."""
    cache = os.environ.get("TRITON_CACHE_DIR") or str(Path.home() / ".triton" / "cache")
    return (*_device_and_versions(), cache)


def marker(job: Job) -> Path:
    """The file that says `job` was compiled into Triton's cache for this target."""
    key = repr((Path(job.path).name, job.arg_types, job.num_warps, job.maxnreg, _target())
               + ((True,) if job.pdl else ()))   # (markers of jobs without PDL keep their names)
    return Path(config.get("cache_dir")) / "compiled" / hashlib.sha256(key.encode()).hexdigest()[:40]


def _mark(job: Job, retried: tuple[int, str, str] | None = None) -> None:
    """Leave `job`'s marker; a job Triton compiled at other warps keeps them in it
    (`warps name reason`, one line) for a later process (`_note_retried`)."""
    try:
        path = marker(job)
        path.parent.mkdir(parents=True, exist_ok=True)
        if retried is None:
            path.touch()
        else:
            path.write_text(" ".join(map(str, retried)))
    except OSError:   # a read-only cache folder: the next process compiles again
        pass


def _note_retried(job: Job, retried: tuple[int, str, str]) -> None:
    """Launches of `job`'s kernel at its planned warps use the warps the pool compiled
    it at (`launcher.REFUSED`), instead of compiling the refused kernel again."""
    warps, name, reason = retried
    note_refusal((job.path, name), job.options(), warps, reason)


def _read_marker(job: Job) -> bool:
    """Whether `job` has a marker (an earlier process compiled it); where the pool
    compiled it at other warps, those are taken for its launches (`_note_retried`)."""
    try:
        path = marker(job)
        if not path.stat().st_size:
            return True
        parts = path.read_text().split(" ", 2)
    except OSError:
        return False
    if len(parts) == 3 and parts[0].isdigit():
        _note_retried(job, (int(parts[0]), parts[1], parts[2]))
    return True


class Pending:
    """Compile jobs under way in the pool; `wait()` before the graph's first launch.
    Between submission and the wait, the process goes on (planning the next graph)."""

    def __init__(self, futures: list[tuple[Job, Future]] | None = None):
        self.futures = futures or []
        self.waited_s = 0.0

    def wait(self) -> float:
        t0 = time.perf_counter()
        for job, fut in self.futures:
            try:
                _, retried = fut.result()
                STATS["compiled"] += 1
                _DONE.add(job.path)
                if retried is not None:
                    _note_retried(job, retried)
                _mark(job, retried)
            except Exception:   # the first launch compiles it in this process instead
                STATS["failed"] += 1
        self.futures = []
        self.waited_s += time.perf_counter() - t0
        return self.waited_s


def precompile(jobs: Iterable[Job]) -> Pending:
    """Start compiling the distinct kernels of `jobs` in parallel for this machine's
    GPU (their module files must be published: `kernel_cache.load_kernels`).  Nothing
    is started under the interpreter, with no pool, or for fewer than two kernels not
    compiled yet; `jobs` is only iterated when something may start (a generator costs
    nothing on a CPU)."""
    from ..compiler import _interpreter_on
    if _interpreter_on() or workers() == 0 or not torch.cuda.is_available():
        return Pending()
    todo = [j for j in distinct(jobs) if j.path not in _DONE]
    marked = [j for j in todo if _read_marker(j)]     # compiled by an earlier process
    STATS["marked"] += len(marked)
    _DONE.update(j.path for j in marked)
    todo = [j for j in todo if j.path not in _DONE]
    if len(todo) < 2:
        return Pending()
    STATS["submitted"] += len(todo)
    env = _triton_env()
    retry = bool(config.get("retry_refused_kernels"))
    return Pending([(j, _submit(_warm_up, j, env, retry)) for j in todo])


def compile_for_target(kernels: dict[str, KernelSource], graph: Graph, arch: int = 90,
                       parallel: bool = True, launched: Iterable[str] | None = None) -> dict[str, Any]:
    """Compile a graph's distinct (launched) kernels for sm_`arch` without a GPU (Triton
    must not be in interpreter mode in this process).  Returns timings (`wall_s` from
    the first job to the last result; `pool_start_s` before it) and per-kernel verdicts."""
    if launched is not None:
        kernels = {name: kernels[name] for name in launched}
    jobs = distinct_jobs(kernels, graph)
    pooled = parallel and workers() > 1
    started = start_pool() if pooled else 0.0   # reported apart: once per process, not per graph
    t0 = time.perf_counter()
    results: list[tuple[Job, Any]] = []
    if pooled:
        env = _triton_env()
        futures = [(j, _submit(_compile_for, j, arch, env)) for j in jobs]
        for job, fut in futures:
            try:
                results.append((job, fut.result()))
            except Exception as e:
                results.append((job, e))
    else:
        for job in jobs:
            try:
                results.append((job, _compile_for(job, arch)))
            except Exception as e:
                results.append((job, e))
    wall = time.perf_counter() - t0
    failed = [f"{Path(j.path).stem}: {type(r).__name__}: {str(r)[:300]}" for j, r in results
              if isinstance(r, Exception)]
    per_kernel = [r[0] for _, r in results if not isinstance(r, Exception)]
    return {"kernels": len(kernels), "distinct": len(jobs), "wall_s": wall, "sum_s": sum(per_kernel),
            "pool_start_s": started, "failed": failed, "workers": workers() if pooled else 1}


__all__ = ["Job", "Pending", "compile_for_target", "distinct", "distinct_jobs", "job_for", "precompile", "prestart",
           "shutdown", "start_pool", "workers"]
