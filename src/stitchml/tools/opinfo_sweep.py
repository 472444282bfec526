"""Run PyTorch's own OpInfo sample inputs through the stitch backend against eager.

For every op family we lower (see `MAPPING`, a reviewed table from OpInfo names to the
ATen overloads that carry them), each OpInfo sample is compiled with a fresh
`StitchBackend` and a fresh Dynamo state and compared with eager PyTorch: forward in
float32 and bfloat16, and backward (input gradients for a random cotangent) in float32
where the OpInfo supports autograd.  A sample is

* ``pass``  -- outputs (and gradients) match and every op of the graph ran in kernels;
* ``eager`` -- results match but some op of the graph ran eagerly (listed in the
  records' `graph.fallbacks`, or the whole graph ran eagerly): not a pass of our
  lowering.  ``refused`` tells whether every such op was a rule deliberately refusing
  the arguments (an `Unsupported` raised by the rule, or a dtype kernels do not take);
* ``fail``  -- a mismatch, a compile error, or a compiled call that raised;
* ``skip``  -- the eager call itself raised (the sample is not counted).

Usage::

    TRITON_INTERPRET=1 python -m stitchml.tools.opinfo_sweep --out docs/OPINFO.md \
        [--max-samples N] [--ops exp,add] [--jobs 2]
"""
from __future__ import annotations

import argparse
import datetime
import os
import sys
import time
import traceback
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

os.environ.setdefault("STITCHML_POISON_OUTPUTS", "1")

import torch  # noqa: E402
import torch.utils._pytree as pytree  # noqa: E402

# -- the mapping table ------------------------------------------------------------------
# OpInfo name (`name` or `name.variant_test_name`) -> the ATen overload packets it is
# lowered through.  Composite ops are listed only where our decomposition table turns
# them into lowered ops.  Reviewed by hand: ops whose OpInfo exercises something else
# (in-place variants, random ops, complex-only variants, out= forms) are not listed.
#
# Left out on purpose: random ops (dropout, bernoulli, rand*: eager's generator cannot
# be matched), `scatter` (OpInfo samples scatter a src tensor; we lower only the
# one-hot value form), `as_strided` (samples view non-contiguous/offset inputs, which
# the rule refuses by design), `nn.functional.embedding` (its samples use max_norm /
# in-place renormalisation and padding_idx backward forms that are not ours), the
# constructors `full`/`zeros`/`ones` (no tensor input: Dynamo constant-folds them),
# `arange` (no tensor input either), `__getitem__` (its samples mix slices, ints,
# masks and several index tensors; `index.Tensor` with one integer index is tested in
# tests/test_ops.py), `new_empty`/`empty_like` (uninitialised values cannot be compared), and the bitwise
# ops (their OpInfos have integer dtypes only; this sweep runs float32 and bfloat16).
#
# `bwd_unlowered` lists ops of an op's backward graph that have no rule (scatter_add,
# index_add, cumprod, ...): they run eagerly by design, so those backward samples are
# reported as 'eager' and do not count against the op.


@dataclass(frozen=True)
class OpMap:
    """One OpInfo entry and the lowered ATen packets it exercises."""

    opinfo: str
    aten: tuple[str, ...]
    bwd_unlowered: tuple[str, ...] = ()  # ops of its backward graph we have no rule for


def _m(opinfo: str, *aten: str, bwd_unlowered: tuple[str, ...] = ()) -> OpMap:
    return OpMap(opinfo, tuple(aten) or (f"aten.{opinfo.rsplit('.', 1)[-1]}",), bwd_unlowered)


