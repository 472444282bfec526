"""Run cases x contenders: build each case once per dtype, compute eager's reference,
then for every contender prepare (cold call), check against eager BEFORE timing,
count launches, time, and measure peak memory.  A contender that raises or returns a
wrong answer is reported FAILED with the reason; nothing is dropped.

results.json is rewritten after every case, so a crash late in a long GPU run keeps
what was measured before it.
"""
from __future__ import annotations

import datetime as _dt
import fnmatch
import gc
import importlib.util
import os
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import torch

from ..capture.logging_breaks import ignore_once_logging
from . import environment
from .compare import compare
from .contenders import (CONTENDER_NAMES, OPT_IN_CONTENDERS, Contender, Prepared, RunContext, as_replayed,
                         build_step, default_contenders, make_cotangents)
from .timing import (CPU_BUDGET_S, QUICK_CPU_BUDGET_S, Timing, peak_memory, profile_device, time_cpu, time_gpu,
                     time_host, time_host_per_step, wall_call)
from .workload import CaseSpec, CheckOutcome, Workload, flat_tensors, floor_bytes

SUITES = ("micro", "models", "simulator", "time_to_target")


@dataclass
class BenchOptions:
    suites: tuple[str, ...] = ("all",)
    cases: tuple[str, ...] = ()           # names, families (name without [size]) or globs
    quick: bool = False
    out: Path | None = None
    dtype: str | None = None              # fp32 | bf16 | both; None: fp32 with --quick, else both
    reps: int | None = None               # None: 100 on a GPU, 10 on CPU, 3 with --quick
    contenders: tuple[str, ...] = ()      # empty: all of CONTENDER_NAMES but the opt-in ones
    progress: bool = True
    plots: bool = True
    device: str | None = None             # None: cuda if available
    resume: bool = False                  # continue OUT/results.json: keep its rows, measure only missing ones
    compile_time: bool = True             # models suite: cold call on empty caches + a warm-cache fresh process

    def dtypes(self) -> tuple[str, ...]:
        d = self.dtype or ("fp32" if self.quick else "both")
        return ("fp32", "bf16") if d == "both" else (d,)

    def suite_list(self) -> tuple[str, ...]:
        if not self.suites or "all" in self.suites:
            return SUITES
        return tuple(s for s in SUITES if s in self.suites)


@dataclass
class CaseResult:
    suite: str
    case: str
    dtype: str
    contender: str
    shape: str = ""
    mode: str = ""
    status: str = "ok"                    # ok | FAILED | skipped | unavailable | n/a
    reason: str = ""
    check: dict[str, Any] | None = None
    timing: dict[str, Any] | None = None
    min_bytes: int | None = None
    gbps: float | None = None
    pct_of_copy_bw: float | None = None
    launches: int | None = None
    launches_source: str = "n/a"
    eager_ops: int | None = None
    device_ops_profiled: int | None = None
    cold_s: float | None = None
    warm_s: float | None = None
    peak_mem_bytes: int | None = None
    peak_mem_note: str = ""
    notes: list[str] = field(default_factory=list)
    traceback: str = ""
    elapsed_s: float = 0.0                # wall time of this contender on this case, compile included
    # kernel time per step (torch.profiler on a GPU: sum of device-activity durations), and
    # device time / wall median (busy << 1: the host is the bottleneck)
    device_time: dict[str, Any] | None = None
    busy_fraction: float | None = None
    # host time per step (from a synchronised start to the call's return), models suite / GPU
    host_time: dict[str, Any] | None = None
    # models suite: cold (empty caches), warm cache in a fresh process, stitch's split
    compile: dict[str, Any] | None = None
    run_date: str = ""                    # date_utc of the run that measured it (--resume merges runs)
    # stitchml rows: the cost model's prediction of the timed median (sum over the graphs a
    # call runs of plan.predicted_s), how it was made, and per kernel predicted vs profiler time
    predicted_s: float | None = None
    prediction: dict[str, Any] | None = None
    kernel_times: dict[str, Any] | None = None

    @property
    def median_s(self) -> float | None:
        return self.timing["median_s"] if self.timing else None


