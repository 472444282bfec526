"""The contenders: eager PyTorch, Inductor (`torch.compile` default and
`mode="max-autotune"`), stitchml, and JAX/XLA (`jax.jit`) where JAX is importable.

Every contender turns a `Workload` into a `Prepared` step over the SAME input
tensors: the first (cold) call is made here, timed, and its results kept for the
correctness check that the harness makes before any timing.
"""
from __future__ import annotations

import os
import re
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from .timing import count_cuda_kernels, wall_call
from .workload import Workload, flat_tensors


@dataclass
class RunContext:
    device: torch.device
    quick: bool
    interpreted: bool
    # suites where Inductor is not run (see harness.make_context)
    inductor_skip_suites: frozenset[str] = frozenset()
    # models suite: measure cold / warm-cache compile (bench/compile_time.py) under cache_root
    compile_time: bool = False
    cache_root: Path | None = None


@dataclass
class Prepared:
    step: Callable[[], Any]
    first: list[torch.Tensor]                 # flat results of the cold call
    cold_s: float
    # results of `step()` as flat torch tensors (identity for torch contenders)
    as_tensors: Callable[[Any], list[torch.Tensor]] = lambda r: r
    timer: str = "device"                     # device: CUDA events | host: wall clock + block
    problems: list[str] = field(default_factory=list)   # the run is not what it claims to be
    notes: list[str] = field(default_factory=list)
    allow_graph: bool = True                  # may be replayed from a CUDA graph


class Contender:
    """Base class: `skip_reason` (None = runs), `prepare`, `launches`."""

    name = "?"

    def skip_reason(self, w: Workload, ctx: RunContext) -> tuple[str, str] | None:
        """(status, reason) when this contender does not run the case; status is
        'skipped' (by choice) or 'unavailable' (cannot)."""
        return None

    def prepare(self, w: Workload, ctx: RunContext) -> Prepared:
        raise NotImplementedError

    def launch_snapshot(self) -> Any:
        """State before a warm call; `launches` reads what that call launched."""
        return None

    def launches(self, snapshot: Any, p: Prepared, ctx: RunContext) -> tuple[int | None, str, int | None]:
        """(launches per call, where the number comes from, eager ops per call), for
        the warm call made since `snapshot`.  On a GPU the profiler counts device
        activities (one more call); on a CPU other contenders' launches are unknown."""
        if ctx.device.type == "cuda":
            n = count_cuda_kernels(p.step)
            return n, "profiler (device activities)" if n is not None else "n/a", None
        return None, "n/a", None

    def prediction(self, snapshot: Any) -> dict[str, Any] | None:
        """The cost model's prediction for the warm call made since `snapshot` (None: this
        contender has no cost model)."""
        return None


# --------------------------------------------------------------------------- torch steps

def _differentiable(outs: list[torch.Tensor]) -> list[torch.Tensor]:
    return [o for o in outs if o.requires_grad]


def _materialise(grads: tuple[torch.Tensor | None, ...], targets: list[torch.Tensor]) -> list[torch.Tensor]:
    # an unused target gets an explicit zero gradient, so every contender returns the same list
    return [torch.zeros_like(t) if g is None else g for g, t in zip(grads, targets)]


def make_cotangents(w: Workload, outs: list[torch.Tensor], seed: int = 1234) -> list[torch.Tensor]:
    """One cotangent per differentiable output: ones for a scalar (a loss), else seeded
    normal numbers; made once from eager's outputs and shared by every contender."""
    gen = torch.Generator().manual_seed(seed)
    cots = []
    for o in _differentiable(outs):
        if o.numel() == 1:
            cots.append(torch.ones_like(o))
        else:
            cots.append(torch.randn(o.shape, generator=gen, dtype=torch.float32).to(o.device, o.dtype))
    return cots


