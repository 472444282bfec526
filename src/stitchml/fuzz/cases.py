"""Running one program compiled and eagerly, and the float64-judged verdict."""
from __future__ import annotations

import time
import traceback
import warnings
from dataclasses import dataclass
from typing import Callable, Iterable

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from .. import config
from ..fallback import by_design
from ..testing import logged_warnings
from .programs import _EPS, ATOL_EPS, DEVICE, DTYPES, FP32_DIRECT, FP64_DIRECT, Program, generate

# eager runs on inputs nudged by about an ulp (independent draws), whose spread measures how
# far rounding alone moves a result (`judge`): one draw misses most kinks and ties (a
# minimum's decision at an ulp, a |x| at 0.002 after a normalisation); eight catch the
# known cases (docs/FUZZ.md) at ~8 small eager runs a case
NUDGES = 8
# and eager runs whose every rounding op moves its result by about an ulp (`_RoundingNoise`):
# a kernel keeps float32 between ops where eager rounds each to the half type, so any value
# inside may land an ulp from eager's; where the result is ill-conditioned in such a value
# (a layer norm over values one ulp apart after a clamp, which input nudges cannot move:
# fuzz seed 46636) that ulp is as legitimate as eager's own
NOISY = 4
# a case failing on tolerance or non-finite values alone gets a second look with this many
# more noisy runs and one of precise ops (`_PreciseOps`):
# the maximum of four draws underestimates how far rounding moves a result that is
# ill-conditioned inside (fuzz seed 48541: a layer norm over values 3e-4 apart, rstd ~6600;
# four draws reach 3.4e-5, sixteen 6.6e-5); the cost falls on failing cases only
NOISY_SECOND_LOOK = 28


def make_inputs(prog: Program) -> list[torch.Tensor]:
    """The program's inputs in its dtype, with their layouts (deterministic per seed)."""
    gen = torch.Generator().manual_seed(prog.seed)
    dt = DTYPES[prog.dtype]
    out = []
    for spec in prog.inputs:
        kind, _, arg = spec.layout.partition(":")
        shape = list(spec.shape)
        if kind == "perm":
            p = [int(i) for i in arg.split(",")]
            store = [shape[i] for i in p]
        elif kind in ("step", "offset", "expand"):
            d = int(arg)
            store = list(shape)
            store[d] = shape[d] * 2 if kind == "step" else (shape[d] + 1 if kind == "offset" else 1)
        else:
            store = shape
        base = ((torch.rand(store, generator=gen, dtype=torch.float64) * 2 - 1) * spec.scale).to(DEVICE, dt)
        if kind == "perm":
            t = base.permute([p.index(i) for i in range(len(p))])
        elif kind == "step":
            t = base.narrow(d, 0, shape[d] * 2)[(slice(None),) * d + (slice(None, None, 2),)]
        elif kind == "offset":
            t = base.narrow(d, 1, shape[d])
        elif kind == "expand":
            t = base.expand(shape)
        else:
            t = base
        assert tuple(t.shape) == spec.shape, (spec, t.shape)
        out.append(t.detach().requires_grad_(spec.grad))
    return out


# ops whose result is exact (a selection, a copy, a bound, a sign, a constant): a kernel
# computes the same bits from the same operands, so they round nothing a compiler may differ in
_EXACT_OPS = frozenset("""
    abs neg sign sgn signbit floor ceil round trunc maximum minimum fmax fmin max min amax amin
    clamp clamp_min clamp_max relu hardtanh threshold threshold_backward where masked_fill
    masked_scatter cat stack clone copy _to_copy lift_fresh_copy alias_copy _unsafe_view view_copy
    expand_copy permute_copy index index_select gather take scatter index_put slice_scatter
    select_scatter diagonal_scatter as_strided_scatter constant_pad_nd reflection_pad1d
    reflection_pad2d reflection_pad3d replication_pad1d replication_pad2d replication_pad3d flip
    roll repeat tril triu full full_like zeros zeros_like ones ones_like empty empty_like
    empty_strided new_zeros new_ones new_full new_empty new_empty_strided scalar_tensor arange fill
    sort topk kthvalue median nanmedian mode cummax cummin max_pool2d_with_indices
    max_pool3d_with_indices _unsafe_index embedding one_hot eye diag_embed diag pixel_shuffle
    pixel_unshuffle upsample_nearest1d upsample_nearest2d upsample_nearest3d unfold_copy im2col
""".split())