def _key(r: CaseResult) -> tuple[str, str, str, str]:
    return (r.suite, r.case, r.dtype, r.contender)


@dataclass
class BenchRun:
    environment: dict[str, Any]
    options: dict[str, Any]
    results: list[CaseResult]
    time_to_target: list[dict[str, Any]]
    out: Path
    files: list[Path] = field(default_factory=list)
    elapsed_s: float = 0.0
    complete: bool = False
    # with --resume: what OUT/results.json held before this run
    earlier_results: list[CaseResult] = field(default_factory=list)
    earlier_time_to_target: list[dict[str, Any]] = field(default_factory=list)
    earlier_environments: list[dict[str, Any]] = field(default_factory=list)

    def all_results(self) -> list[CaseResult]:
        """This run's results plus the earlier ones it did not re-measure."""
        new = {_key(r) for r in self.results}
        return [r for r in self.earlier_results if _key(r) not in new] + self.results

    def all_time_to_target(self) -> list[dict[str, Any]]:
        new = {r["contender"] for r in self.time_to_target}
        return [r for r in self.earlier_time_to_target if r["contender"] not in new] + self.time_to_target


def load_earlier(run: BenchRun, path: Path) -> None:
    """Read an earlier results.json into `run` (for --resume); refuse to mix devices."""
    import json
    data = json.loads(path.read_text())
    env = data.get("environment", {})
    mine = run.environment
    if (env.get("gpu"), env.get("device")) != (mine.get("gpu"), mine.get("device")):
        raise ValueError(f"--resume: {path} was measured on {env.get('gpu') or env.get('device')}, this run is on "
                         f"{mine.get('gpu') or mine.get('device')}; use another --out")
    known = set(CaseResult.__dataclass_fields__)
    run.earlier_results = [CaseResult(**{k: v for k, v in r.items() if k in known}) for r in data.get("results", [])]
    run.earlier_time_to_target = data.get("time_to_target", [])
    run.earlier_environments = data.get("earlier_environments", []) + [env]


# --------------------------------------------------------------------------- selection

def suite_cases(suite: str, quick: bool) -> list[CaseSpec]:
    if suite == "micro":
        from . import micro
        return micro.cases(quick)
    if suite == "models":
        from . import models
        return models.cases(quick)
    if suite == "simulator":
        from . import simulator
        return simulator.cases(quick)
    return []


def _matches(spec: CaseSpec, patterns: Iterable[str]) -> bool:
    return any(p in (spec.name, spec.family) or fnmatch.fnmatchcase(spec.name, p)
               or fnmatch.fnmatchcase(spec.family, p) for p in patterns)


def select_cases(opts: BenchOptions) -> list[CaseSpec]:
    specs = [s for suite in opts.suite_list() for s in suite_cases(suite, opts.quick)]
    return [s for s in specs if _matches(s, opts.cases)] if opts.cases else specs


def ttt_selected(opts: BenchOptions) -> bool:
    if "time_to_target" not in opts.suite_list():
        return False
    if not opts.cases:
        return True
    return any(p == "time_to_target" or fnmatch.fnmatchcase("time_to_target", p) for p in opts.cases)


def pick_contenders(names: Iterable[str]) -> list[Contender]:
    names = list(names)
    unknown = [n for n in names if n not in CONTENDER_NAMES]
    if unknown:
        raise ValueError(f"unknown contender(s) {unknown}; choose from {CONTENDER_NAMES}")
    # (opt-in contenders, knob experiments such as stitchml-pdl, run only when named)
    return [c for c in default_contenders() if c.name in names or (not names and c.name not in OPT_IN_CONTENDERS)]


# --------------------------------------------------------------------------- one case

