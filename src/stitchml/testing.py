"""Compare a compiled function with eager PyTorch: outputs, input gradients, and
input mutations, on the same fresh inputs.  Used by our tests; usable by users."""
from __future__ import annotations

import contextlib
import logging
import math
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import torch

from .capture.backend import StitchBackend

# float64 at a precision only float64 gives: a summation order of our own moves a double
# by tens of ulps, a value that went through float32 by ~1e-7 (1e-7 accepted the float32
# arctangent that `sign` fed in float64 kernels: fuzz, float64 programs)
TOL = {torch.float32: (1e-4, 1e-5), torch.float64: (1e-10, 1e-12), torch.float16: (1e-2, 1e-2),
       torch.bfloat16: (2e-2, 2e-2)}


class _Logged(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@contextlib.contextmanager
def logged_warnings() -> Iterator[list[str]]:
    """The messages stitchml's logger emits at WARNING and above inside the block: each a
    misprediction a run absorbed (an eager op's result converted to the layout the plan
    assumed, a kernel Triton refused at its warps, a graph planned again at its first
    call), which a test or a sweep should count as a failure."""
    handler = _Logged()
    log = logging.getLogger("stitchml")
    log.addHandler(handler)
    try:
        yield handler.messages
    finally:
        log.removeHandler(handler)


@dataclass
class Comparison:
    backend: StitchBackend
    outputs: Any
    expected: Any

    @property
    def launches_per_graph(self) -> list[int]:
        return [r.plan.num_kernels if r.plan is not None else -1 for r in self.backend.records]

    @property
    def num_kernels(self) -> int:
        return sum(r.plan.num_kernels for r in self.backend.records if r.plan is not None)


def _clone(x):
    if isinstance(x, torch.Tensor):
        y = x.detach().clone()
        return y.requires_grad_(x.requires_grad)
    return x


def _flat(out) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _flat(o)]
    if isinstance(out, dict) or hasattr(out, "values"):
        return [t for o in out.values() for t in _flat(o)]
    return []


def assert_close(actual: torch.Tensor, expected: torch.Tensor, what: str, rtol: float | None = None,
                 atol: float | None = None) -> None:
    if expected.dtype.is_floating_point:
        r, a = TOL.get(expected.dtype, (1e-4, 1e-5))
        rtol, atol = rtol or r, atol or a
    torch.testing.assert_close(actual, expected, rtol=rtol or 0, atol=atol or 0, equal_nan=True,
                               msg=lambda m: f"{what}: {m}")


def compare_with_eager(fn: Callable, inputs: Sequence[Any], *, backward: bool = True, rtol: float | None = None,
                       atol: float | None = None, fullgraph: bool = False, grad_rtol: float | None = None,
                       grad_atol: float | None = None) -> Comparison:
    """Run `fn` eagerly and compiled on copies of `inputs`; check outputs, gradients of
    every input that requires grad (for a random cotangent), and mutated inputs.
    `grad_rtol`/`grad_atol` (default: `rtol`/`atol`) loosen gradients alone, e.g. for
    bf16, where eager rounds every backward intermediate and kernels do not."""
    backend = StitchBackend()
    eager_in = [_clone(x) for x in inputs]
    comp_in = [_clone(x) for x in inputs]
    expected = fn(*eager_in)
    actual = torch.compile(fn, backend=backend, fullgraph=fullgraph)(*comp_in)
    exp_t, act_t = _flat(expected), _flat(actual)
    assert len(exp_t) == len(act_t), "different number of outputs"
    for i, (a, e) in enumerate(zip(act_t, exp_t)):
        assert a.shape == e.shape and a.dtype == e.dtype, f"output {i}: {a.shape}/{a.dtype} vs {e.shape}/{e.dtype}"
        assert_close(a, e, f"output {i}", rtol, atol)
    for i, (a, e) in enumerate(zip(comp_in, eager_in)):
        if isinstance(e, torch.Tensor):
            assert_close(a.detach(), e.detach(), f"input {i} after the call (mutation)", rtol, atol)
    if backward and any(isinstance(x, torch.Tensor) and x.requires_grad for x in inputs):
        grads = [torch.randn_like(e) if e.requires_grad and e.dtype.is_floating_point else None for e in exp_t]
        pairs = [(a, e, g) for a, e, g in zip(act_t, exp_t, grads) if g is not None]
        torch.autograd.backward([e for _, e, _ in pairs], [g for _, _, g in pairs])
        torch.autograd.backward([a for a, _, _ in pairs], [g for _, _, g in pairs])
        for i, (a, e) in enumerate(zip(comp_in, eager_in)):
            if isinstance(e, torch.Tensor) and e.requires_grad:
                assert a.grad is not None, f"input {i}: no gradient"
                assert_close(a.grad, e.grad, f"grad of input {i}", grad_rtol or rtol, grad_atol or atol)
    return Comparison(backend, actual, expected)