MAPPING: dict[str, OpMap] = {m.opinfo: m for m in [
    # unary element-wise
    *[_m(n) for n in ("exp", "exp2", "log", "log2", "log1p", "expm1", "sqrt", "rsqrt", "sin", "cos",
                      "tanh", "sigmoid", "erf", "abs", "neg", "reciprocal", "floor", "ceil", "trunc",
                      "sign", "isnan", "isinf", "logical_not")],
    _m("round"),
    _m("nn.functional.relu", "aten.relu"),
    # binary element-wise
    *[_m(n) for n in ("add", "sub", "mul", "maximum", "minimum", "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or",
                      "logical_xor", "pow", "rsub", "where", "clamp", "clamp_min", "clamp_max",
                      "floor_divide")],
    _m("div.no_rounding_mode", "aten.div"),
    _m("div.trunc_rounding", "aten.div"),
    _m("div.floor_rounding", "aten.div"),
    _m("true_divide", "aten.div"),
    _m("nn.functional.hardtanh", "aten.hardtanh", "aten.clamp"),
    # copies and constructors with a tensor argument
    _m("clone"), _m("contiguous", "aten.clone"),
    _m("full_like"), _m("zeros_like"), _m("ones_like"), _m("new_zeros"), _m("new_ones"), _m("new_full"),
    # reductions
    *[_m(n) for n in ("sum", "mean", "amax", "amin", "argmax", "argmin")],
    _m("prod", bwd_unlowered=("aten.cumprod", "aten.flip")),
    _m("max.reduction_no_dim", "aten.max"), _m("min.reduction_no_dim", "aten.min"),
    _m("max.reduction_with_dim", "aten.max", bwd_unlowered=("aten.scatter.src",)),
    _m("min.reduction_with_dim", "aten.min", bwd_unlowered=("aten.scatter.src",)),
    _m("max.binary", "aten.maximum"), _m("min.binary", "aten.minimum"),
    # layout
    *[_m(n) for n in ("reshape", "view", "squeeze", "unsqueeze", "flatten", "unflatten", "permute",
                      "transpose", "t", "expand", "select", "cat", "stack", "split", "unbind", "chunk",
                      "split_with_sizes")],
    _m("squeeze.multiple", "aten.squeeze"),
    _m("split.list_args", "aten.split_with_sizes"),
    _m("narrow", "aten.slice"),
    _m("nn.functional.pad.constant", "aten.constant_pad_nd"), _m("roll"), _m("repeat"),
    # indexed reads
    _m("index_select", bwd_unlowered=("aten.index_add",)), _m("gather", bwd_unlowered=("aten.scatter_add",)),
    # composites that our decomposition table turns into lowered ops
    _m("softmax", "aten._softmax"), _m("log_softmax", "aten._log_softmax"),
    _m("nn.functional.layer_norm", "aten.native_layer_norm"),
    _m("nn.functional.gelu", "aten.gelu"), _m("nn.functional.silu", "aten.silu"),
    _m("square"), _m("var"), _m("var.unbiased", "aten.var"), _m("std"), _m("var_mean"),
    _m("logsumexp"), _m("addcmul"), _m("addcdiv"), _m("lerp"),
    _m("nn.functional.softplus", "aten.softplus"), _m("nn.functional.leaky_relu", "aten.leaky_relu"),
    _m("nn.functional.elu", "aten.elu"), _m("nn.functional.hardsigmoid", "aten.hardsigmoid"),
    _m("nn.functional.hardswish", "aten.hardswish"), _m("nn.functional.mish", "aten.mish"),
    _m("masked_fill"), _m("frac"), _m("xlogy"), _m("nn.functional.mse_loss", "aten.mse_loss"),
]}

FWD_DTYPES = (torch.float32, torch.bfloat16)


# -- one sample -------------------------------------------------------------------------

@dataclass
class Outcome:
    """What one sample did."""

    status: str                 # pass | eager | fail | skip
    reason: str = ""
    refused: bool = True        # eager only: every eager op was a deliberate refusal


@dataclass
class Tally:
    """Counts for one op in one configuration (fp32 fwd, fp32 bwd, bf16 fwd)."""

    samples: int = 0
    passed: int = 0
    eager: int = 0
    failed: int = 0
    skipped: int = 0
    first_failure: str = ""
    eager_reasons: list[str] = field(default_factory=list)
    unrefused_eager: int = 0

    def add(self, o: Outcome) -> None:
        if o.status == "skip":
            self.skipped += 1
            return
        self.samples += 1
        if o.status == "pass":
            self.passed += 1
        elif o.status == "eager":
            self.eager += 1
            if not o.refused:
                self.unrefused_eager += 1
            if o.reason not in self.eager_reasons:
                self.eager_reasons.append(o.reason)
        else:
            self.failed += 1
            self.first_failure = self.first_failure or o.reason


_DELIBERATE_NOT = ("no lowering rule", "mutates its input", "consumes a multi-output eager op")


def _tensors(tree: Any) -> list[torch.Tensor]:
    return [x for x in pytree.tree_leaves(tree) if isinstance(x, torch.Tensor)]


def _clone_tree(tree: Any) -> Any:
    def c(x):
        if isinstance(x, torch.Tensor):
            y = x.detach().clone()
            if not x.is_contiguous() and x.dim() > 1:   # keep the sample's layout
                y = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype).copy_(x.detach())
            return y.requires_grad_(x.requires_grad)
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