def _result_names(w: Workload, expected: list[torch.Tensor]) -> list[str]:
    """A step's results by name: its outputs, then one gradient per grad target."""
    n_out = len(expected) - len(w.grad_targets)
    return [f"output {i}" for i in range(n_out)] + \
        list(w.grad_names or [f"grad of target {j}" for j in range(len(w.grad_targets))])


def _check(w: Workload, actual: list[torch.Tensor], expected: list[torch.Tensor]) -> CheckOutcome:
    if w.checker is not None:
        return w.checker(actual, expected)
    return compare(actual, expected, w.tol, _result_names(w, expected))


# a contender judged against float64 may be this much further from it than eager is
TRUTH_FACTOR = 2.0


def _judge_by_truth(w: Workload, actual: list[torch.Tensor], expected: list[torch.Tensor],
                    got: CheckOutcome) -> CheckOutcome:
    """A low-precision forward row that missed its tolerance against eager, judged
    against float64 instead: eager can be the inaccurate one (bf16 `cumsum` on CUDA
    rounds every partial sum; measured 2.7e-2 from a float32-accumulating kernel on an
    H200).  Passes when the contender's error against the float64 run is within
    max(tolerance, TRUTH_FACTOR x eager's own error against it)."""
    if w.truth is not None and w.checker is None and w.cotangents is not None:
        return _judge_training_by_truth(w, actual, expected, got)
    low = any(isinstance(t, torch.Tensor) and t.dtype in (torch.bfloat16, torch.float16) for t in w.inputs)
    if w.mode != "fwd" or not low or w.checker is not None:
        return got
    with torch.no_grad():
        args = [t.double() if isinstance(t, torch.Tensor) and t.is_floating_point() else t for t in w.inputs]
        truth = [t.double() for t in flat_tensors(w.fn(*args))]
    # errors against float64 (references kept in float64: rounding them would add error)
    mine = compare([a.double() for a in actual], truth, w.tol)
    theirs = compare([e.double() for e in expected], truth, w.tol)
    bound = max(w.tol, TRUTH_FACTOR * theirs.max_rel_err)
    ok = mine.max_rel_err <= bound
    return CheckOutcome(ok, mine.max_rel_err,
                        f"{got.detail} against eager; against float64: {mine.max_rel_err:.2e}, eager's own "
                        f"{theirs.max_rel_err:.2e}, bound {bound:.2e}")


def _judge_training_by_truth(w: Workload, actual: list[torch.Tensor], expected: list[torch.Tensor],
                             got: CheckOutcome) -> CheckOutcome:
    """A model's training step that missed its tolerance against eager, judged against
    the same step in float64 (`Workload.truth`, computed once) by the tests' rule
    (`testing.judge_against_float64`: each tensor no further from float64 than 4x
    eager's own error, plus a few units of rounding).  At toy sizes a BatchNorm
    normalises a few values a channel and eager's own float32 bias gradients were 1e-3
    off float64 on the CPU, stitch's 4e-7: the row failed against eager."""
    from ..testing import judge_against_float64
    if w.truth_values is None:
        w.truth_values = w.truth(w.cotangents)
    truth = w.truth_values
    if len(truth) != len(expected) or len(actual) != len(expected):
        return got
    n_out = len(expected) - len(w.grad_targets)
    groups = ["output"] * n_out + ["grad"] * len(w.grad_targets)
    verdict = judge_against_float64(actual, expected, truth, _result_names(w, expected), groups=groups)
    bad = [r for r in verdict.rows if not r.ok]
    detail = (f"{got.detail} against eager; against float64 every tensor within 4x eager's own error"
              if verdict.ok else f"{got.detail} against eager; against float64: {bad[0].line()}")
    return CheckOutcome(verdict.ok, got.max_rel_err, detail)


