"""The `stitchml` command line.

    stitchml demo      compile a small transformer block, show the plan, verify against eager
    stitchml explain   show what stitchml does with the example block (--backward for training)
    stitchml config    list every knob with its environment variable and default

Without a CUDA GPU the generated Triton kernels run under the Triton interpreter
(TRITON_INTERPRET=1, set here before triton or stitchml is imported).
"""
from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    # before triton / stitchml internals are imported: kernels run in the interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

import argparse  # noqa: E402
import copy  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from collections import Counter  # noqa: E402
from typing import Sequence  # noqa: E402

TOLERANCE = 1e-4   # relative error ||a - b|| / ||b||, float32


# --------------------------------------------------------------------------- helpers

def _device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _interpreted(device: torch.device) -> bool:
    return device.type == "cpu" or os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """||actual - expected|| / ||expected|| in float64 (absolute error if expected is zero);
    NaN or inf anywhere gives inf, shape or dtype mismatch gives inf."""
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        return float("inf")
    a, e = actual.detach().double(), expected.detach().double()
    if not (torch.isfinite(a).all() and torch.isfinite(e).all()):
        return float("inf")
    diff = torch.linalg.vector_norm(a - e).item()
    ref = torch.linalg.vector_norm(e).item()
    return diff / ref if ref > 0 else diff


def _block_and_inputs(args: argparse.Namespace, dropout: float, device: torch.device):
    from .tools.examples import example_inputs, make_block
    torch.manual_seed(args.seed)
    block = make_block(args.hidden, args.heads, dropout=dropout, seed=args.seed).to(device)
    x, mask = example_inputs(args.batch, args.seq, args.hidden, args.heads, device=device)
    return block, x, mask


def _describe(args: argparse.Namespace, block, x, mask, device) -> str:
    n_params = sum(p.numel() for p in block.parameters())
    return (f"example: pre-LN transformer block, hidden={args.hidden}, heads={args.heads}, "
            f"mlp={block.fc1.out_features}, {n_params} parameters\n"
            f"inputs:  x {tuple(x.shape)}, additive causal mask {tuple(mask.shape)}, "
            f"{str(x.dtype).replace('torch.', '')} on {device}")


def _fallback_lines(report) -> list[str]:
    """Eager ops grouped by (graph, op, reason)."""
    lines = []
    for rec in report.graphs:
        if rec.eager_reason is not None:
            lines.append(f"  {rec.kind:9} <whole graph> runs eagerly: {rec.eager_reason}")
            continue
        if rec.graph is None:
            continue
        counts = Counter((f.op, f.reason) for f in rec.graph.fallbacks)
        for (op, reason), n in sorted(counts.items()):
            lines.append(f"  {rec.kind:9} {n:2d} x {op:24} {reason}")
    return lines or ["  (none)"]


def _print_plan(title: str, report) -> None:
    print(f"--- plan: {title} ---")
    print(report.to_text())
    schemes = Counter(k.scheme for k in report.kernels)
    print("schemes: " + (", ".join(f"{n} {s}" for s, n in sorted(schemes.items())) or "(no kernels)"))
    fused, unfused = report.modelled_bytes, report.unfused_bytes
    ratio = f" ({unfused / fused:.1f}x less)" if fused else ""
    print(f"modelled memory traffic: {fused / 1e6:.3f} MB in stitched kernels vs {unfused / 1e6:.3f} MB "
          f"unfused eager (one kernel per memory-intensive op){ratio}")
    print("eager ops (fallbacks) and why:")
    for line in _fallback_lines(report):
        print(line)
    compile_s = sum(r.compile_seconds for r in report.graphs)
    print(f"compile time: {compile_s:.2f} s for {len(report.graphs)} graph(s)")
    print()


def _problems(report, caught: list[warnings.WarningMessage]) -> list[str]:
    """Reasons the compiled run did not exercise stitchml's kernels."""
    out = [f"stitchml warning: {w.message}" for w in caught if "stitchml" in str(w.message)]
    for rec in report.graphs:
        if rec.eager_reason is not None:
            out.append(f"{rec.kind} graph ran eagerly: {rec.eager_reason}")
        elif rec.calls == 0:
            out.append(f"{rec.kind} graph was compiled but never called")
    if not report.graphs:
        out.append("no graph reached the stitch backend")
    elif report.num_kernels == 0:
        out.append("no kernel was generated")
    return out


# --------------------------------------------------------------------------- commands

def cmd_config(args: argparse.Namespace) -> int:
    from . import config
    print(config.table())
    return 0


def cmd_explain(args: argparse.Namespace) -> int:
    import stitchml
    device = _device()
    block, x, mask = _block_and_inputs(args, args.dropout if args.backward else 0.0, device)
    print(_describe(args, block, x, mask, device))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if args.backward:
            block.train()
            print(f"mode: training (forward + backward), dropout p={args.dropout}\n")
            report = stitchml.explain(block, x, mask, backward=True)
        else:
            block.eval()
            print("mode: inference (eval, no grad, dropout off)\n")
            with torch.no_grad():
                report = stitchml.explain(block, x, mask)
    print(report.to_text())
    problems = _problems(report, caught)
    for p in problems:
        print(f"WARNING: {p}")
    return 1 if problems else 0


def _run_compiled(block, inputs: Sequence[torch.Tensor], backend, *, train: bool,
                  cotangent: torch.Tensor | None = None):
    """Compile `block` with `backend`, run it (and its backward with `cotangent`)."""
    compiled = torch.compile(block, backend=backend)
    if not train:
        with torch.no_grad():
            return compiled(*inputs)
    out = compiled(*inputs)
    out.backward(cotangent)
    return out