def _fallback_summary(records, allowed: tuple[str, ...] = ()) -> tuple[list[str], bool]:
    """Eager ops of the compiled graphs ('op: reason'), and whether all were deliberate
    (refused by their rule, or listed in `allowed`)."""
    out, deliberate = [], True
    for r in records:
        if r.plan is None:
            out.append(f"whole {r.kind} graph: {r.eager_reason}")
            deliberate &= bool(r.eager_reason) and r.eager_reason.startswith("Unsupported")
            continue
        for f in r.graph.fallbacks:
            out.append(f"{f.op}: {f.reason}")
            deliberate &= (not any(f.reason.startswith(s) for s in _DELIBERATE_NOT)
                           or any(f.op == a or f.op.startswith(a + ".") for a in allowed))
    return out, deliberate


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


def run_sample(opinfo, sample, dtype: torch.dtype, backward: bool, allowed: tuple[str, ...] = ()) -> Outcome:
    """Compile `opinfo.op` on one sample with a fresh backend; compare with eager."""
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
        return Outcome("fail", f"compiled call raised {type(e).__name__}: {' '.join(str(e).split())[:300]}")
    for r in backend.records:
        if r.plan is None and r.eager_reason and not r.eager_reason.startswith("Unsupported"):
            return Outcome("fail", f"{r.kind} graph failed to compile: {r.eager_reason[:300]}")
    bad = _close(actual, expected, "output", dtype)
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
            return Outcome("fail", f"compiled backward raised {type(e).__name__}: {str(e)[:300]}")
        for i, (a, e) in enumerate(zip(g_a, g_e)):
            if (a is None) != (e is None):
                return Outcome("fail", f"grad {i}: None on one side only")
            if a is not None:
                bad = _close(a, e, f"grad {i}", dtype)
                if bad:
                    break
    if bad:
        return Outcome("fail", bad)
    fallbacks, deliberate = _fallback_summary(backend.records, allowed)
    if not backend.records:  # e.g. a data-dependent argument (tensor.item()) broke the graph
        return Outcome("skip", "Dynamo compiled no graph")
    if fallbacks:
        return Outcome("eager", "; ".join(sorted(set(fallbacks)))[:300], refused=deliberate)
    if sum(r.plan.num_kernels for r in backend.records) == 0:
        return Outcome("pass", "")  # views only: no kernel needed, nothing ran eagerly
    return Outcome("pass")


# -- one op -----------------------------------------------------------------------------

CONFIGS = (("fp32 fwd", torch.float32, False), ("fp32 bwd", torch.float32, True),
           ("bf16 fwd", torch.bfloat16, False))


def _opinfos() -> dict[str, Any]:
    from torch.testing._internal.common_methods_invocations import op_db
    out = {}
    for o in op_db:
        key = o.name + (f".{o.variant_test_name}" if o.variant_test_name else "")
        if key in MAPPING and key not in out:
            out[key] = o
    return out


def sweep_op(key: str, max_samples: int | None = None, seed: int = 0) -> dict[str, Tally]:
    """Tallies for one mapped op, per configuration (label -> Tally)."""
    import logging
    import warnings
    torch._logging.set_logs(dynamo=logging.ERROR)  # graph-break explanations are not results
    opinfo = _opinfos()[key]
    result: dict[str, Tally] = {}
    supported = opinfo.supported_dtypes("cpu")
    for label, dtype, backward in CONFIGS:
        tally = Tally()
        result[label] = tally
        if dtype not in supported or (backward and not opinfo.supports_autograd):
            continue
        torch.manual_seed(seed)
        try:
            samples = list(opinfo.sample_inputs("cpu", dtype, requires_grad=backward))
        except Exception as e:
            tally.first_failure = f"sample_inputs raised {type(e).__name__}"
            continue
        if max_samples is not None:
            samples = samples[:max_samples]
        for s in samples:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    o = run_sample(opinfo, s, dtype, backward, MAPPING[key].bwd_unlowered if backward else ())
                except Exception as e:  # a bug in the sweep itself must not stop it
                    o = Outcome("fail", f"sweep error {type(e).__name__}: {e} "
                                        f"{traceback.format_exc(limit=2)[-200:]}")
            tally.add(o)
    return result


# -- report -----------------------------------------------------------------------------

def _cell(t: Tally) -> str:
    if t.samples == 0:
        return "—"
    return f"{t.passed}/{t.samples} ({100.0 * t.passed / t.samples:.0f}%)"