def reference(w: Workload) -> list[torch.Tensor]:
    """Eager's results for `w` (outputs, then gradients); makes the shared cotangents."""
    if w.mode != "fwd":
        with torch.enable_grad():
            outs = flat_tensors(w.fn(*w.inputs))
        w.cotangents = make_cotangents(w, outs)
        del outs
    torch.manual_seed(0)
    step, _ = build_step(w, w.fn)
    return [t.detach().clone() for t in step()]


def graph_mode(w: Workload) -> str:
    """How a GPU row is timed: micro rows replayed from a CUDA graph for every contender
    (the suite compares kernels: autograd's host work drowned ~100 µs of backward kernels,
    and on the H200 on 2026-11-27 host jitter alone doubled the medians of ~50-100 µs
    forward rows for Inductor and stitch alike, IQRs up to 0.8 ms, device times unmoved);
    model rows never (host overhead is part of a step); the rest: graphs below 10 µs."""
    if w.suite == "micro":
        return "always"
    return "never" if w.suite == "models" else "auto"


def _time(p: Prepared, ctx: RunContext, reps: int, warm_s: float, w: Workload) -> Timing:
    if p.timer == "host":
        return time_host(p.step, ctx.device, reps, warm_s)
    if ctx.device.type == "cuda":
        return time_gpu(p.step, ctx.device, reps, allow_graph=p.allow_graph, graph=graph_mode(w))
    budget = QUICK_CPU_BUDGET_S if ctx.quick else CPU_BUDGET_S
    return time_cpu(p.step, reps, interpreted=ctx.interpreted, warm_s=warm_s, budget_s=budget)


def _release() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def host_reps(w: Workload, ctx: RunContext, reps: int) -> int:
    """0 = not measured: on a CPU only for model rows (one call under the interpreter is slow)."""
    if ctx.device.type == "cuda":
        return min(reps, 20)
    return min(reps, 2) if w.suite == "models" else 0


def _compile_root(ctx: RunContext, w: Workload, c: Contender) -> Path | None:
    """Empty cache folders for a models row's cold call (None: not measured)."""
    if not ctx.compile_time or w.suite != "models" or ctx.cache_root is None:
        return None
    safe = "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in f"{w.name}-{w.dtype}-{c.name}")
    root = ctx.cache_root / safe
    from .compile_time import cleanup
    cleanup(root)
    return root


def _measure_compile(c: Contender, w: Workload, ctx: RunContext, res: CaseResult, root: Path) -> None:
    from . import compile_time as ct
    from .contenders import STITCH_CONTENDERS
    backend = getattr(c, "backend", None) if c.name in STITCH_CONTENDERS else None
    split = ct.stitch_split(backend.records) if backend is not None else None
    res.compile = ct.summarise(res.cold_s, split)
    res.compile["method"] = ("cold: first call in the bench process with empty Triton/Inductor/stitchml cache "
                             "folders; warm: first call in a fresh process sharing those folders (Inductor's "
                             "compile workers are per bench process)")
    if c.name != "eager" and _compiles(c):
        files = res.compile["cache_files"] = ct.cache_files(root)
        mine = "STITCHML_CACHE_DIR" if backend is not None else "TORCHINDUCTOR_CACHE_DIR"
        if files[mine] == 0:
            res.notes.append(f"the cold call wrote nothing under its {mine}: the 'warm cache' figure may be a "
                             "second cold compile")
        res.compile["warm_cache"] = ct.fresh_process(w.name, w.dtype, c.name, root, quick=ctx.quick)
    ct.cleanup(root)


def _compiles(c: Contender) -> bool:
    """torch.compile contenders (the fresh process rebuilds them by name)."""
    from .contenders import TorchContender
    return c.name in CONTENDER_NAMES and isinstance(c, TorchContender)