def _rounds(func) -> bool:
    """Whether an ATen op's floating results are rounded values of its own (not a view,
    not an in-place write, not one of `_EXACT_OPS`)."""
    schema = getattr(func, "_schema", None)
    return not (schema is None or schema.is_mutable or any(r.alias_info is not None for r in schema.returns)
                or func.overloadpacket.__name__ in _EXACT_OPS)


class _RoundingNoise(TorchDispatchMode):
    """Every floating result of an op that rounds (not a view, not an in-place write, not
    in `_EXACT_OPS`) moved by up to an ulp of its dtype, from a seeded draw: how far the
    result moves is how far rounding differently at any step may move it (`NOISY`)."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        self.gen = torch.Generator().manual_seed(seed)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not _rounds(func):
            return out
        if isinstance(out, (tuple, list)):
            return type(out)(self._jitter(t) for t in out)
        return self._jitter(out)

    def _jitter(self, t):
        if not isinstance(t, torch.Tensor) or t.dtype not in _EPS or t.numel() == 0:
            return t
        u = torch.rand(t.shape, generator=self.gen, dtype=torch.float64).to(t.device) * 2 - 1
        moved = (t.double() * (1 + u * _EPS[t.dtype])).to(t.dtype)
        return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device).copy_(moved)


class _PreciseOps(TorchDispatchMode):
    """Eager with every op that rounds computed in float64 from its operands and rounded
    once to its dtype: a legitimate implementation (a kernel keeps float32 inside), whose
    result can differ from eager's by more than an ulp where eager's own op cancels (its
    layer norm of one float16 element is 4e-6, exactly 0 here: a later 0/0 is then NaN
    in eager's own float16 arithmetic, fuzz seed 48975).  An op that cannot run in
    float64 keeps eager's result."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if not _rounds(func) or torch.Tag.nondeterministic_seeded in func.tags:
            return out   # (a random op run twice would draw other numbers and move the generator on)

        def wide(t):
            if isinstance(t, torch.Tensor) and t.dtype in (torch.float16, torch.bfloat16, torch.float32):
                return t.double()
            return type(t)(wide(x) for x in t) if isinstance(t, (list, tuple)) else t
        try:
            precise = func(*wide(args), **{k: wide(v) for k, v in kwargs.items()})
        except Exception:
            return out

        def narrow(t, p):
            if not (isinstance(t, torch.Tensor) and isinstance(p, torch.Tensor) and t.dtype in _EPS
                    and p.shape == t.shape and p.dtype.is_floating_point):
                return t
            return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device).copy_(p.to(t.dtype))
        if isinstance(out, (tuple, list)):
            return type(out)(narrow(t, p) for t, p in zip(out, precise))
        return narrow(out, precise)


def _hi(dt: torch.dtype) -> torch.dtype:
    """The program's HI dtype (its cast islands' type): float32, or float64 itself."""
    return torch.float64 if dt == torch.float64 else torch.float32


def _function(prog: Program, dt: torch.dtype, hi: torch.dtype) -> Callable:
    namespace = {"torch": torch, "F": F, "DT": dt, "HI": hi}
    exec(compile(prog.source(), f"<fuzz seed {prog.seed}>", "exec"), namespace)
    return namespace["program"]


