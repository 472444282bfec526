"""Run PyTorch's whole OpInfo database (`op_db`) through the stitch backend against eager.

Every `op_db` entry (`name` or `name.variant_test_name`), each of its sample inputs
compiled with a fresh `StitchBackend` and a fresh Dynamo state, in nine configurations
(`CONFIGS`): float32 forward and backward (input gradients for a random cotangent),
bfloat16, float16, float64, int64, int32 and bool forward, and the float32 samples made
non-contiguous (forward and backward).  Kernel outputs are poisoned (NaN before the
launch) and `fallback_on_error` is off, so an exception inside stitchml is a *crash*, not
a silent run in eager.  float32/float64 results are compared with eager
(stitchml.testing.TOL), integer and bool ones exactly; half-precision results are judged
against a float64 run of the same sample: no further from it than eager's own
half-precision result (testing.judge_against_float64).

A sample is
* ``pass``  -- results match and every op of its graphs ran in kernels (``kernels``:
  at least one stitched kernel launched; a graph of views only needs none);
* ``eager`` -- results match but some op ran eagerly (the reasons are tallied:
  ``no lowering rule``, a rule's refusal, a library op, ...);
* ``fail``  -- a mismatch with eager (or, in half precision, with float64);
* ``crash`` -- an exception inside stitchml (a frame of stitchml in the traceback);
* ``torch`` -- Dynamo/AOTAutograd raised outside stitchml (not ours, counted apart);
* ``skip``  -- the eager call itself raised, or nothing was compiled (not counted).

Usage (the full run is `make opinfo`; about 35 min on 2 CPU cores under the interpreter)::

    TRITON_INTERPRET=1 python -m stitchml.tools.opinfo_sweep --out docs/OPINFO.md \
        [--samples 12 --half-samples 3] [--ops exp,add | --family linalg] [--jobs 2]
"""
from __future__ import annotations

import argparse
from collections.abc import Callable
import collections
import datetime
import os
import re
import sys
import time
import traceback
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable

os.environ.setdefault("STITCHML_POISON_OUTPUTS", "1")
os.environ.setdefault("STITCHML_FALLBACK_ON_ERROR", "0")  # a crash is a crash, not a fallback

import torch  # noqa: E402
import torch.utils._pytree as pytree  # noqa: E402

from ..fallback import by_design  # noqa: E402

if TYPE_CHECKING:
    from torch.testing._internal.opinfo.core import OpInfo, SampleInput

# ops whose results cannot be compared with eager's (random numbers from eager's
# generator, uninitialised memory): not run
NOT_COMPARABLE = re.compile(r"(dropout|bernoulli|^normal|^rand|multinomial|uniform|exponential|geometric|"
                            r"cauchy|log_normal|empty|rrelu|randint|randn|poisson)")

# The CI slice (tests/test_opinfo.py): one entry per stratum of op families, chosen to
# cover each kind of lowering (element-wise in every dtype, reductions, normalisations,
# views, indexed reads/writes, constructors, complex, the ops added by issue 19).
CI_SLICE = ("add", "exp", "sqrt", "sigmoid", "pow", "where", "clamp", "lgamma", "nan_to_num", "sum", "amax",
            "var_mean", "std", "logsumexp", "softmax", "nn.functional.layer_norm", "nn.functional.normalize",
            "cat", "permute", "diagonal", "diag_embed", "narrow", "index_select", "gather", "masked_fill",
            "full_like", "view_as_complex", "nn.functional.gelu", "aminmax",
            # integer and bool inputs (the int64/int32/bool configurations)
            "gcd", "nn.functional.max_pool2d", "scatter_add", "tril_indices",
            # outputs and as_strided views of layouts with gaps (the non-contiguous configuration)
            "diagonal_scatter", "unfold_copy")
# -- one sample -------------------------------------------------------------------------

@dataclass
class Outcome:
    """What one sample did."""

    status: str                 # pass | eager | fail | crash | torch | skip
    reason: str = ""
    reasons: tuple[str, ...] = ()   # eager: "op: reason" of each op that ran eagerly
    kernels: int = 0            # stitched kernels in the compiled graphs