def _kernel_times(kernels: list[dict[str, Any]], prof: Any, ctx: RunContext) -> dict[str, Any]:
    """Per-kernel predicted against profiler time (GPU), else predictions only."""
    from .contenders import match_kernels
    if ctx.device.type != "cuda":
        return match_kernels(kernels, None)
    if prof is None:
        out = match_kernels(kernels, None)
        out["note"] = "GPU, but the profiler gave no device activities: not measured"
        return out
    return match_kernels(kernels, prof.by_name)


def run_contender(c: Contender, w: Workload, ref: list[torch.Tensor], ref_variant: list[torch.Tensor] | None,
                  ctx: RunContext, reps: int, copy_bw: float) -> CaseResult:
    res = CaseResult(w.suite, w.name, w.dtype, c.name, w.shape, w.mode, notes=[w.notes] if w.notes else [])
    n_grads = len(w.grad_targets)
    res.min_bytes = floor_bytes(w, ref[:len(ref) - n_grads], ref[len(ref) - n_grads:]) or None
    skip = c.skip_reason(w, ctx)
    if skip is not None:
        res.status, res.reason = skip
        return res
    p: Prepared | None = None
    try:
        twin_skip = c.skip_reason(w.check_variant, ctx) if w.check_variant is not None else None
        if twin_skip is not None:
            res.notes.append(f"deterministic twin not run ({twin_skip[0]}: {twin_skip[1]})")
        elif w.check_variant is not None and ref_variant is not None:
            pv = c.prepare(w.check_variant, ctx)
            got = _check(w.check_variant, pv.first, ref_variant)
            res.notes.append(f"deterministic twin {w.check_variant.name}: {got.detail}")
            problems = pv.problems
            del pv
            if problems:
                res.status, res.reason = "FAILED", f"deterministic twin: {'; '.join(problems)}"
                return res
            if not got.ok:
                res.status, res.reason = "FAILED", f"wrong answer (deterministic twin): {got.detail}"
                return res
        root = _compile_root(ctx, w, c)
        if root is not None:
            from .compile_time import isolated_caches
            with isolated_caches(root):
                p = c.prepare(w, ctx)
        else:
            p = c.prepare(w, ctx)
        res.cold_s = p.cold_s
        res.notes.extend(p.notes)
        if root is not None:
            _measure_compile(c, w, ctx, res, root)
        got = _check(w, p.first, ref)
        if not got.ok:
            got = _judge_by_truth(w, p.first, ref, got)
        res.check = {"ok": got.ok, "max_rel_err": got.max_rel_err, "tolerance": w.tol, "detail": got.detail}
        if not got.ok:
            res.status, res.reason = "FAILED", f"wrong answer: {got.detail}"
            return res
        problems = list(p.problems)
        snapshot = c.launch_snapshot()
        _, res.warm_s = wall_call(p.step, ctx.device)
        res.launches, res.launches_source, res.eager_ops = c.launches(snapshot, p, ctx)
        predicted = c.prediction(snapshot)
        if predicted is not None:
            kernels = predicted.pop("kernels")
            res.predicted_s, res.prediction = predicted["predicted_s"], predicted
        if c.name == "stitchml" and w.expect_stitch_kernels is not None and res.launches != w.expect_stitch_kernels:
            problems.append(f"expected {w.expect_stitch_kernels} launch(es) per call, the plan has {res.launches}")
        timing = _time(p, ctx, reps, res.warm_s, w)
        res.timing = timing.to_json()
        if res.prediction is not None and "graph replay" in timing.method and not res.prediction.get("replayed"):
            # timed as a CUDA-graph replay of the whole call: launches cost the replay's gap
            as_replayed(res.prediction, kernels)
            res.predicted_s = res.prediction["predicted_s"]
        if res.prediction is not None and res.predicted_s and timing.median_s > 0:
            res.prediction["measured_over_predicted"] = timing.median_s / res.predicted_s
            res.prediction["meaningful"] = timing.meaningful
        if res.min_bytes and timing.median_s > 0:
            res.gbps = res.min_bytes / timing.median_s / 1e9
            res.pct_of_copy_bw = 100.0 * res.min_bytes / timing.median_s / copy_bw
        if p.timer == "device":
            res.peak_mem_bytes, res.peak_mem_note = peak_memory(p.step, ctx.device)
            prof = profile_device(p.step, ctx.device)
            if prof is not None:
                res.device_time = prof.to_json()
                res.device_ops_profiled = prof.activities
                if timing.median_s > 0:
                    res.busy_fraction = prof.median_s / timing.median_s
            if predicted is not None:
                res.kernel_times = _kernel_times(kernels, prof, ctx)
            n_host = host_reps(w, ctx, reps)
            if n_host:
                res.host_time = time_host_per_step(p.step, ctx.device, n_host).to_json()
        else:
            res.peak_mem_note = "n/a (JAX allocations are not visible to torch)"
        if problems:
            res.status, res.reason = "FAILED", "; ".join(problems)
    except Exception as e:  # the contender failed: say why, keep going
        res.status = "FAILED"
        msg = str(e).strip().splitlines()
        res.reason = f"{type(e).__name__}: {msg[0] if msg else ''}"[:400]
        res.traceback = traceback.format_exc()[-6000:]
    finally:
        del p
        torch._dynamo.reset()
        if ctx.device.type == "cuda":   # compiled artifacts hold device memory: free it before the next
            _release()
    return res