# --------------------------------------------------------------------------- judging against float64

@dataclass
class JudgedTensor:
    """One tensor's verdict: errors are Frobenius norms of the difference from the
    float64 run, in float64."""

    name: str
    err_actual: float        # ||actual - reference||
    err_eager: float         # ||eager - reference||  (eager's own rounding error)
    allowed: float           # factor * err_eager + floor
    ref_norm: float          # ||reference||
    scale: float             # the group's magnitude (largest reference norm in the group)
    ok: bool
    why: str = ""

    def line(self) -> str:
        rel = self.scale if self.scale > 0 else 1.0
        return (f"{'ok  ' if self.ok else 'FAIL'} {self.name}: err {self.err_actual:.3e} (eager {self.err_eager:.3e}, "
                f"allowed {self.allowed:.3e}; /scale {self.err_actual / rel:.2e}, ref norm {self.ref_norm:.3e})"
                + (f" {self.why}" if self.why else ""))


@dataclass
class Judgement:
    rows: list[JudgedTensor]

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.rows)

    def report(self) -> str:
        return "\n".join(r.line() for r in self.rows)

    def assert_ok(self, what: str = "") -> None:
        assert self.ok, f"{what + ': ' if what else ''}stitch's error exceeds the allowance over eager's:\n" \
                        + "\n".join(r.line() for r in self.rows if not r.ok)


def _unit_roundoff(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).eps / 2 if dtype.is_floating_point else 0.0


def _norm64(t: torch.Tensor) -> float:
    return torch.linalg.vector_norm(t.double()).item() if t.numel() else 0.0