@dataclass
class Tally:
    """Counts for one op in one configuration."""

    samples: int = 0
    passed: int = 0
    eager: int = 0
    failed: int = 0
    crashed: int = 0
    torch_errors: int = 0
    skipped: int = 0
    with_kernels: int = 0       # pass or eager samples that launched at least one stitched kernel
    first_failure: str = ""
    reasons: collections.Counter = field(default_factory=collections.Counter)

    def add(self, o: Outcome) -> None:
        if o.status == "skip":
            self.skipped += 1
            return
        self.samples += 1
        if o.status in ("pass", "eager") and o.kernels:
            self.with_kernels += 1
        if o.status == "pass":
            self.passed += 1
        elif o.status == "eager":
            self.eager += 1
            self.reasons.update(set(_reason_class(r) for r in o.reasons))
        else:
            if o.status == "crash":
                self.crashed += 1
            elif o.status == "torch":
                self.torch_errors += 1
            else:
                self.failed += 1
            self.first_failure = self.first_failure or f"{o.status}: {o.reason}"

    def merge(self, other: "Tally") -> None:
        for f in ("samples", "passed", "eager", "failed", "crashed", "torch_errors", "skipped", "with_kernels"):
            setattr(self, f, getattr(self, f) + getattr(other, f))
        self.reasons.update(other.reasons)
        self.first_failure = self.first_failure or other.first_failure


def _reason_class(r: str) -> str:
    """'aten.x.default: reason text' -> 'reason text' with numbers and shapes blurred, so
    that the reasons of many ops add up."""
    op, _, text = r.partition(": ")
    if text.startswith("no lowering rule"):
        return f"no lowering rule: {op}"  # the gaps, by op
    r = text if r.startswith(("aten.", "prims.", "whole ")) and text else r
    r = re.sub(r"\(.*?\)", "(…)", r)
    r = re.sub(r"\d+", "N", r)
    return r[:110]


def _tensors(tree: Any) -> list[torch.Tensor]:
    return [x for x in pytree.tree_leaves(tree) if isinstance(x, torch.Tensor)]