def _forward_backward(fn: Callable, inputs: list[torch.Tensor], cotangents: list | None, backward: bool,
                      written: list[int] = ()):
    """Outputs (then the inputs the program writes, as they are after the call) and
    the gradients."""
    outs = list(fn(*inputs)) + [inputs[k].detach() for k in written]
    grads: list = []
    if backward:
        pairs = [(o, c) for o, c in zip(outs, cotangents) if o.requires_grad]
        wrt = [x for x in inputs if x.requires_grad]
        if pairs and wrt:
            grads = list(torch.autograd.grad([o for o, _ in pairs], wrt, [c for _, c in pairs], allow_unused=True))
    return outs, grads


@dataclass
class Verdict:
    status: str              # pass | skip (no verdict: eager overflow, or an upstream bug) | fail | error (fuzzer bug)
    message: str = ""
    worst: float = 0.0       # largest compiled_err / allowed over the checked tensors
    numeric: bool = False    # a failure by tolerance or by non-finite values (a second look may clear it)


class _ContiguousOperands(TorchDispatchMode):
    """The float64 judge runs every non-view ATen op (backward ops included) on
    contiguous operands: the math does not depend on the layout, and an eager kernel
    that is wrong for one layout must not become the reference (CPU batch norm's
    backward is wrong for some transposed inputs: fuzz seed 3932)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        schema = getattr(func, "_schema", None)
        if schema is None or schema.is_mutable or any(r.alias_info is not None for r in schema.returns):
            return func(*args, **kwargs)

        def dense(t):
            return t.contiguous() if isinstance(t, torch.Tensor) and t.dim() and not t.is_contiguous() else t

        args = tuple(dense(a) if not isinstance(a, (list, tuple)) else type(a)(dense(x) for x in a) for a in args)
        return func(*args, **{k: dense(v) for k, v in kwargs.items()})


def judge(name: str, comp: torch.Tensor | None, low: torch.Tensor | None, ref: torch.Tensor | None,
          program_dtype: torch.dtype | None = None, nudged: list | None = None) -> Verdict:
    """Compare one compiled tensor with eager (same dtype) and the float64 reference.
    An fp32 result of a low-precision program (an fp32 island) inherits the rounding
    of the low-precision values it was computed from: its tolerance floor is at least
    one ulp of the program's dtype (eager's own error can be small by luck there).
    `nudged`: eager's results on inputs nudged by about an ulp, one per nudge (None where a
    nudged run has no such tensor); how far they move counts as eager's error too."""
    if low is None and ref is None and comp is None:
        return Verdict("pass")
    if low is None or ref is None:  # an unused input: eager says None; compiled may give zeros
        low = torch.zeros_like(comp) if low is None else low
        ref = torch.zeros_like(low, dtype=torch.float64) if ref is None else ref
    if comp is None:
        comp = torch.zeros_like(low)
    if comp.shape != low.shape or comp.dtype != low.dtype:
        return Verdict("fail", f"{name}: compiled {tuple(comp.shape)}/{comp.dtype} vs eager "
                               f"{tuple(low.shape)}/{low.dtype}")
    if not (torch.isfinite(low).all() and torch.isfinite(ref).all()):
        return Verdict("skip", f"{name}: eager produced inf/nan")
    c = comp.detach().double()
    if not torch.isfinite(c).all():
        bad = ~torch.isfinite(c)
        for nu in nudged or []:
            # an eager run that rounds otherwise (nudged inputs, noisy or precise ops) is
            # non-finite at every such position too: the value is within eager's reach
            if nu is not None and nu.shape == low.shape and (~torch.isfinite(nu.detach()) | ~bad).all():
                return Verdict("skip", f"{name}: non-finite where eager rounding otherwise is non-finite too")
        return Verdict("fail", f"{name}: {bad.sum().item()} non-finite compiled values where eager is finite",
                       numeric=True)
    ref = ref.detach().double()
    scale = max(ref.abs().max().item() if ref.numel() else 0.0, 1.0)
    eager_err = (low.detach().double() - ref).abs().max().item() if ref.numel() else 0.0
    for nu in nudged or []:
        # sensitivity: eager on inputs nudged by about one ulp.  A result that cancels
        # (the sum of a layer norm's outputs, a gradient through a nearly constant row)
        # amplifies rounding; eager's own error there can be small by luck
        if nu is not None and nu.shape == low.shape and ref.numel() and torch.isfinite(nu).all():
            eager_err = max(eager_err, (nu.detach().double() - low.detach().double()).abs().max().item())
    comp_err = (c - ref).abs().max().item() if ref.numel() else 0.0
    floor = ATOL_EPS * _EPS[low.dtype]
    if program_dtype in _EPS and low.dtype in _EPS:
        floor = max(floor, _EPS[program_dtype])
    allowed = 2 * eager_err + floor * scale
    if comp_err <= allowed:
        return Verdict("pass", worst=comp_err / allowed if allowed else 0.0)
    if low.dtype in (torch.float32, torch.float64):
        direct = (c - low.detach().double()).abs().max().item()
        r, a = FP32_DIRECT if low.dtype == torch.float32 else FP64_DIRECT
        direct_allowed = a * scale + r * ref.abs().max().item()
        if direct <= direct_allowed:
            return Verdict("pass", worst=direct / direct_allowed if direct_allowed else 0.0)
    return Verdict("fail", f"{name}: compiled error {comp_err:.3g} > allowed {allowed:.3g} "
                           f"(eager error {eager_err:.3g}, scale {scale:.3g})", comp_err / allowed, numeric=True)