def build_step(w: Workload, fn: Callable[..., Any]) -> tuple[Callable[[], list[torch.Tensor]], bool]:
    """The step a torch contender times for `w.mode`, and whether it may be graph-captured.
    Results are outputs (detached) followed by one gradient per grad target."""
    inputs = w.inputs
    if w.mode == "fwd":
        def fwd() -> list[torch.Tensor]:
            with torch.no_grad():
                return [t.detach() for t in flat_tensors(fn(*inputs))]
        return fwd, True

    def grads_of(outs: list[torch.Tensor], retain: bool, targets=None) -> list[torch.Tensor]:
        targets = w.grad_targets if targets is None else targets
        diff = _differentiable(outs)
        cots = w.cotangents or []
        if len(diff) != len(cots):
            raise RuntimeError(f"{len(diff)} differentiable outputs, eager had {len(cots)}")
        g = torch.autograd.grad(diff, targets, cots, retain_graph=retain, allow_unused=True)
        return _materialise(g, targets)

    if w.mode == "fwdbwd":
        def fwdbwd() -> list[torch.Tensor]:
            with torch.enable_grad():
                outs = flat_tensors(fn(*inputs))
                return [o.detach() for o in outs] + grads_of(outs, retain=False)
        return fwdbwd, False

    held: dict[str, Any] = {}
    on_cuda = any(isinstance(t, torch.Tensor) and t.is_cuda for t in inputs)

    def bwd() -> list[torch.Tensor]:
        # the forward runs once (in the cold call); every later call is the backward only.
        # Autograd runs backward ops on the stream their forward ran on: called from another
        # stream (a CUDA-graph capture's), the forward is re-run there first, once
        stream = torch.cuda.current_stream() if on_cuda else None
        with torch.enable_grad():
            if "outs" not in held or held["stream"] != stream:
                args, targets = list(inputs), list(w.grad_targets)
                if held:
                    # on another stream, leaf inputs are made afresh: a leaf's gradient node
                    # keeps the stream of the forward that first used it, and autograd then
                    # syncs the capturing stream with that one (the H200 saw eager's capture
                    # of a backward row invalidated, "AccumulateGrad" stream mismatch)
                    fresh = {id(t): t.detach().requires_grad_() for t in inputs
                             if isinstance(t, torch.Tensor) and t.requires_grad and t.is_leaf}
                    args = [fresh.get(id(t), t) for t in inputs]
                    targets = [fresh.get(id(t), t) for t in w.grad_targets]
                held.update(outs=flat_tensors(fn(*args)), stream=stream, targets=targets)
            outs = held["outs"]
            return [o.detach() for o in outs] + grads_of(outs, retain=True, targets=held["targets"])
    return bwd, False


