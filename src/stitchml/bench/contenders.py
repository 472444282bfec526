"""The contenders: eager PyTorch, Inductor (`torch.compile` default and
`mode="max-autotune"`), stitchml, and JAX/XLA (`jax.jit`) where JAX is importable.

Every contender turns a `Workload` into a `Prepared` step over the SAME input
tensors: the first (cold) call is made here, timed, and its results kept for the
correctness check that the harness makes before any timing.
"""
from __future__ import annotations

import os
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

    def grads_of(outs: list[torch.Tensor], retain: bool) -> list[torch.Tensor]:
        diff = _differentiable(outs)
        cots = w.cotangents or []
        if len(diff) != len(cots):
            raise RuntimeError(f"{len(diff)} differentiable outputs, eager had {len(cots)}")
        g = torch.autograd.grad(diff, w.grad_targets, cots, retain_graph=retain, allow_unused=True)
        return _materialise(g, w.grad_targets)

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
                held["outs"], held["stream"] = flat_tensors(fn(*inputs)), stream
            outs = held["outs"]
            return [o.detach() for o in outs] + grads_of(outs, retain=True)
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

    def _graphs(self, w: Workload) -> bool | None:
        return False if w.suite == "micro" else self.cuda_graphs

    def prepare(self, w: Workload, ctx: RunContext) -> Prepared:
        from .. import config
        graphs = self._graphs(w)
        if graphs is None:
            return super().prepare(w, ctx)
        with config.override(cuda_graphs=graphs):
            p = super().prepare(w, ctx)
        inner = p.step

        def step() -> Any:
            # the knob may be read per call by the runtime, not only at compile time
            with config.override(cuda_graphs=graphs):
                return inner()
        p.step = step
        p.notes.append(f"stitchml cuda_graphs={graphs}")
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


def default_contenders() -> list[Contender]:
    return [Eager(), Inductor(), InductorMaxAutotune(), InductorReduceOverhead(), Stitch(), StitchNoGraphs(), Jax()]


CONTENDER_NAMES = ("eager", "inductor", "max-autotune", "inductor-ro", "stitchml", "stitchml-nograph", "jax")
STITCH_CONTENDERS = ("stitchml", "stitchml-nograph")