@dataclass
class CaseResult:
    seed: int
    status: str
    message: str
    description: str
    seconds: float
    num_ops: int = 0
    worst: float = 0.0
    graphs: int = 0

    def line(self) -> str:
        return f"[{self.status.upper()}] {self.message} :: {self.description}"


def check(prog: Program) -> CaseResult:
    """Run one program eagerly (its dtype and float64) and compiled; the verdict."""
    from ..capture.backend import StitchBackend

    t0 = time.perf_counter()
    dt = DTYPES[prog.dtype]
    hi = _hi(dt)

    def result(status: str, message: str, worst: float = 0.0, graphs: int = 0) -> CaseResult:
        return CaseResult(prog.seed, status, message, prog.describe(), time.perf_counter() - t0, prog.num_ops,
                          worst, graphs)

    # eager, in the program's dtype and in float64
    try:
        low_in = make_inputs(prog)
        probe = list(_function(prog, dt, hi)(*low_in))
        gen = torch.Generator().manual_seed(prog.seed + 7)
        cot = [(torch.rand(o.shape, generator=gen, dtype=torch.float64) * 2 - 1).to(DEVICE, o.dtype) for o in probe]
        low_out, low_grads = _forward_backward(_function(prog, dt, hi), make_inputs(prog), cot, prog.backward,
                                               prog.written)
        runs = [_forward_backward(_function(prog, dt, hi), _nudge(make_inputs(prog), prog.seed + 1000 * k),
                                  cot, prog.backward, prog.written) for k in range(NUDGES)]
        runs += _noisy_runs(prog, dt, hi, cot, range(NOISY))
        # per tensor, the nudged (and noisy) runs' results side by side
        nudged_out = [list(t) for t in zip(*(r[0] for r in runs))]
        nudged_grads = [list(t) for t in zip(*(r[1] for r in runs))] if prog.backward else []
        ref_in = [x.detach().double().requires_grad_(x.requires_grad) for x in make_inputs(prog)]
        with _ContiguousOperands():
            ref_out, ref_grads = _forward_backward(_function(prog, torch.float64, torch.float64), ref_in,
                                                   [c.double() for c in cot], prog.backward, prog.written)
    except Exception as e:  # the generator wrote an invalid program
        return result("error", f"eager raised {type(e).__name__}: {str(e).splitlines()[0][:300]}")

    # compiled, with a fresh backend
    torch._dynamo.reset()
    backend = StitchBackend()
    compiled = torch.compile(_function(prog, dt, hi), backend=backend, fullgraph=True, dynamic=prog.dynamic or None)
    with warnings.catch_warnings(record=True) as caught, logged_warnings() as logged, \
            config.override(poison_outputs=True, verbose=False, **prog.knobs):
        warnings.simplefilter("always")
        try:
            comp_out, comp_grads = _forward_backward(compiled, make_inputs(prog), cot, prog.backward,
                                                     prog.written)
        except Exception as e:
            msg = str(e).strip().splitlines()
            return result("fail", f"compiled run raised {type(e).__name__}: {(msg[0] if msg else '')[:300]}",
                          graphs=len(backend.records))
    torch._dynamo.reset()
    whole = [f"{r.kind} graph ran eagerly: {r.eager_reason[:300]}" for r in backend.records if r.eager_reason]
    if whole:
        return result("fail", "; ".join(whole), graphs=len(backend.records))
    # an op left eagerly for a reason other than library work is a gap, not a pass
    left = [f"{r.kind} graph: {f.op} ran eagerly: {f.reason}" for r in backend.records if r.graph is not None
            for f in r.graph.fallbacks if not by_design(f.reason)]
    if left:
        return result("fail", left[0][:300], graphs=len(backend.records))
    if not backend.records:  # (a backward graph may legitimately be absent: views only)
        return result("fail", "no graph was compiled")
    # an exception at a probe size leaves that bucket an exact template, silently (the
    # call itself still runs kernels): a crash inside stitchml all the same
    probe_errors = [f"{r.kind} graph: {e}" for r in backend.records if r.dynamic for e in r.dynamic.probe_errors]
    if probe_errors:
        return result("fail", f"dynamic sizes: the pipeline raised at a probe size: {probe_errors[0][:300]}",
                      graphs=len(backend.records))
    ours = [str(w.message) for w in caught if "stitchml" in str(w.message)] + logged
    if ours:
        return result("fail", f"warning: {ours[0][:300]}", graphs=len(backend.records))

    if len(comp_out) != len(low_out):
        return result("fail", f"{len(comp_out)} outputs vs {len(low_out)}")
    if prog.backward and low_grads and len(comp_grads) != len(low_grads):
        return result("fail", f"{len(comp_grads)} gradients vs {len(low_grads)}")
    verdicts = _verdicts(prog, comp_out, comp_grads, low_out, low_grads, ref_out, ref_grads, nudged_out,
                         nudged_grads)
    fails = [v for v in verdicts if v.status == "fail"]
    if fails and all(v.numeric for v in fails) and NOISY_SECOND_LOOK:
        more = _noisy_runs(prog, dt, hi, cot, range(NOISY, NOISY + NOISY_SECOND_LOOK))
        inputs = make_inputs(prog)   # (outside the mode: it draws them)
        with _PreciseOps():
            more.append(_forward_backward(_function(prog, dt, hi), inputs, cot, prog.backward, prog.written))
        nudged_out = [a + list(b) for a, b in zip(nudged_out, zip(*(r[0] for r in more)))]
        if prog.backward:
            nudged_grads = [a + list(b) for a, b in zip(nudged_grads, zip(*(r[1] for r in more)))]
        verdicts = _verdicts(prog, comp_out, comp_grads, low_out, low_grads, ref_out, ref_grads, nudged_out,
                             nudged_grads)
        fails = [v for v in verdicts if v.status == "fail"]
    worst = max((v.worst for v in verdicts), default=0.0)
    if fails and _upstream_fails_too(prog, fails, cot, low_out, low_grads, ref_out, ref_grads):
        return result("skip", "upstream: PyTorch's own aot_eager backend gives the same wrong result ("
                              + fails[0].message + ")", worst, len(backend.records))
    if fails:
        return result("fail", "; ".join(v.message for v in fails), worst, len(backend.records))
    skips = [v.message for v in verdicts if v.status == "skip"]
    if skips:
        return result("skip", skips[0], worst, len(backend.records))
    return result("pass", "", worst, len(backend.records))