def _clone_tree(tree: Any, dtype: torch.dtype | None = None) -> Any:
    """Copies (keeping the sample's layout); `dtype`: floating tensors converted to it.
    A tensor that does not start its storage or is not contiguous (the non-contiguous
    configuration: gaps filled with NaN, at storage offset 1) is copied with its whole
    storage, so an op that reads storage by position (as_strided between elements)
    reads the same values in every copy."""
    def c(x):
        if isinstance(x, torch.Tensor):
            src = x.detach()
            convert = dtype is not None and src.dtype.is_floating_point
            if x.layout == torch.strided and not x.is_conj() and not x.is_neg() and \
                    (not x.is_contiguous() or x.storage_offset()):   # (sparse: no strides)
                flat = src.as_strided((src.untyped_storage().nbytes() // src.element_size(),), (1,), 0)
                flat = flat.to(dtype) if convert else flat.clone()
                y = flat.as_strided(src.shape, src.stride(), src.storage_offset())
            else:
                y = (src.to(dtype) if convert else src).clone()
            return y.requires_grad_(x.requires_grad and y.dtype.is_floating_point)
        return x
    return pytree.tree_map(c, tree)


def _close(actual: Any, expected: Any, what: str, dtype: torch.dtype) -> str:
    """'' when `actual` matches `expected` (shape, dtype, values; NaN positions exactly)."""
    from ..testing import TOL
    a_t, e_t = _tensors(actual), _tensors(expected)
    if len(a_t) != len(e_t):
        return f"{what}: {len(a_t)} tensors vs {len(e_t)}"
    for i, (a, e) in enumerate(zip(a_t, e_t)):
        if a.shape != e.shape or a.dtype != e.dtype:
            return f"{what} {i}: {tuple(a.shape)}/{a.dtype} vs {tuple(e.shape)}/{e.dtype}"
        a, e = a.detach(), e.detach()
        a, e = (t.to_dense() if t.layout != torch.strided else t for t in (a, e))  # (sparse inputs)
        if e.is_complex():
            a, e = torch.view_as_real(a.resolve_conj()), torch.view_as_real(e.resolve_conj())
        if e.dtype.is_floating_point:
            if not torch.equal(torch.isnan(a), torch.isnan(e)):
                return f"{what} {i}: NaN positions differ"
            rtol, atol = TOL.get(e.dtype if e.dtype != torch.float32 else dtype, TOL[torch.float32])
        else:
            rtol = atol = 0
        try:
            torch.testing.assert_close(a, e, rtol=rtol, atol=atol, equal_nan=True)
        except AssertionError as err:
            msg = " ".join(str(err).split())
            return f"{what} {i}: {msg[:300]}"
    return ""


def _arbitrate(bad: str, actual: Any, expected: Any, reference: Callable[[], Any]) -> str:
    """A float32 result outside the tolerance of eager's is judged by a float64 run
    instead: no further from it than eager's own result (`_judge_half`'s rule).  Eager
    can be the inaccurate one: native_layer_norm's backward over one element, where the
    exact input gradient is the mean's cotangent, is off by ~1e-5 in eager, exact in a
    kernel.  '' when it passes, else the original complaint."""
    try:
        ref = reference()
    except Exception:
        return bad
    if ref is None:
        return bad
    return "" if not _judge_half(actual, expected, ref) else bad


def _numpy_reference(opinfo, sample) -> torch.Tensor | None:
    """The OpInfo's own NumPy/SciPy reference (`ref`) on a float64 sample, to judge a float64
    result that is outside the tolerance of eager's: eager's float64 Bessel J/Y and Airy are
    off by up to 8e-7 (absolute) between |x| = 5 and 8, where they use asymptotic forms below
    their range; SciPy's (Cephes) are not.  None when the op has no reference or it fails."""
    ref = getattr(opinfo, "ref", None)
    if ref is None or not isinstance(sample.input, torch.Tensor) or not callable(ref):
        return None
    try:
        out = ref(sample.input.detach().cpu().numpy(), *sample.args, **sample.kwargs)
        return torch.as_tensor(out, dtype=torch.float64)
    except Exception:
        return None


def _grads64(fn: Callable, post: Callable, tensors: list, cots: list) -> list:
    """The input gradients of a float64 run with the same cotangents."""
    ins = [_clone_tree(t, torch.float64) for t in tensors]
    outs = [o for o in _tensors(post(fn(*ins))) if o.requires_grad and o.dtype.is_floating_point]
    leaves = [t for t in ins if isinstance(t, torch.Tensor) and t.requires_grad]
    return list(torch.autograd.grad(outs, leaves, [c.double() for c in cots], allow_unused=True))


def _judge_half(actual: Any, expected: Any, reference: Any) -> str:
    """Half precision: float outputs no further from the float64 run than eager's own
    (testing.judge_against_float64); other outputs equal to eager's."""
    from ..testing import judge_against_float64
    def real(ts):  # complex results judged by their real and imaginary parts
        out = []
        for t in ts:
            if t.layout != torch.strided:  # (sparse results: compared dense)
                t = t.to_dense()
            if t.is_complex():
                t = torch.view_as_real(t.detach().resolve_conj())
                t = t.float() if t.dtype == torch.float16 else t
            out.append(t)
        return out
    a_t, e_t, r_t = real(_tensors(actual)), real(_tensors(expected)), real(_tensors(reference))
    if not (len(a_t) == len(e_t) == len(r_t)):
        return f"output: {len(a_t)} tensors vs {len(e_t)}"
    fa, fe, fr = [], [], []
    for i, (a, e, r) in enumerate(zip(a_t, e_t, r_t)):
        if a.shape != e.shape or a.dtype != e.dtype:
            return f"output {i}: {tuple(a.shape)}/{a.dtype} vs {tuple(e.shape)}/{e.dtype}"
        if e.dtype.is_floating_point and r.dtype.is_floating_point and r.shape == e.shape:
            fa.append(a.detach())
            fe.append(e.detach())
            fr.append(r.detach().to(torch.float64))
        elif not torch.equal(a.detach(), e.detach()):
            if not (e.dtype.is_floating_point or e.is_complex()):
                # integer/bool outputs of a half-precision op (argmax, comparisons) may
                # legitimately differ where eager rounded an intermediate: judged as floats
                fa.append(a.detach().double())
                fe.append(e.detach().double())
                fr.append(r.detach().double() if not r.is_complex() else e.detach().double())
                continue
            return f"output {i}: differs from eager"
    if not fa:
        return ""
    j = judge_against_float64(fa, fe, fr)
    return "" if j.ok else "further from float64 than eager: " + " ".join(
        r.line() for r in j.rows if not r.ok)[:300]


def _fallback_summary(records) -> list[str]:
    """Eager ops of the compiled graphs ('op: reason')."""
    out = []
    for r in records:
        if r.plan is None:
            out.append(f"whole {r.kind} graph: {r.eager_reason}")
            continue
        out.extend(f"{f.op}: {f.reason}" for f in r.graph.fallbacks)
    return out


def _make_fn(op: Callable, sample) -> tuple[Callable, list[torch.Tensor]]:
    """A function of the sample's tensors only (non-tensor arguments are baked in), so
    every tensor is a graph input."""
    leaves, spec = pytree.tree_flatten((sample.input, sample.args, sample.kwargs))
    pos = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]
    tensors = [leaves[i] for i in pos]

    def fn(*ts):
        vals = list(leaves)
        for i, t in zip(pos, ts):
            vals[i] = t
        inp, args, kwargs = pytree.tree_unflatten(vals, spec)
        return op(inp, *args, **kwargs)
    return fn, tensors


def _ours(e: BaseException) -> bool:
    """Whether an exception was raised inside stitchml (a stitchml frame, other than
    this sweep's, in the exception or its causes), not by Dynamo/AOTAutograd."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        for fr in traceback.extract_tb(e.__traceback__):
            f = fr.filename.replace("\\", "/")
            if ("/stitchml/" in f or f.startswith("<stitchml")) and not f.endswith("opinfo_sweep.py"):
                return True
        e = e.__cause__ or e.__context__
    return False


def run_sample(opinfo: OpInfo, sample: SampleInput, dtype: torch.dtype, backward: bool) -> Outcome:
    """Compile `opinfo.op` on one sample with a fresh backend; compare with eager.  A
    sample that matched while stitchml logged a warning (a misprediction the run absorbed)
    fails with that warning."""
    from ..testing import logged_warnings
    with logged_warnings() as logged:
        out = _run_sample(opinfo, sample, dtype, backward)
    ours = [w for w in logged if not _UPSTREAM_FFT_LAYOUT.search(w)]
    if ours and out.status in ("pass", "eager"):
        return Outcome("fail", f"stitchml warned: {ours[0][:280]}")
    if logged and out.status in ("pass", "eager"):   # (an FFT's CPU layout only: the result matched)
        reason = ("upstream: torch's meta lays out an FFT's result as cuFFT does, its CPU kernel otherwise "
                  "(converted and logged)")
        return Outcome("eager", reason, tuple(sorted(set(out.reasons) | {reason})), out.kernels)
    return out


# torch's meta functions lay FFT results out as cuFFT does; the CPU kernels (pocketfft)
# often otherwise (hfft2 of [5, 6, 7] over dims (0, -1): meta (12, 60, 1), CPU (72, 12,
# 1)), so the wrapper's check of a library op's layout converts it and logs: a CPU-only
# gap between torch's meta and its kernel, not a misprediction of ours
_UPSTREAM_FFT_LAYOUT = re.compile(r"eager op aten\._fft_\w+\.default returned strides .* \(plan: ")


def _run_sample(opinfo: OpInfo, sample: SampleInput, dtype: torch.dtype, backward: bool) -> Outcome:
    from ..capture.backend import StitchBackend
    fn, tensors = _make_fn(opinfo.op, sample)
    post = sample.output_process_fn_grad if backward else (lambda x: x)
    eager_in = [_clone_tree(t) for t in tensors]
    comp_in = [_clone_tree(t) for t in tensors]
    try:
        expected = post(fn(*eager_in))
    except Exception as e:  # the sample is not valid for eager: not counted
        return Outcome("skip", f"eager raised {type(e).__name__}")
    if backward:
        exp_out = [e for e in _tensors(expected) if e.requires_grad and e.dtype.is_floating_point]
        if not exp_out or not any(t.requires_grad for t in eager_in):
            return Outcome("skip", "no differentiable output")
    torch._dynamo.reset()
    backend = StitchBackend()
    try:
        actual = post(torch.compile(fn, backend=backend, fullgraph=False)(*comp_in))
    except Exception as e:
        kind = "crash" if _ours(e) else "torch"
        return Outcome(kind, f"compiled call raised {type(e).__name__}: {' '.join(str(e).split())[:300]}")
    if dtype in (torch.float16, torch.bfloat16):
        try:
            reference = fn(*[_clone_tree(t, torch.float64) for t in tensors])
        except Exception:
            reference = None
        bad = _judge_half(actual, expected, reference) if reference is not None else \
            _close(actual, expected, "output", dtype)
    else:
        bad = _close(actual, expected, "output", dtype)
        if bad and dtype == torch.float32:
            bad = _arbitrate(bad, actual, expected, lambda: fn(*[_clone_tree(t, torch.float64) for t in tensors]))
        elif bad and dtype == torch.float64 and not backward:
            bad = _arbitrate(bad, actual, expected, lambda: _numpy_reference(opinfo, sample))
    if not bad:
        bad = _close(comp_in, eager_in, "input after the call", dtype)
    if not bad and backward:
        act_out = [a for a, e in zip(_tensors(actual), _tensors(expected))
                   if e.requires_grad and e.dtype.is_floating_point]
        if len(act_out) != len(exp_out) or not all(a.requires_grad for a in act_out):
            return Outcome("fail", "compiled outputs do not require grad")
        cots = [torch.randn_like(e) for e in exp_out]
        leaves_e = [t for t in eager_in if t.requires_grad]
        leaves_a = [t for t in comp_in if t.requires_grad]
        try:
            g_e = torch.autograd.grad(exp_out, leaves_e, cots, allow_unused=True)
        except Exception as e:
            return Outcome("skip", f"eager backward raised {type(e).__name__}")
        try:
            g_a = torch.autograd.grad(act_out, leaves_a, cots, allow_unused=True)
        except Exception as e:
            return Outcome("crash" if _ours(e) else "torch",
                           f"compiled backward raised {type(e).__name__}: {str(e)[:300]}")
        cache: list = []

        def ref_grads(i: int):  # (the float64 gradients, computed once if arbitration is needed)
            if not cache:
                cache.append(_grads64(fn, post, tensors, cots))
            return cache[0][i]

        for i, (a, e) in enumerate(zip(g_a, g_e)):
            if (a is None) != (e is None):
                return Outcome("fail", f"grad {i}: None on one side only")
            if a is not None:
                bad = _close(a, e, f"grad {i}", dtype)
                if bad and dtype == torch.float32:
                    bad = _arbitrate(bad, a, e, lambda i=i: ref_grads(i))
                if bad:
                    break
    if bad:
        return Outcome("fail", bad)
    if not backend.records:  # e.g. a data-dependent argument (tensor.item()) broke the graph
        return Outcome("skip", "Dynamo compiled no graph")
    kernels = sum(r.plan.num_kernels for r in backend.records if r.plan is not None)
    fallbacks = _fallback_summary(backend.records)
    if fallbacks:
        return Outcome("eager", "; ".join(sorted(set(fallbacks)))[:300], tuple(sorted(set(fallbacks))), kernels)
    return Outcome("pass", kernels=kernels)


# -- one op -----------------------------------------------------------------------------

NONCONTIGUOUS = "fp32 nc"
CONFIGS = (("fp32 fwd", torch.float32, False), ("fp32 bwd", torch.float32, True),
           ("bf16 fwd", torch.bfloat16, False), ("fp16 fwd", torch.float16, False),
           ("fp64 fwd", torch.float64, False),
           # integer and bool inputs where the op takes them (indices, masks, bit ops, gcd):
           # compared exactly with eager
           ("int64 fwd", torch.int64, False), ("int32 fwd", torch.int32, False), ("bool fwd", torch.bool, False),
           # the float32 samples made non-contiguous (`SampleInput.noncontiguous`: every tensor
           # with gaps between its elements), forward and backward where the op has autograd
           (NONCONTIGUOUS, torch.float32, None))
LABELS = tuple(c[0] for c in CONFIGS)


def _opinfos() -> dict[str, Any]:
    """Every op_db entry by key (name or name.variant), in op_db order."""
    from torch.testing._internal.common_methods_invocations import op_db
    out = {}
    for o in op_db:
        key = o.name + (f".{o.variant_test_name}" if o.variant_test_name else "")
        out.setdefault(key, o)
    return out


def sweep_op(key: str, samples: int = 12, half_samples: int = 3, seed: int = 0,
             labels: Iterable[str] = LABELS) -> dict[str, Tally]:
    """Tallies for one op_db entry, per configuration (label -> Tally): `samples` in
    float32, `half_samples` in the others (bfloat16, float16, float64, int64, int32, bool, and
    float32 made non-contiguous)."""
    import logging
    import warnings
    torch._logging.set_logs(dynamo=logging.ERROR)  # graph-break explanations are not results
    opinfo = _opinfos()[key]
    result: dict[str, Tally] = {label: Tally() for label in LABELS}
    if NOT_COMPARABLE.search(key):
        return result
    supported = opinfo.supported_dtypes("cpu")
    labels = tuple(labels)
    for label, dtype, backward in CONFIGS:
        tally = result[label]
        if backward is None:   # (the non-contiguous configuration: backward where there is one)
            backward = opinfo.supports_autograd
        if label not in labels or dtype not in supported or (backward and not opinfo.supports_autograd):
            continue
        torch.manual_seed(seed)
        n = samples if dtype == torch.float32 and label != NONCONTIGUOUS else half_samples
        try:
            it = opinfo.sample_inputs("cpu", dtype, requires_grad=backward)
            batch = [s for _, s in zip(range(n), it)]
            if label == NONCONTIGUOUS:
                batch = [s.noncontiguous() for s in batch]
        except Exception as e:
            tally.first_failure = f"sample_inputs raised {type(e).__name__}"
            continue
        for s in batch:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    o = run_sample(opinfo, s, dtype, backward)
                except Exception as e:  # a bug in the sweep itself must not stop it
                    o = Outcome("crash", f"sweep error {type(e).__name__}: {e} "
                                         f"{traceback.format_exc(limit=2)[-200:]}")
            tally.add(o)
    return result


# -- report -----------------------------------------------------------------------------

def _cell(t: Tally) -> str:
    if t.samples == 0:
        return "—"
    out = f"{t.passed}/{t.samples}"
    extra = [f"{n}{k}" for n, k in ((t.eager, "e"), (t.failed, "F"), (t.crashed, "C"), (t.torch_errors, "T")) if n]
    return out + (f" ({' '.join(extra)})" if extra else "")


def _notes(t: dict[str, Tally]) -> str:
    notes = []
    for label, tally in t.items():
        if tally.first_failure:
            notes.append(f"{label}: {tally.first_failure[:200]}")
        elif tally.reasons:
            notes.append(f"{label}: eager: {tally.reasons.most_common(1)[0][0][:120]}")
    return "; ".join(notes).replace("|", "\\|").replace("\n", " ")


def summarize(results: dict[str, dict[str, Tally]]) -> dict[str, Any]:
    """Totals per configuration, reasons (op x sample) and the kernel coverage: of the
    ops whose float32 forward samples all pass or run eagerly (no failure, no crash),
    how many launched a stitched kernel on at least one sample."""
    totals = {label: Tally() for label in LABELS}
    for t in results.values():
        for label in LABELS:
            totals[label].merge(t[label])
    ok_ops = [k for k, t in results.items() if t["fp32 fwd"].samples
              and t["fp32 fwd"].passed + t["fp32 fwd"].eager == t["fp32 fwd"].samples]
    with_kernel = [k for k in ok_ops if results[k]["fp32 fwd"].with_kernels]
    # memory-intensive: the ops with something to stitch, i.e. not those that launched
    # nothing because all they do is views (no reason recorded) or library work
    # (matrix products, linear algebra, FFT, sorting: every reason a library one)
    memory = [k for k in ok_ops if results[k]["fp32 fwd"].with_kernels
              or (results[k]["fp32 fwd"].reasons and not all(by_design(r) for r in results[k]["fp32 fwd"].reasons))]
    return {"totals": totals, "ok_ops": ok_ops, "with_kernel": with_kernel, "memory": memory}


def render(results: dict[str, dict[str, Tally]], command: str, seconds: float) -> str:
    """The markdown report: counts per status and per reason, then one row per op."""
    summ = summarize(results)
    totals = summ["totals"]
    lines = ["# OpInfo sweep", "",
             f"Generated by `{command}` on {datetime.date.today().isoformat()} with torch "
             f"{torch.__version__} ({seconds:.0f} s, {len(results)} op_db entries). Do not edit by hand.", "",
             "Each OpInfo sample is compiled with a fresh `StitchBackend` (outputs poisoned, fallback on error "
             "off) and compared with eager: float32 and float64 within stitchml.testing.TOL (or, outside it, no "
             "further than eager's own result from a float64 run, in float64 from the OpInfo's NumPy/SciPy reference), "
             "half precision no further from a float64 run than eager's own result, integer and bool results equal to eager's "
             "(the int64, int32 and bool configurations: the OpInfo's samples of that dtype); **fp32 nc**: float32 samples "
             "made non-contiguous (`SampleInput.noncontiguous`), forward and backward where the op has autograd. Statuses: **pass** (every op in kernels), "
             "**eager** (matched, some op ran eagerly: reasons below), **fail** (mismatch, or a match while "
             "stitchml logged a warning: a misprediction the run absorbed), **crash** (an "
             "exception inside stitchml), **torch** (Dynamo/AOTAutograd raised outside stitchml). Samples "
             "whose eager call raises are not counted. Random ops and uninitialised-memory constructors are "
             "not run.", ""]
    every = len(_opinfos())
    if len(results) < every:
        lines += [f"This run covers {len(results)} of the {every} op_db entries (selected by the command above); "
                  "`make opinfo` runs them all.", ""]
    lines += ["## Counts per status (samples)", "",
             "| config | samples | pass | eager | fail | crash | torch | launched a kernel |",
             "|---|---|---|---|---|---|---|---|"]
    for label in LABELS:
        t = totals[label]
        lines.append(f"| {label} | {t.samples} | {t.passed} | {t.eager} | {t.failed} | {t.crashed} | "
                     f"{t.torch_errors} | {t.with_kernels} |")
    ok, wk, mem = summ["ok_ops"], summ["with_kernel"], summ["memory"]
    lines += ["", f"Ops whose float32 forward samples all matched (pass or eager): {len(ok)}; of those, "
              f"{len(wk)} ({100.0 * len(wk) / max(len(ok), 1):.0f}%) launched a stitched kernel.",
              f"Of the {len(mem)} of them whose ATen ops are memory-intensive (not only views, and not only "
              f"library work: matrix products, linear algebra, FFT, sorting), {len(wk)} "
              f"({100.0 * len(wk) / max(len(mem), 1):.0f}%) launched a stitched kernel.", "",
              "## Reasons an op ran eagerly (op × sample, all configurations)", "",
              "| reason | count |", "|---|---|"]
    reasons: collections.Counter = collections.Counter()
    for t in totals.values():
        reasons.update(t.reasons)
    for r, n in reasons.most_common(40):
        lines.append(f"| {r.replace('|', chr(92) + '|')} | {n} |")
    lines += ["", "## Per op", "",
              "Cells: passed/counted, then e = eager, F = fail, C = crash, T = torch error. "
              "— : no such dtype or no autograd, or not run.", "",
              "| op | " + " | ".join(LABELS) + " | notes |", "|---|" + "---|" * len(LABELS) + "---|"]
    for key in sorted(results):
        t = results[key]
        lines.append(f"| {key} | " + " | ".join(_cell(t[label]) for label in LABELS) + f" | {_notes(t)} |")
    lines.append("")
    return "\n".join(lines)


def _work(args: tuple) -> tuple[str, dict[str, Tally], float]:
    t0 = time.perf_counter()
    res = sweep_op(*args)
    return args[0], res, time.perf_counter() - t0


def main(argv: Iterable[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", help="markdown file to write (default: print)")
    p.add_argument("--samples", type=int, default=12, help="samples per op in float32 (forward and backward)")
    p.add_argument("--half-samples", type=int, default=3,
                   help="samples per op in bfloat16, float16, float64, int64, int32, bool and non-contiguous float32")
    p.add_argument("--ops", default="", help="comma-separated op_db keys (default: all)")
    p.add_argument("--family", default="", help="regular expression on op_db keys (e.g. '^linalg|^nn.functional')")
    p.add_argument("--ci-slice", action="store_true", help="the stratified slice CI runs (tests/test_opinfo.py)")
    p.add_argument("--jobs", type=int, default=1, help="worker processes")
    a = p.parse_args(list(argv) if argv is not None else None)
    every = _opinfos()
    keys = [k for k in a.ops.split(",") if k] or (list(CI_SLICE) if a.ci_slice else list(every))
    if a.family:
        keys = [k for k in keys if re.search(a.family, k)]
    unknown = [k for k in keys if k not in every]
    if unknown:
        p.error(f"not in op_db: {unknown}")
    t0 = time.perf_counter()
    results: dict[str, dict[str, Tally]] = {}
    work = [(k, a.samples, a.half_samples) for k in keys]

    def show(key, res, sec):
        print(f"{key}: {sec:.1f}s {[_cell(t) for t in res.values()]}", file=sys.stderr, flush=True)
    if a.jobs > 1:
        import multiprocessing as mp
        with ProcessPoolExecutor(a.jobs, mp_context=mp.get_context("spawn")) as ex:
            for key, res, sec in ex.map(_work, work):
                results[key] = res
                show(key, res, sec)
    else:
        for w in work:
            key, res, sec = _work(w)
            results[key] = res
            show(key, res, sec)
    cmd = "python -m stitchml.tools.opinfo_sweep " + " ".join(
        x for x in (f"--out {a.out}" if a.out else "", f"--samples {a.samples}", f"--half-samples {a.half_samples}",
                    f"--ops {a.ops}" if a.ops else "", f"--family '{a.family}'" if a.family else "",
                    "--ci-slice" if a.ci_slice else "") if x)
    text = render(results, cmd.strip(), time.perf_counter() - t0)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    else:
        print(text)
    t = summarize(results)["totals"]
    return 1 if any(t[label].crashed or t[label].failed for label in LABELS) else 0


def _ensure_interpreter() -> None:
    """Kernels on CPU need TRITON_INTERPRET=1 before triton is imported: re-run
    ourselves with it set when it is missing and there is no GPU."""
    if os.environ.get("TRITON_INTERPRET") in (None, "", "0") and not torch.cuda.is_available():
        env = dict(os.environ, TRITON_INTERPRET="1")
        os.execve(sys.executable, [sys.executable, "-m", "stitchml.tools.opinfo_sweep", *sys.argv[1:]], env)


if __name__ == "__main__":
    _ensure_interpreter()
    sys.exit(main())