def _notes(t: dict[str, Tally]) -> str:
    notes = []
    for label, tally in t.items():
        if tally.failed:
            notes.append(f"{label}: {tally.failed} failed, first: {tally.first_failure}")
        if tally.eager:
            kind = "refused by the rule or backward op without a rule" if tally.unrefused_eager == 0 \
                else "NOT refused by a rule"
            notes.append(f"{label}: {tally.eager} eager ({kind}: {tally.eager_reasons[0][:160]})")
    return "; ".join(notes).replace("|", "\\|").replace("\n", " ")


def render(results: dict[str, dict[str, Tally]], command: str, seconds: float) -> str:
    """The markdown report."""
    lines = ["# OpInfo sweep", "",
             f"Generated by `{command}` on {datetime.date.today().isoformat()} with torch "
             f"{torch.__version__} ({seconds:.0f} s). Do not edit by hand.", "",
             "Each of PyTorch's OpInfo samples for an op we lower is compiled with a fresh "
             "`StitchBackend` and compared with eager (stitchml.testing.TOL, bfloat16 looser; NaN "
             "positions exact). Cells: samples that matched with every op in kernels / samples "
             "counted (samples whose eager call raises are not counted). A sample that matched but "
             "had an op run eagerly is not a pass; see notes. — : the OpInfo has no such dtype or no "
             "autograd.", "",
             "| op | aten | fp32 fwd | fp32 bwd | bf16 fwd | notes |",
             "|---|---|---|---|---|---|"]
    totals = {label: Tally() for label, _, _ in CONFIGS}
    for key in sorted(results):
        t = results[key]
        for label in totals:
            for f in ("samples", "passed", "eager", "failed"):
                setattr(totals[label], f, getattr(totals[label], f) + getattr(t[label], f))
        lines.append(f"| {key} | {', '.join(MAPPING[key].aten)} | "
                     + " | ".join(_cell(t[label]) for label in totals) + f" | {_notes(t)} |")
    lines.append("| **total** | | " + " | ".join(_cell(totals[label]) for label in totals) + " | |")
    lines.append("")
    return "\n".join(lines)


def _work(args: tuple[str, int | None]) -> tuple[str, dict[str, Tally], float]:
    t0 = time.perf_counter()
    res = sweep_op(*args)
    return args[0], res, time.perf_counter() - t0


def main(argv: Iterable[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", help="markdown file to write (default: print)")
    p.add_argument("--max-samples", type=int, default=None, help="samples per op per configuration")
    p.add_argument("--ops", default="", help="comma-separated OpInfo names (default: every mapped op)")
    p.add_argument("--jobs", type=int, default=1, help="worker processes")
    a = p.parse_args(list(argv) if argv is not None else None)
    keys = [k for k in a.ops.split(",") if k] or sorted(MAPPING)
    unknown = [k for k in keys if k not in MAPPING]
    if unknown:
        p.error(f"not mapped: {unknown}")
    t0 = time.perf_counter()
    results: dict[str, dict[str, Tally]] = {}
    work = [(k, a.max_samples) for k in keys]
    if a.jobs > 1:
        import multiprocessing as mp
        with ProcessPoolExecutor(a.jobs, mp_context=mp.get_context("spawn")) as ex:
            done = ex.map(_work, work)
            for key, res, sec in done:
                results[key] = res
                print(f"{key}: {sec:.1f}s {[_cell(t) for t in res.values()]}", file=sys.stderr, flush=True)
    else:
        for w in work:
            key, res, sec = _work(w)
            results[key] = res
            print(f"{key}: {sec:.1f}s {[_cell(t) for t in res.values()]}", file=sys.stderr, flush=True)
    cmd = "python -m stitchml.tools.opinfo_sweep " + " ".join(
        x for x in (f"--out {a.out}" if a.out else "", f"--max-samples {a.max_samples}" if a.max_samples else "",
                    f"--ops {a.ops}" if a.ops else "") if x)
    text = render(results, cmd.strip(), time.perf_counter() - t0)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    else:
        print(text)
    return 0


def _ensure_interpreter() -> None:
    """Kernels on CPU need TRITON_INTERPRET=1 before triton is imported: re-run
    ourselves with it set when it is missing and there is no GPU."""
    if os.environ.get("TRITON_INTERPRET") in (None, "", "0") and not torch.cuda.is_available():
        env = dict(os.environ, TRITON_INTERPRET="1")
        os.execve(sys.executable, [sys.executable, "-m", "stitchml.tools.opinfo_sweep", *sys.argv[1:]], env)


if __name__ == "__main__":
    _ensure_interpreter()
    sys.exit(main())