def _noisy_runs(prog: Program, dt: torch.dtype, hi: torch.dtype, cot: list, draws: Iterable[int]) -> list:
    """Eager runs under `_RoundingNoise`, one per draw number (a fixed seed each)."""
    runs = []
    for k in draws:
        # (the inputs drawn inside the mode: their rounding to the program's dtype moves too)
        with _RoundingNoise(prog.seed + 77 * k + 5):
            runs.append(_forward_backward(_function(prog, dt, hi), make_inputs(prog), cot, prog.backward,
                                          prog.written))
    return runs


def _verdicts(prog: Program, comp_out, comp_grads, low_out, low_grads, ref_out, ref_grads,
              nudged_out=None, nudged_grads=None) -> list[Verdict]:
    dt = DTYPES[prog.dtype]
    nudged_out = nudged_out or [None] * len(low_out)
    out = [judge(f"output {i}", c, lo, r, dt, nu)
           for i, (c, lo, r, nu) in enumerate(zip(comp_out, low_out, ref_out, nudged_out))]
    if prog.backward and low_grads:
        names = [s.name for s in prog.inputs if s.grad]
        nudged_grads = nudged_grads or [None] * len(low_grads)
        out += [judge(f"grad {n}", c, lo, r, dt, nu)
                for n, c, lo, r, nu in zip(names, comp_grads, low_grads, ref_grads, nudged_grads)]
    return out