def _run_eager(block, inputs: Sequence[torch.Tensor], *, train: bool, cotangent: torch.Tensor | None = None):
    if not train:
        with torch.no_grad():
            return block(*inputs)
    out = block(*inputs)
    out.backward(cotangent)
    return out


def cmd_demo(args: argparse.Namespace) -> int:
    from .capture.backend import StitchBackend
    from .tools.explain import Report

    t_start = time.perf_counter()
    device = _device()
    block, x, mask = _block_and_inputs(args, 0.0, device)
    print("stitchml demo: compile a small transformer block, show the plan, verify against eager PyTorch")
    print(_describe(args, block, x, mask, device))
    if _interpreted(device):
        print("note: no CUDA GPU in use, so the generated Triton kernels run under the Triton interpreter "
              "(TRITON_INTERPRET=1) on CPU.\n      This checks correctness only; timings under the "
              "interpreter mean nothing.")
    print()

    checks: list[tuple[str, float]] = []
    problems: list[str] = []

    # 1. inference: eval mode, no grad
    eager_blk, comp_blk = copy.deepcopy(block).eval(), copy.deepcopy(block).eval()
    backend = StitchBackend()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        expected = _run_eager(eager_blk, (x, mask), train=False)
        actual = _run_compiled(comp_blk, (x.clone(), mask.clone()), backend, train=False)
    report = Report(backend.records)
    _print_plan("inference (eval mode, no grad)", report)
    problems += [f"inference: {p}" for p in _problems(report, caught)]
    checks.append(("inference output", _rel_err(actual, expected)))

    # 2. training: forward + backward, dropout p=0 so eager and compiled compute the same numbers
    eager_blk, comp_blk = copy.deepcopy(block).train(), copy.deepcopy(block).train()
    x_e, x_c = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    gen = torch.Generator().manual_seed(args.seed + 1)
    cot = torch.randn(x.shape, generator=gen, dtype=x.dtype).to(device)   # random cotangent dL/dout
    backend = StitchBackend()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        expected = _run_eager(eager_blk, (x_e, mask), train=True, cotangent=cot)
        actual = _run_compiled(comp_blk, (x_c, mask.clone()), backend, train=True, cotangent=cot)
    report = Report(backend.records)
    _print_plan("training forward + backward (train mode, dropout p=0)", report)
    problems += [f"training: {p}" for p in _problems(report, caught)]
    checks.append(("training output", _rel_err(actual, expected)))
    checks.append(("grad x", _rel_err(x_c.grad, x_e.grad) if x_c.grad is not None else float("inf")))
    comp_params = dict(comp_blk.named_parameters())
    for name, p_e in eager_blk.named_parameters():
        p_c = comp_params[name]
        if p_c.grad is None or p_e.grad is None:
            checks.append((f"grad {name}", float("inf")))
            problems.append(f"training: no gradient for {name}")
        else:
            checks.append((f"grad {name}", _rel_err(p_c.grad, p_e.grad)))

    # 3. verdict
    print(f"--- verification against eager (relative error ||compiled - eager|| / ||eager||, "
          f"tolerance {TOLERANCE:g}) ---")
    bad = [(n, e) for n, e in checks if not e <= TOLERANCE]
    for name, err in checks:
        print(f"  {name:24} {err:.2e}  {'ok' if err <= TOLERANCE else 'FAIL'}")
    for p in problems:
        print(f"  problem: {p}")
    worst_name, worst = max(checks, key=lambda c: c[1])
    n_grads = sum(1 for n, _ in checks if n.startswith("grad "))
    elapsed = time.perf_counter() - t_start
    summary = (f"max relative error {worst:.2e} ({worst_name}) over 2 outputs and {n_grads} gradients, "
               f"tolerance {TOLERANCE:g}")
    if bad or problems:
        what = "; ".join([f"{n} rel err {e:.2e}" for n, e in bad] + problems)
        print(f"FAIL: {summary}. Failed: {what}")
        print(f"(demo took {elapsed:.1f} s)")
        return 1
    print(f"PASS: {summary}")
    print(f"(demo took {elapsed:.1f} s)")
    return 0


# --------------------------------------------------------------------------- entry point

def _add_size_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--batch", type=int, default=2, help="batch size (default 2)")
    p.add_argument("--seq", type=int, default=16, help="sequence length (default 16)")
    p.add_argument("--hidden", type=int, default=64, help="hidden size (default 64)")
    p.add_argument("--heads", type=int, default=4, help="attention heads (default 4)")
    p.add_argument("--seed", type=int, default=0, help="random seed for weights and inputs (default 0)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stitchml",
        description="stitchml: stitch the memory-intensive ops of PyTorch programs into few Triton kernels.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser("demo", help="compile a small transformer block, show the plan, verify against eager",
                       description="Compile the built-in transformer block for inference and for training "
                                   "(forward + backward), print the plans, and check outputs and every "
                                   f"gradient against eager PyTorch (relative error <= {TOLERANCE:g}). "
                                   "Exit code 1 on failure.")
    _add_size_args(p)
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("explain", help="show what stitchml does with the example block",
                       description="Compile the built-in transformer block with stitchml.explain and print "
                                   "its kernels, schemes, thread mappings, modelled bytes and eager ops.")
    _add_size_args(p)
    p.add_argument("--backward", action="store_true",
                   help="training mode: compile and run forward and backward")
    p.add_argument("--dropout", type=float, default=0.0,
                   help="dropout probability with --backward (default 0.0; eval mode never drops)")
    p.set_defaults(func=cmd_explain)

    p = sub.add_parser("config", help="list every knob: environment variable, default, help")
    p.set_defaults(func=cmd_config)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