class TorchContender(Contender):
    """A contender that is `compile(fn)` for some torch compile function."""

    def compile(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        return fn

    def review(self, caught: list[warnings.WarningMessage]) -> tuple[list[str], list[str]]:
        """(problems, notes) from the warnings of the cold call: a problem makes the
        result FAILED even when the numbers are right."""
        return [], []

    def prepare(self, w: Workload, ctx: RunContext) -> Prepared:
        # a fresh Dynamo per contender: cases share code objects (and would hit the
        # recompile limit or become dynamic-shaped), and no backend may reuse another's cache
        torch._dynamo.reset()
        torch.manual_seed(0)
        step, graphable = build_step(w, self.compile(w.fn))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            first, cold = wall_call(step, ctx.device)
        problems, notes = self.review(caught)
        return Prepared(step, first, cold, problems=problems, notes=notes, allow_graph=graphable)


class Eager(TorchContender):
    name = "eager"


class Inductor(TorchContender):
    name = "inductor"
    mode: str | None = None

    def skip_reason(self, w: Workload, ctx: RunContext) -> tuple[str, str] | None:
        if w.suite in ctx.inductor_skip_suites:
            return ("skipped", f"--quick on CPU: Inductor's C++ compile of the {w.suite} graphs takes "
                               "~30-90 s each on 2 cores (and CPU timings are not meaningful); run without "
                               "--quick to include it")
        return None

    def compile(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        return torch.compile(fn, mode=self.mode) if self.mode else torch.compile(fn)


class InductorMaxAutotune(Inductor):
    name = "max-autotune"
    mode = "max-autotune"

    def skip_reason(self, w: Workload, ctx: RunContext) -> tuple[str, str] | None:
        if ctx.quick:
            return ("skipped", "--quick: max-autotune benchmarks many kernel variants per op (minutes)")
        if ctx.device.type != "cuda":
            return ("skipped", "CPU: max-autotune tunes GPU kernels; too slow here and not meaningful")
        return super().skip_reason(w, ctx)


class InductorReduceOverhead(Inductor):
    """`torch.compile(mode="reduce-overhead")`: Inductor with its CUDA graphs, the
    baseline for stitchml's CUDA-graph mode (models suite; the micro suite replays every
    contender from a graph already)."""

    name = "inductor-ro"
    mode = "reduce-overhead"

    def skip_reason(self, w: Workload, ctx: RunContext) -> tuple[str, str] | None:
        if ctx.device.type != "cuda":
            return ("skipped", "CPU: reduce-overhead is Inductor's CUDA-graph mode")
        if w.suite != "models":
            return ("skipped", "micro/simulator rows are replayed from a CUDA graph for every contender already")
        return super().skip_reason(w, ctx)


class Stitch(TorchContender):
    """stitchml with its configured defaults (CUDA-graph mode as `cuda_graphs` says),
    except in the micro suite, where the harness captures every contender's step in a
    CUDA graph itself and stitch's own graphs (a capture inside a capture) are off."""

    name = "stitchml"
    cuda_graphs: bool | None = None      # None: the knob's value
    knobs: dict[str, Any] = {}           # other knobs this contender compiles and runs under

    def _graphs(self, w: Workload) -> bool | None:
        return False if w.suite == "micro" else self.cuda_graphs

    def prepare(self, w: Workload, ctx: RunContext) -> Prepared:
        from .. import config
        graphs = self._graphs(w)
        knobs = {**self.knobs, **({} if graphs is None else {"cuda_graphs": graphs})}
        if not knobs:
            return super().prepare(w, ctx)
        with config.override(**knobs):
            p = super().prepare(w, ctx)
        inner = p.step

        def step() -> Any:
            # the knob may be read per call by the runtime, not only at compile time
            with config.override(**knobs):
                return inner()
        p.step = step
        p.notes.append("stitchml " + ", ".join(f"{k}={v}" for k, v in knobs.items()))
        return p

    def compile(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        from ..capture.backend import StitchBackend
        self.backend = StitchBackend()
        return torch.compile(fn, backend=self.backend)

    def review(self, caught: list[warnings.WarningMessage]) -> tuple[list[str], list[str]]:
        """Problems: a graph that ran wholly eagerly ("stitchml: ... graph runs eagerly",
        or recorded so), no graph at all.  Other stitchml warnings become notes."""
        said = [str(c.message).splitlines()[0] for c in caught if "stitchml" in str(c.message)]
        problems = [f"warning: {m}" for m in said if "runs eagerly" in m]
        notes = [f"warning: {m}" for m in said if "runs eagerly" not in m]
        for rec in self.backend.records:
            if rec.eager_reason is not None and not any(rec.eager_reason[:60] in p for p in problems):
                problems.append(f"{rec.kind} graph ran eagerly: {rec.eager_reason.splitlines()[0]}")
        if not self.backend.records:
            problems.append("no graph reached the stitch backend")
        return problems, notes

    def launch_snapshot(self) -> Any:
        return [r.calls for r in self.backend.records]

    def launches(self, snapshot: Any, p: Prepared, ctx: RunContext) -> tuple[int | None, str, int | None]:
        """Kernels per call from the plans of the graphs that the warm call ran."""
        from ..plan.data import EagerStep
        kernels = eager_ops = 0
        for r, before in zip(self.backend.records, snapshot):
            calls = r.calls - before
            if calls and r.plan is not None and r.eager_reason is None:
                kernels += calls * r.plan.num_kernels
                eager_ops += calls * sum(isinstance(s, EagerStep) for s in r.plan.steps)
        return kernels, "stitchml plan (GPU launches; the interpreter runs global groups phase-split)", eager_ops

    def prediction(self, snapshot: Any) -> dict[str, Any] | None:
        return predict_call(self.backend.records, snapshot)


# --------------------------------------------------------------------------- checked predictions (issue 17.4)

STITCH_KERNEL_NAME = re.compile(r"^k_[0-9a-f]{24}$")
# library prices by kind (`plan/library_cost.py`) as the profiler's kernel names can be
# told apart: our chunked linear cross-entropy runs cuBLAS products and one Triton row
# kernel, counted with the products
LIBRARY_KIND = {"linear_ce": "gemm"}


def library_kind(name: str) -> str | None:
    """The library kind of a profiler kernel name: gemm (cuBLAS's nvjet/CUTLASS kernels,
    split-K reductions, our Triton GEMM and linear cross-entropy row kernels),
    attention (flash, memory-efficient and cuDNN kernels), conv, or memory (other ATen
    kernels); None for stitched kernels, copies and memsets (CUDA-graph plumbing)."""
    n = name.lower()
    if STITCH_KERNEL_NAME.match(name) or n.startswith(("memcpy", "memset")):
        return None
    if any(t in n for t in ("sdpa", "fmha", "flash", "cudnn::fusion", "attention")):
        return "attention"
    if any(t in n for t in ("conv", "implicit_gemm", "winograd", "dgrad", "wgrad")):
        return "conv"
    if any(t in n for t in ("gemm", "nvjet", "cutlass", "splitk", "cublas")) or n.startswith(("_ce_rows", "_gemm_ep")):
        return "gemm"
    return "memory"


def triton_function_name(text: str) -> str:
    """The name a generated kernel runs under, which the profiler shows:
    `runtime/kernel_cache.load_kernels` loads every kernel text as `k_<hash of the text
    with its own name blanked>`, so kernels equal up to their name share one function
    (and one profiler name).  tests/test_bench_predictions.py checks this against
    `load_kernels` itself."""
    from ..runtime.kernel_cache import _body_key
    return "k_" + _body_key(text)[0][:24]


def _profiler_names(ks: Any) -> list[str]:
    """Names the kernel may run under: its text as generated and, where seeds are read
    from device memory (a graph that may be CUDA-graph captured), that variant's."""
    from ..runtime.cuda_graphs import device_seed_source
    names = [triton_function_name(ks.source)]
    seeded = triton_function_name(device_seed_source(ks).source)
    return names + ([seeded] if seeded != names[0] else [])


def predict_call(records: list[Any], snapshot: list[int]) -> dict[str, Any]:
    """What the cost model predicts for one call of a stitch-compiled step: the sum,
    over the graphs the call ran (forward and backward for a training step), of
    calls x `plan.predicted_s`, and per launched kernel (a launch group counts once, as
    its composite kernel) its class (the mapping form, or the group's kind), its
    prediction with and without the launch term, and the names it runs under.
    Eager ops between kernels (library calls: matrix products, attention, ...) are
    priced by `plan/library_cost.py` and summed per kind into one entry each (class
    `library:<kind>`, matched to the profiler's library kernels by name); graphs that
    ran eagerly, and ops the library model cannot price, are listed in `unpriced`."""
    from ..plan.devices import current_device, describe_source
    from ..plan.library_cost import plan_library
    dev = current_device()
    total, graphs, unpriced, kernels = 0.0, [], [], []
    for i, r in enumerate(records):
        calls = r.calls - (snapshot[i] if i < len(snapshot) else 0)
        if not calls:
            continue
        if r.plan is None or r.eager_reason is not None:
            unpriced.append(f"{r.kind} graph runs eagerly ({(r.eager_reason or '?').splitlines()[0][:120]})")
            continue
        plan = r.plan
        prices = plan_library(plan, dev)
        library_s = sum(p.seconds for p in prices)
        total += calls * (plan.predicted_s + library_s)
        launch = plan.launch_s or dev.launch_s
        graphs.append({"graph": r.kind, "calls": calls, "predicted_s": plan.predicted_s + library_s,
                       "stitched_s": plan.predicted_s, "library_s": library_s,
                       "kernels": plan.num_kernels, "eager_ops": len(prices), "launch_s": launch})
        lost = [p.op for p in prices if p.kind == "unpriced"]
        if lost:
            unpriced.append(f"{r.kind}: {len(lost)} eager op(s) with no price ({', '.join(sorted(set(lost))[:6])}) "
                            f"x {calls}")
        by_kind: dict[str, list[float]] = {}
        for p in prices:
            if p.kind not in ("unpriced", "view"):
                by_kind.setdefault(LIBRARY_KIND.get(p.kind, p.kind), []).append(p.seconds)
        for kind, secs in sorted(by_kind.items()):
            # the profiler's durations hold no launch gap: the device figure leaves it out
            kernels.append({"graph": r.kind, "kernel": f"library:{kind}", "class": f"library:{kind}",
                            "launches": calls * len(secs), "predicted_s": calls * sum(secs),
                            "predicted_device_s": calls * sum(max(x - dev.graph_launch_s, 0.0) for x in secs),
                            "names": [], "note": "", "library": kind})
        grouped = {m for g in plan.groups for m in g.members}
        units = [(k.name, k.mapping.form, k.predicted_s) for k in plan.kernels if k.name not in grouped]
        units += [(g.name, g.kind, g.predicted_s) for g in plan.groups]
        for name, cls, pred in units:
            ks = r.kernels.get(name)
            if r.dynamic is not None or ks is None:
                names, note = [], ("dynamic-shape graph: its kernels run as size templates, not matched"
                                   if r.dynamic is not None else "no kernel source kept: name unknown")
            else:
                names, note = _profiler_names(ks), ""
            kernels.append({"graph": r.kind, "kernel": name, "class": cls, "launches": calls,
                            "predicted_s": calls * pred,
                            "predicted_device_s": calls * max(pred - launch, 0.0),
                            "names": names, "note": note, "launch_s": launch})
    return {"predicted_s": total if graphs else None, "device": dev.name, "figures": describe_source(dev),
            "launch_s": dev.launch_s, "graphs": graphs, "unpriced": unpriced, "kernels": kernels}


def as_replayed(prediction: dict[str, Any], kernels: list[dict[str, Any]]) -> None:
    """Re-price a prediction whose plans priced each launch at the host launch path for a
    measurement replayed from a CUDA graph (the micro rows: the harness captures the whole
    call, so a stitched launch costs the replay's gap between kernels, not `launch_s`).
    H200, 2026-11-30: the BERT-base AdamW step's 27 launches at 9.1 us made its prediction
    713.6 us against 431.3 measured.  In place; the library calls are priced at the gap
    already (`plan/library_cost.py`)."""
    from ..plan.devices import current_device
    gap = current_device().graph_launch_s
    for k in kernels:
        extra = k.get("launch_s", 0.0) - gap
        if extra > 0:
            k["predicted_s"] -= k["launches"] * extra
            k["launch_s"] = gap
    total = 0.0
    for g in prediction.get("graphs", []):
        extra = g.get("launch_s", 0.0) - gap
        if extra > 0:   # (a call of the graph launches each of its `kernels` once)
            g["stitched_s"] -= g["kernels"] * extra
            g["predicted_s"] -= g["kernels"] * extra
            g["launch_s"] = gap
        total += g["calls"] * g["predicted_s"]
    if prediction.get("graphs"):
        prediction["predicted_s"] = total
    prediction["launch_s"] = gap
    prediction["replayed"] = True


def _kernel_row(name: str | None, ks: list[dict[str, Any]], note: str) -> dict[str, Any]:
    classes = sorted({k["class"] for k in ks})
    return {"profiler_name": name, "class": classes[0] if len(classes) == 1 else "mixed:" + "+".join(classes),
            "kernels": [f"{k['graph']}:{k['kernel']}" for k in ks], "launches": sum(k["launches"] for k in ks),
            "predicted_s": sum(k["predicted_s"] for k in ks),
            "predicted_device_s": sum(k["predicted_device_s"] for k in ks),
            "measured_s": None, "measured_launches": None, "error_pct": None, "device_error_pct": None, "note": note}


def match_kernels(kernels: list[dict[str, Any]], measured: dict[str, tuple[float, int]] | None) -> dict[str, Any]:
    """Per-kernel predicted against measured device time.  `kernels`: `predict_call`'s
    entries; `measured`: {profiler name: (seconds per step, launches per step)}, or None
    without a GPU.  Kernels that run under one name (equal up to their name: the same
    layer's kernel in every layer) are one row, their predictions summed.  A row's
    `error_pct` = 100 (predicted - measured) / measured (signed; `device_error_pct`
    without the launch term, which the profiler's kernel durations do not contain).
    Profiler names of stitchml's form that no planned kernel has, and the rest (library
    kernels, memsets, copies), are reported apart."""
    if measured is None:
        rows = [_kernel_row(k["names"][0] if k["names"] else None, [k], k["note"] or "no GPU: not measured")
                for k in kernels]
        return {"measured": False, "note": "no GPU: not measured", "rows": rows, "unmatched": [], "other": None}
    groups: dict[str, list[dict[str, Any]]] = {}
    rows = []
    library: dict[str, list[dict[str, Any]]] = {}
    for k in kernels:
        if k.get("library"):
            library.setdefault(k["library"], []).append(k)
            continue
        name = next((n for n in k["names"] if n in measured), None)
        if name is not None:
            groups.setdefault(name, []).append(k)
            continue
        tried = ", ".join(k["names"])
        rows.append(_kernel_row(None, [k], k["note"] or f"no profiler kernel named {tried}: cannot match"))
    for name, ks in groups.items():
        row = _kernel_row(name, ks, "")
        secs, launches = measured[name]
        row.update(measured_s=secs, measured_launches=launches)
        if secs > 0:
            row["error_pct"] = 100.0 * (row["predicted_s"] - secs) / secs
            row["device_error_pct"] = 100.0 * (row["predicted_device_s"] - secs) / secs
        if launches != row["launches"]:
            row["note"] = (f"profiler saw {launches} launch(es) per step, the plans {row['launches']} (the time is "
                           "all of them)")
        rows.append(row)
    matched = {r["profiler_name"] for r in rows if r["profiler_name"]}
    unmatched = [{"profiler_name": n, "measured_s": s, "launches": c,
                  "note": "named like a stitchml kernel but no kernel the call ran has this name"}
                 for n, (s, c) in sorted(measured.items()) if n not in matched and STITCH_KERNEL_NAME.match(n)]
    rest = {n: v for n, v in measured.items() if n not in matched and not STITCH_KERNEL_NAME.match(n)}
    seen: dict[str, list[tuple[float, int]]] = {}
    for n, v in rest.items():
        kind = library_kind(n)
        if kind is not None:
            seen.setdefault(kind, []).append(v)
    for kind, ks in sorted(library.items()):
        row = _kernel_row(f"library:{kind}", ks, "")
        got = seen.get(kind)
        if got:
            secs = sum(x for x, _ in got)
            row.update(measured_s=secs, measured_launches=sum(c for _, c in got))
            if secs > 0:
                row["error_pct"] = 100.0 * (row["predicted_s"] - secs) / secs
                row["device_error_pct"] = 100.0 * (row["predicted_device_s"] - secs) / secs
        else:
            row["note"] = "no profiler kernel of this kind"
        rows.append(row)
    # library kernels of a kind no priced op has (kernels an eager graph or the runtime ran)
    unpredicted = {kind: sum(x for x, _ in got) for kind, got in seen.items() if kind not in library}
    top = sorted(rest.items(), key=lambda kv: -kv[1][0])[:8]
    other = {"seconds": sum(s for s, _ in rest.values()), "launches": sum(c for _, c in rest.values()),
             "top": [{"name": n[:120], "seconds": s, "launches": c} for n, (s, c) in top]}
    return {"measured": True, "note": "", "rows": rows, "unmatched": unmatched, "other": other,
            "library_unpredicted": unpredicted}


# --------------------------------------------------------------------------- JAX

def _import_jax() -> Any:
    # JAX grabs 75% of GPU memory at start-up unless told not to; torch shares the device
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import jax
    return jax


class Jax(Contender):
    """`jax.jit` of the case's JAX version, on the same input values (copied from the
    torch tensors).  Timed on the host around `block_until_ready`."""

    name = "jax"

    def skip_reason(self, w: Workload, ctx: RunContext) -> tuple[str, str] | None:
        if w.jax is None:
            return ("n/a", "no JAX version of this case")
        try:
            _import_jax()
        except Exception as e:
            return ("unavailable", f"jax is not importable ({type(e).__name__}: {e})")
        return None

    def prepare(self, w: Workload, ctx: RunContext) -> Prepared:
        jax = _import_jax()
        import jax.numpy as jnp
        import numpy as np
        assert w.jax is not None
        platform = "gpu" if ctx.device.type == "cuda" else "cpu"
        dev = jax.devices(platform)[0]

        def to_jax(t: torch.Tensor) -> Any:
            host = t.detach().cpu()
            if host.dtype == torch.bfloat16:
                return jax.device_put(jnp.asarray(host.float().numpy(), dtype=jnp.bfloat16), dev)
            return jax.device_put(jnp.asarray(host.numpy()), dev)

        def to_torch(a: Any, like: torch.Tensor) -> torch.Tensor:
            arr = np.asarray(a.astype(jnp.float32) if a.dtype == jnp.bfloat16 else a)
            return torch.from_numpy(arr.copy()).to(device=like.device, dtype=like.dtype)

        tensors = [x for x in w.inputs if isinstance(x, torch.Tensor)]
        arrays = [to_jax(t) for t in tensors]
        f = w.jax.build(jax)
        key = jax.random.PRNGKey(0)
        argnums = w.jax.argnums

        if w.mode == "fwd":
            jf = jax.jit(f)

            def run() -> Any:
                return jax.block_until_ready(jf(key, *arrays))
        else:
            cots = [to_jax(c) for c in (w.cotangents or [])]

            def fwd_and_vjp(key: Any, cots: list[Any], *arrs: Any) -> Any:
                def of_diff(*diff: Any) -> Any:
                    full = list(arrs)
                    for i, a in zip(argnums, diff):
                        full[i] = a
                    return f(key, *full)
                out, vjp = jax.vjp(of_diff, *[arrs[i] for i in argnums])
                ct = tuple(cots) if isinstance(out, (tuple, list)) else cots[0]
                return out, vjp(ct)
            jf = jax.jit(fwd_and_vjp)

            def run() -> Any:
                return jax.block_until_ready(jf(key, cots, *arrays))

        def as_tensors(res: Any) -> list[torch.Tensor]:
            leaves = jax.tree_util.tree_leaves(res)
            like = w.inputs[0] if isinstance(w.inputs[0], torch.Tensor) else torch.empty(0)
            dtype_of = {jnp.dtype(jnp.bfloat16): torch.bfloat16, jnp.dtype(jnp.float32): torch.float32,
                        jnp.dtype(jnp.bool_): torch.bool, jnp.dtype(jnp.int32): torch.int32}
            return [to_torch(a, torch.empty(0, dtype=dtype_of.get(a.dtype, torch.float32), device=like.device))
                    for a in leaves]

        t0 = time.perf_counter()
        first = run()
        cold = time.perf_counter() - t0
        notes = ["host wall clock around block_until_ready: includes dispatch overhead"]
        if w.mode == "bwd":
            notes.append("bwd timed as jit(vjp): includes the forward it differentiates")
        if w.jax.note:
            notes.append(w.jax.note)
        return Prepared(run, as_tensors(first), cold, as_tensors=as_tensors, timer="host", notes=notes,
                        allow_graph=False)


class StitchNoGraphs(Stitch):
    """stitchml with CUDA graphs off: the issue-12 rows "without CUDA graphs".  Skipped
    where it would be the same run as `stitchml` (knob off, or the micro suite)."""

    name = "stitchml-nograph"
    cuda_graphs = False

    def skip_reason(self, w: Workload, ctx: RunContext) -> tuple[str, str] | None:
        from .. import config
        if w.suite == "micro" or not config.get("cuda_graphs"):
            return ("skipped", "same run as stitchml here (its CUDA-graph mode is off)")
        return None


class StitchPDL(Stitch):
    """stitchml with programmatic dependent launch (knob `pdl=auto`, runtime/pdl.py): its
    A/B against `stitchml` in the same run, on the same inputs.  Skipped where no kernel
    would take it (no CUDA GPU of compute capability 9.0 or more)."""

    name = "stitchml-pdl"
    knobs = {"pdl": "auto"}

    def skip_reason(self, w: Workload, ctx: RunContext) -> tuple[str, str] | None:
        if ctx.device.type != "cuda" or torch.cuda.get_device_capability(ctx.device) < (9, 0):
            return ("skipped", "programmatic dependent launch needs a CUDA GPU of compute capability 9.0 or more")
        return None


def default_contenders() -> list[Contender]:
    return [Eager(), Inductor(), InductorMaxAutotune(), InductorReduceOverhead(), Stitch(), StitchNoGraphs(),
            StitchPDL(), Jax()]


CONTENDER_NAMES = ("eager", "inductor", "max-autotune", "inductor-ro", "stitchml", "stitchml-nograph",
                   "stitchml-pdl", "jax")
STITCH_CONTENDERS = ("stitchml", "stitchml-nograph", "stitchml-pdl")
OPT_IN_CONTENDERS = ("stitchml-pdl",)   # run only when named (`--contender`): a knob's A/B
