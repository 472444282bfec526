"""Run PyTorch's module database (`module_db`, every `torch.nn` module with sample inputs)
through the stitch backend against eager.

`op_db` (tools/opinfo_sweep.py) tests ops one at a time; modules call them the way
users' code does, with the paths modules take in each mode (a batch norm's running
statistics in training, `nn.MultiheadAttention`'s masks and weights).  Each module's first samples, float32, in two modes: **train** (train mode,
inputs and parameters requiring gradients; the output, then the gradients of the
parameters and float inputs for a random cotangent) and **infer** (eval mode under
`torch.no_grad`).  A fresh `StitchBackend` and Dynamo state per sample, strict mode with
the fallback off, outputs poisoned: an exception inside stitchml is a crash, an op run
eagerly for a reason that is not the library's by design is named.

A sample is ``pass`` (results match, every op in kernels but library work), ``eager``
(matched; some op ran eagerly: the reasons are listed), ``fail`` (a mismatch), ``crash``
(an exception inside stitchml), ``torch`` (Dynamo or AOTAutograd raised outside
stitchml), ``no graph`` (Dynamo compiled nothing: it runs `nn.RNN`/`GRU`/`LSTM` eagerly
unless `allow_rnn`, and graph-breaks around some losses) or ``skip`` (the eager call
raised, or the module draws random numbers eager's generator would have to match).

Usage (about 2.5 min on 2 CPU cores under the interpreter)::

    TRITON_INTERPRET=1 python -m stitchml.tools.module_sweep --out docs/MODULES.md [--samples 2] [--modules nn.GELU,...]
"""
from __future__ import annotations

import argparse
import collections
import copy
import datetime
import os
import re
import sys
import time
import traceback
import warnings
from typing import Any, Iterable

os.environ.setdefault("STITCHML_POISON_OUTPUTS", "1")
os.environ.setdefault("STITCHML_FALLBACK_ON_ERROR", "0")

import torch  # noqa: E402

from ..fallback import by_design  # noqa: E402

MODES = ("train", "infer")
# modules whose results come from random numbers (eager's generator, not ours)
NOT_COMPARABLE = re.compile(r"Dropout|RReLU|FractionalMaxPool")
STATUSES = ("pass", "eager", "fail", "crash", "torch", "no graph", "skip")


def _module_db() -> dict[str, Any]:
    from torch.testing._internal.common_modules import module_db
    return {m.name: m for m in module_db}


def _tensors(x: Any) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in _tensors(v)]
    if isinstance(x, dict):
        return [t for v in x.values() for t in _tensors(v)]
    return []


def _copy(x: Any) -> Any:
    """A copy of a sample's inputs with fresh leaves (their gradients apart)."""
    if isinstance(x, torch.Tensor):
        return x.detach().clone().requires_grad_(x.requires_grad)
    if isinstance(x, (list, tuple)):
        return type(x)(_copy(v) for v in x)
    if isinstance(x, dict):
        return {k: _copy(v) for k, v in x.items()}
    return x


def _mismatches(got: list, want: list) -> list[str]:
    from ..testing import TOL
    bad = []
    for i, (a, b) in enumerate(zip(got, want)):
        if a is None or b is None:
            if (a is None) != (b is None):
                bad.append(f"#{i}: None against a tensor")
            continue
        if a.shape != b.shape or a.dtype != b.dtype:
            bad.append(f"#{i}: {tuple(a.shape)} {a.dtype} against {tuple(b.shape)} {b.dtype}")
        elif a.is_floating_point():
            rtol, atol = TOL.get(a.dtype, (1e-4, 1e-5))
            if not torch.allclose(a, b, rtol=rtol, atol=atol, equal_nan=True):
                bad.append(f"#{i}: max error {float((a - b).abs().nan_to_num().max()):.3g}")
        elif not torch.equal(a, b):
            bad.append(f"#{i}: values differ")
    if len(got) != len(want):
        bad.append(f"{len(got)} results against {len(want)}")
    return bad


def run_sample(info: Any, sample: Any, mode: str) -> dict:
    """One sample in one mode: a JSON-ready row."""
    import stitchml
    from stitchml import config

    training = mode == "train"
    row: dict[str, Any] = {"module": info.name, "mode": mode, "desc": str(getattr(sample, "desc", "") or "")}
    if NOT_COMPARABLE.search(info.name):
        return {**row, "status": "skip", "why": "random numbers"}
    if sample.forward_input is None:
        return {**row, "status": "skip", "why": "no forward input"}
    torch.manual_seed(0)
    try:
        mine = info.module_cls(*sample.constructor_input.args, **sample.constructor_input.kwargs).train(training)
        args, kwargs = sample.forward_input.args, sample.forward_input.kwargs
        if isinstance(mine, torch.nn.modules.lazy.LazyModuleMixin):   # (its parameters drawn once, then copied)
            with torch.no_grad():
                mine(*_copy(args), **_copy(kwargs))
        eager = copy.deepcopy(mine)
        with torch.set_grad_enabled(training):
            e_args, e_kwargs = _copy(args), _copy(kwargs)
            want = eager(*e_args, **e_kwargs)
    except Exception as e:   # (eager's own refusal: not counted)
        return {**row, "status": "skip", "why": f"eager raised {type(e).__name__}: {str(e)[:120]}"}
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    backend = stitchml.StitchBackend()
    compiled = torch.compile(mine, backend=backend)
    bad: list[str] = []
    try:
        with torch.set_grad_enabled(training), config.override(fallback_on_error=False, strict=True):
            m_args, m_kwargs = _copy(args), _copy(kwargs)
            got = compiled(*m_args, **m_kwargs)
            bad = _mismatches(_tensors(got), _tensors(want))
            if training and not bad:
                bad = _gradients(got, want, (m_args, m_kwargs, mine), (e_args, e_kwargs, eager))
    except Exception as e:
        inside = any("stitchml" in f.filename for f in traceback.extract_tb(e.__traceback__)) or "stitchml" in str(e)
        return {**row, "status": "crash" if inside else "torch",
                "why": f"{type(e).__name__}: {str(e)[:300]}".replace("\n", " ")}
    if not backend.records:   # (Dynamo's reason: its graph breaks, or it skipped the module)
        breaks = sorted({k.split("\n")[0] for k in counters["graph_break"]})
        return {**row, "status": "no graph", "why": "; ".join(breaks)[:200] or "Dynamo compiled nothing"}
    from .model_sweep import _eager_ops   # (the model and vision sweeps' count: dynamic eager calls too)
    eager_ops = sorted(set(_eager_ops(backend.records))
                       | {f"whole {r.kind} graph: {r.eager_reason}" for r in backend.records if r.eager_reason})
    status = "fail" if bad else ("eager" if eager_ops else "pass")
    return {**row, "status": status, "why": "; ".join(bad[:3] or eager_ops[:3]), "graphs": len(backend.records),
            "kernels": sum(r.plan.num_kernels for r in backend.records if r.plan is not None),
            "library": sorted({f.op for r in backend.records if r.graph is not None
                               for f in r.graph.fallbacks if by_design(f.reason)})}