def _available(module: str) -> bool:
    """Whether a case's module imports here (torchvision: also from `.venv/vision`,
    `bench/vision.py`)."""
    if module == "torchvision":
        from .vision import import_torchvision
        return import_torchvision() is not None
    return importlib.util.find_spec(module) is not None


def run_case(spec: CaseSpec, dtype: str, contenders: list[Contender], ctx: RunContext, reps: int,
             copy_bw: float, tick: Callable[[str], None]) -> list[CaseResult]:
    missing = [m for m in spec.requires if not _available(m)]
    if missing:
        for c in contenders:
            tick(f"{spec.name} {dtype} {c.name}")
        return [CaseResult(spec.suite, spec.name, dtype, c.name, status="unavailable",
                           reason=f"needs {', '.join(missing)} (not installed)") for c in contenders]
    try:
        w = spec.build(dtype, ctx.device)
        ignore_once_logging()   # (knob; transformers is imported now): every contender traces the same graphs
        torch.manual_seed(0)
        ref = reference(w)
        ref_variant = reference(w.check_variant) if w.check_variant is not None else None
    except Exception as e:
        tb = traceback.format_exc()[-6000:]
        for c in contenders:
            tick(f"{spec.name} {dtype} {c.name}")
        return [CaseResult(spec.suite, spec.name, dtype, c.name, status="FAILED",
                           reason=f"case setup / eager reference failed: {type(e).__name__}: {e}"[:400],
                           traceback=tb) for c in contenders]
    out = []
    for c in contenders:
        tick(f"{spec.name} {dtype} {c.name}")
        t0 = time.perf_counter()
        out.append(run_contender(c, w, ref, ref_variant, ctx, reps, copy_bw))
        out[-1].elapsed_s = time.perf_counter() - t0
    del w, ref, ref_variant
    _release()
    return out


# --------------------------------------------------------------------------- the run