def judge_against_float64(actual: Sequence[torch.Tensor], eager: Sequence[torch.Tensor],
                          reference: Sequence[torch.Tensor], names: Sequence[str] | None = None, *,
                          groups: Sequence[str] | None = None, factor: float = 4.0, rel_floor_ulps: float = 8.0,
                          abs_floor_ulps: float = 8.0) -> Judgement:
    """Judge `actual` (stitch) by its error against a float64 run of the same graph,
    allowing `factor` times eager's own error against that run, plus a floor:

        ||actual - ref||  <=  factor * ||eager - ref||  +  u * (rel_floor_ulps * ||ref|| + abs_floor_ulps * S)

    u is the unit roundoff of the tensor's dtype and S the group's scale: the largest
    ||ref|| among the tensors of its group (`groups[i]`, e.g. "output"/"grad"; default
    one group).  The floor covers an eager result that happens to be exact.  A quantity
    that is zero in exact arithmetic (BERT's key-projection bias gradient) is never
    judged relative to its own norm (noise against noise): its allowance is eager's
    noise times `factor` plus the absolute floor at the group's scale.  Summation-order
    differences (long column sums) are judged the same way: stitch may round
    differently from eager, not much worse.  Non-finite values must sit where the
    reference (or eager) has them, with the same values; where only the reference is
    non-finite (the float64 run lost a value eager kept), stitch is measured from eager."""
    n = len(reference)
    if not (len(actual) == len(eager) == n):
        raise ValueError(f"{len(actual)} actual, {len(eager)} eager, {n} reference tensors")
    names = list(names) if names is not None else [f"result {i}" for i in range(n)]
    groups = list(groups) if groups is not None else ["all"] * n
    # (over the finite elements: a NaN or inf in the reference is judged by position below)
    ref_norms = [_norm64(r.detach()[torch.isfinite(r.detach())]) if r.dtype.is_floating_point else 0.0
                 for r in reference]
    scale: dict[str, float] = {}
    for g, rn in zip(groups, ref_norms):
        scale[g] = max(scale.get(g, 0.0), rn)
    rows = []
    for name, g, a, e, r, rn in zip(names, groups, actual, eager, reference, ref_norms):
        a, e, r = a.detach().cpu(), e.detach().cpu(), r.detach().cpu()
        s = scale[g]

        def row(ok: bool, ea: float = math.inf, ee: float = 0.0, allowed: float = 0.0, why: str = "") -> JudgedTensor:
            return JudgedTensor(name, ea, ee, allowed, rn, s, ok, why)

        if tuple(a.shape) != tuple(e.shape) or tuple(a.shape) != tuple(r.shape):
            rows.append(row(False, why=f"shape {tuple(a.shape)} vs eager {tuple(e.shape)}, ref {tuple(r.shape)}"))
            continue
        if a.dtype != e.dtype:
            rows.append(row(False, why=f"dtype {a.dtype} != eager's {e.dtype}"))
            continue
        if not a.dtype.is_floating_point:
            bad = (a != e).sum().item()
            rows.append(row(bad == 0, 0.0 if bad == 0 else math.inf, why="" if bad == 0 else f"{bad} elements differ"))
            continue
        a64, e64, r64 = a.double(), e.double(), r.double()
        ref_finite, a_finite = torch.isfinite(r64), torch.isfinite(a64)
        finite = ref_finite & torch.isfinite(e64)
        # where eager overflowed but the reference did not (an intermediate eager keeps in
        # the half type), a finite result of ours is judged by its error like any other
        eager_lost = ref_finite & ~torch.isfinite(e64) & a_finite
        # where the float64 run itself lost the value but eager did not (Longformer's
        # padded positions: a mask arithmetic that is NaN in float64 only), eager stands
        # in for the reference there
        ref_lost = ~ref_finite & torch.isfinite(e64) & a_finite
        # elsewhere, where reference or eager is not finite, stitch must give the same
        # non-finite value as one of them
        same = (a64 == r64) | (a64 == e64) | (a64.isnan() & (r64.isnan() | e64.isnan()))
        odd = ~finite & ~eager_lost & ~ref_lost & ~same
        if (~a_finite & finite).any() or odd.any():
            k = int((~a_finite & finite).sum().item() + odd.sum().item())
            rows.append(row(False, why=f"{k} non-finite or mismatched values where the reference/eager differ"))
            continue
        ea = math.hypot(_norm64((a64 - r64)[finite | eager_lost]), _norm64((a64 - e64)[ref_lost]))
        ee = _norm64((e64 - r64)[finite])
        u = _unit_roundoff(a.dtype)
        allowed = factor * ee + u * (rel_floor_ulps * rn + abs_floor_ulps * s)
        rows.append(row(ea <= allowed, ea, ee, allowed))
    return Judgement(rows)


def judge_against_eager(actual: Sequence[torch.Tensor], eager: Sequence[torch.Tensor],
                        names: Sequence[str] | None = None, *, groups: Sequence[str] | None = None,
                        rel: float = 1e-4, abs_rel: float = 1e-6) -> Judgement:
    """Judge `actual` against eager alone, for a model whose own code cannot run in
    float64 (no reference to measure eager's error by): normwise,

        ||actual - eager||  <=  rel * ||eager||  +  abs_rel * S

    S the group's scale (the largest ||eager|| in its group).  The default rel, 1e-4 in
    float32, is ~1700 ulps normwise: far above what a different summation order gives in
    a small model (~1e-7) and far below a wrong kernel.  Non-finite values must sit where
    eager has them, with the same values.  Weaker than `judge_against_float64`: use it
    only where that cannot run."""
    n = len(eager)
    if len(actual) != n:
        raise ValueError(f"{len(actual)} actual, {n} eager tensors")
    names = list(names) if names is not None else [f"result {i}" for i in range(n)]
    groups = list(groups) if groups is not None else ["all"] * n
    norms = [_norm64(e.detach()[torch.isfinite(e.detach())]) if e.dtype.is_floating_point else 0.0 for e in eager]
    scale: dict[str, float] = {}
    for g, en in zip(groups, norms):
        scale[g] = max(scale.get(g, 0.0), en)
    rows = []
    for name, g, a, e, en in zip(names, groups, actual, eager, norms):
        a, e = a.detach().cpu(), e.detach().cpu()
        s = scale[g]
        if tuple(a.shape) != tuple(e.shape) or a.dtype != e.dtype:
            rows.append(JudgedTensor(name, math.inf, 0.0, 0.0, en, s, False,
                                     f"{tuple(a.shape)} {a.dtype} vs eager's {tuple(e.shape)} {e.dtype}"))
            continue
        if not a.dtype.is_floating_point:
            bad = (a != e).sum().item()
            rows.append(JudgedTensor(name, 0.0 if bad == 0 else math.inf, 0.0, 0.0, en, s, bad == 0,
                                     "" if bad == 0 else f"{bad} elements differ"))
            continue
        a64, e64 = a.double(), e.double()
        finite = torch.isfinite(e64)
        same = (a64 == e64) | (a64.isnan() & e64.isnan())
        if not bool(same[~finite].all()) or not bool(torch.isfinite(a64[finite]).all()):
            k = int((~same & ~finite).sum().item() + (~torch.isfinite(a64) & finite).sum().item())
            rows.append(JudgedTensor(name, math.inf, 0.0, 0.0, en, s, False,
                                     f"{k} non-finite values where eager differs"))
            continue
        err = _norm64((a64 - e64)[finite])
        allowed = rel * en + abs_rel * s
        rows.append(JudgedTensor(name, err, 0.0, allowed, en, s, err <= allowed, "against float32 eager"))
    return Judgement(rows)