def _gradients(got: Any, want: Any, mine: tuple, eager: tuple) -> list[str]:
    """The gradients of the parameters and float inputs for one random cotangent per
    float output that requires a gradient, compiled against eager."""
    pairs = [(a, b) for a, b in zip(_tensors(got), _tensors(want))
             if a.requires_grad and b.requires_grad and a.is_floating_point()]
    if not pairs:
        return []
    cots = [torch.randn(b.shape, dtype=b.dtype) for _, b in pairs]

    def leaves(side: tuple) -> list[torch.Tensor]:
        a, k, module = side
        return [t for t in _tensors(a) + _tensors(k) if t.requires_grad] + \
            [p for p in module.parameters() if p.requires_grad]
    mine_leaves, eager_leaves = leaves(mine), leaves(eager)
    gm = torch.autograd.grad([a for a, _ in pairs], mine_leaves, cots, allow_unused=True)
    ge = torch.autograd.grad([b for _, b in pairs], eager_leaves, cots, allow_unused=True)
    return [f"gradient {m}" for m in _mismatches(list(gm), list(ge))]


def sweep(names: Iterable[str], samples: int) -> list[dict]:
    db = _module_db()
    rows = []
    for name in names:
        info = db[name]
        for mode in MODES:
            try:
                inputs = info.module_inputs_func(info, device="cpu", dtype=torch.float32,
                                                 requires_grad=mode == "train", training=mode == "train")
            except Exception as e:
                rows.append({"module": name, "mode": mode, "desc": "", "status": "skip",
                             "why": f"no samples: {type(e).__name__}"})
                continue
            for s in inputs[:samples]:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    rows.append(run_sample(info, s, mode))
                r = rows[-1]
                print(f"{r['module']} {r['mode']} {r['desc'] or '-'}: {r['status']}"
                      f"{'  ' + r['why'][:160] if r.get('why') and r['status'] != 'pass' else ''}",
                      file=sys.stderr, flush=True)
    return rows


def render(rows: list[dict], seconds: float, argv: list[str]) -> str:
    counts = collections.Counter((r["mode"], r["status"]) for r in rows)
    lines = ["# module_db sweep", "",
             f"Generated by `python -m stitchml.tools.module_sweep {' '.join(argv)}`".rstrip() +
             f" on {datetime.date.today()} with torch {torch.__version__} ({seconds:.0f} s, "
             f"{len({r['module'] for r in rows})} module_db entries). Do not edit by hand.", "",
             (__doc__ or "").split("\n\n")[1].replace("\n", " "), "",
             "## Counts per status (samples)", "",
             "| mode | " + " | ".join(STATUSES) + " |", "|---|" + "---|" * len(STATUSES)]
    for mode in MODES:
        lines.append(f"| {mode} | " + " | ".join(str(counts[(mode, s)]) for s in STATUSES) + " |")
    lines += ["", "## Samples that did not pass", "", "| module | mode | sample | status | why |", "|---|---|---|---|---|"]
    lines += [f"| {r['module']} | {r['mode']} | {r['desc'] or '-'} | {r['status']} | {r.get('why', '')} |"
              for r in rows if r["status"] != "pass"]
    return "\n".join(lines) + "\n"


def main(argv: Iterable[str] | None = None) -> int:
    argv = list(argv) if argv is not None else sys.argv[1:]
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--out", help="markdown file to write (default: print)")
    p.add_argument("--samples", type=int, default=2, help="samples per module and mode")
    p.add_argument("--modules", default="", help="comma-separated module_db names (default: all)")
    a = p.parse_args(argv)
    db = _module_db()
    names = [n for n in a.modules.split(",") if n] or list(db)
    unknown = [n for n in names if n not in db]
    if unknown:
        p.error(f"not in module_db: {unknown}")
    t0 = time.perf_counter()
    rows = sweep(names, a.samples)
    text = render(rows, time.perf_counter() - t0, argv)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    else:
        print(text)
    return 1 if any(r["status"] in ("fail", "crash") for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