class _Progress:
    """tqdm when installed (the GPU machines may lack it), else one line per step."""

    def __init__(self, total: int, enabled: bool):
        self.bar = None
        self.enabled = enabled
        if enabled:
            try:
                from tqdm import tqdm
                self.bar = tqdm(total=total, unit="run", file=sys.stderr, dynamic_ncols=True)
            except ImportError:
                pass
        self.n, self.total = 0, total

    def tick(self, what: str) -> None:
        self.n += 1
        if self.bar is not None:
            self.bar.set_description_str(what[:60])
            self.bar.update(1)
        elif self.enabled:
            print(f"[{self.n}/{self.total}] {what}", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def default_reps(opts: BenchOptions, device: torch.device) -> int:
    if opts.reps is not None:
        return opts.reps
    if opts.quick:
        return 3
    return 100 if device.type == "cuda" else 10


def default_out(opts: BenchOptions, device: torch.device) -> Path:
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    tag = environment.device_tag(device)
    # quick runs are smoke tests: they go to the git-ignored bench/out/
    return Path("bench") / ("out" if opts.quick else "results") / f"{'quick-' if opts.quick else ''}{tag}-{stamp}"


def make_context(opts: BenchOptions) -> RunContext:
    device = torch.device(opts.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    interpreted = device.type == "cpu" or os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    # Inductor compiles C++ on the CPU: 30-90 s per model-sized graph on 2 cores, which a
    # smoke test cannot afford; micro cases (small graphs) still run it
    cpu_quick = opts.quick and device.type == "cpu"
    skip = frozenset({"models", "simulator", "time_to_target"}) if cpu_quick else frozenset()
    return RunContext(device, opts.quick, interpreted, skip, compile_time=opts.compile_time)


def run_bench(opts: BenchOptions, contenders: list[Contender] | None = None) -> BenchRun:
    """Run the selected suites and write results.json, results.md and the plots."""
    from . import report
    t_start = time.perf_counter()
    ctx = make_context(opts)
    specs = select_cases(opts)
    run_ttt = ttt_selected(opts)
    if opts.cases and not specs and not run_ttt:
        raise ValueError(f"no case matches {list(opts.cases)}; `stitchml bench --list` shows the names")
    contenders = contenders if contenders is not None else pick_contenders(opts.contenders)
    reps = default_reps(opts, ctx.device)
    out = Path(opts.out) if opts.out else default_out(opts, ctx.device)
    out.mkdir(parents=True, exist_ok=True)
    ctx.cache_root = out / "compile-caches"     # emptied per models row, removed after it

    env = environment.capture(ctx.device, opts.quick, ctx.interpreted)
    copy_bw = env["copy_bandwidth"]["bytes_per_s"]
    options = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(opts).items()}
    options.update(dtypes=list(opts.dtypes()), reps=reps, contenders=[c.name for c in contenders],
                   suites=list(opts.suite_list()))
    run = BenchRun(env, options, [], [], out)
    if opts.resume and (out / "results.json").exists():
        load_earlier(run, out / "results.json")
    done = {_key(r) for r in run.earlier_results}

    # a case that has none of the asked dtypes runs at its own (the simulator is fp32 only)
    jobs = []
    for spec in specs:
        for dtype in [d for d in opts.dtypes() if d in spec.dtypes] or [spec.dtypes[0]]:
            todo = [c for c in contenders if (spec.suite, spec.name, dtype, c.name) not in done]
            if todo:
                jobs.append((spec, dtype, todo))
    from .time_to_target import TTT_CONTENDERS
    ttt_done = {r["contender"] for r in run.earlier_time_to_target}
    ttt_todo = [c for c in contenders if c.name in TTT_CONTENDERS and c.name not in ttt_done] if run_ttt else []
    progress = _Progress(sum(len(j[2]) for j in jobs) + len(ttt_todo), opts.progress)
    try:
        for spec, dtype, todo in jobs:
            rows = run_case(spec, dtype, todo, ctx, reps, copy_bw, progress.tick)
            for r in rows:
                r.run_date = env["date_utc"]
            run.results.extend(rows)
            report.write_json(run, out / "results.json")
        if ttt_todo:
            from . import time_to_target
            run.time_to_target = time_to_target.run(ctx, ttt_todo, progress.tick)
            for row in run.time_to_target:
                row["run_date"] = env["date_utc"]
        run.complete = True
    finally:
        progress.close()
        run.elapsed_s = time.perf_counter() - t_start
        run.files = report.write_all(run, out, plots=opts.plots)
    return run