def _to64(x: Any) -> Any:
    if isinstance(x, torch.Tensor) and x.dtype.is_floating_point:
        return x.detach().double().requires_grad_(x.requires_grad)
    return _clone(x)


def compare_against_float64(fn: Callable, inputs: Sequence[Any], *, backward: bool = True, factor: float = 4.0,
                            backend: StitchBackend | None = None, seed: int = 0) -> tuple[Comparison, Judgement]:
    """`fn` compiled with stitchml, eagerly in the inputs' dtypes, and eagerly in float64
    on float64 copies of the inputs; outputs and (with `backward`) the gradients of every
    input that requires grad, for one random cotangent, judged by
    `judge_against_float64` (outputs and gradients are separate groups).  Returns the
    comparison (with the backend, for kernel counts) and the judgement; call
    `judgement.assert_ok()` to fail a test."""
    backend = backend or StitchBackend()
    eager_in = [_clone(x) for x in inputs]
    comp_in = [_clone(x) for x in inputs]
    ref_in = [_to64(x) for x in inputs]
    expected = fn(*eager_in)
    reference = fn(*ref_in)
    actual = torch.compile(fn, backend=backend)(*comp_in)
    exp_t, act_t, ref_t = _flat(expected), _flat(actual), _flat(reference)
    if not (len(exp_t) == len(act_t) == len(ref_t)):
        raise AssertionError(f"outputs: {len(act_t)} compiled, {len(exp_t)} eager, {len(ref_t)} float64")
    names = [f"output {i}" for i in range(len(exp_t))]
    groups = ["output"] * len(exp_t)
    acts, eags, refs = list(act_t), list(exp_t), list(ref_t)
    if backward and any(isinstance(x, torch.Tensor) and x.requires_grad for x in inputs):
        gen = torch.Generator().manual_seed(seed)
        cots = [torch.randn(e.shape, generator=gen, dtype=torch.float64).to(e.device)
                if e.requires_grad and e.dtype.is_floating_point else None for e in exp_t]
        for outs in (exp_t, act_t, ref_t):
            pairs = [(o, c.to(o.dtype)) for o, c in zip(outs, cots) if c is not None]
            torch.autograd.backward([o for o, _ in pairs], [c for _, c in pairs])
        for i, (a, e, r) in enumerate(zip(comp_in, eager_in, ref_in)):
            if isinstance(e, torch.Tensor) and e.requires_grad:
                got = [t.grad is not None for t in (a, e, r)]
                if not any(got):   # (an input the function does not use: no gradient anywhere)
                    continue
                assert all(got), f"input {i}: a gradient in {['stitch', 'eager', 'float64'][got.index(True)]} only"
                acts.append(a.grad)
                eags.append(e.grad)
                refs.append(r.grad)
                names.append(f"grad of input {i}")
                groups.append("grad")
    judgement = judge_against_float64(acts, eags, refs, names, groups=groups, factor=factor)
    return Comparison(backend, actual, expected), judgement