def _nudge(inputs: list[torch.Tensor], seed: int) -> list[torch.Tensor]:
    """Each floating input times (1 + u * eps), u uniform in [-1, 1]: about one ulp."""
    gen = torch.Generator().manual_seed(seed + 11)
    out = []
    for x in inputs:
        if x.dtype in _EPS:
            u = torch.rand(x.shape, generator=gen, dtype=torch.float64).to(x.device) * 2 - 1
            x = (x.detach().double() * (1 + u * _EPS[x.dtype])).to(x.dtype).requires_grad_(x.requires_grad)
        out.append(x)
    return out


def _upstream_fails_too(prog: Program, fails: list[Verdict], cot, low_out, low_grads, ref_out, ref_grads) -> bool:
    """Does the same program through PyTorch's own AOT path (Dynamo + AOTAutograd,
    eager kernels, no stitchml) fail every check we failed?  Then the wrong result is
    PyTorch's, not ours (e.g. the gradient of batch norm over a transposed input)."""
    torch._dynamo.reset()
    try:
        dt = DTYPES[prog.dtype]
        ref_fn = torch.compile(_function(prog, dt, _hi(dt)), backend="aot_eager", fullgraph=True,
                               dynamic=prog.dynamic or None)
        up_out, up_grads = _forward_backward(ref_fn, make_inputs(prog), cot, prog.backward, prog.written)
    except Exception:
        return False
    finally:
        torch._dynamo.reset()
    theirs = {v.message.split(":")[0] for v in _verdicts(prog, up_out, up_grads, low_out, low_grads, ref_out,
                                                            ref_grads) if v.status == "fail"}
    return all(v.message.split(":")[0] in theirs for v in fails)


def run_case(seed: int, profile: str = "ci") -> CaseResult:
    try:
        prog = generate(seed, profile)
    except Exception as e:
        return CaseResult(seed, "error", f"generator raised {type(e).__name__}: {e}", f"seed={seed}", 0.0)
    try:
        return check(prog)
    except Exception as e:  # a crash of the harness itself
        tb = traceback.format_exc().strip().splitlines()[-1]
        return CaseResult(seed, "error", f"harness raised {type(e).__name__}: {e} ({tb})", prog.describe(), 0.0)


def run_many(seeds: Iterable[int], profile: str = "ci") -> list[CaseResult]:
    return [run_case(s, profile) for s in seeds]
