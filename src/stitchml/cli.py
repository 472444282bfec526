"""The `stitchml` command line.

    stitchml demo      compile a small transformer block, show the plan, verify against eager
    stitchml explain   show what stitchml does with the example block (--backward for training;
                       --layers: kernels, bytes and predicted time per layer)
    stitchml config    list every knob with its environment variable and default
    stitchml bench     benchmark stitchml against eager, Inductor and JAX (results.json/.md, plots)

Without a CUDA GPU the generated Triton kernels run under the Triton interpreter
(TRITON_INTERPRET=1, set here before triton or stitchml is imported).
"""
from __future__ import annotations

import os
import sys

import torch

_NO_CUDA = not torch.cuda.is_available()
# Triton fixes interpreter-or-not when it is imported (its tl.* library functions are
# decorated then), so TRITON_INTERPRET must be set before that.  When this module runs as
# the console script, `import stitchml` has already imported torch._dynamo and with it
# triton, so setting the variable here can be too late: `main` then re-runs the command
# in a fresh interpreter process (see `_rerun_interpreted`).
_INTERPRET_TOO_LATE = (_NO_CUDA and "triton" in sys.modules
                       and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"))
if _NO_CUDA:
    # before triton / stitchml internals are imported (if they are not yet): kernels
    # run in the interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

import argparse  # noqa: E402
import copy  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
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

def cmd_calibrate(args: argparse.Namespace) -> int:
    from .tools.calibrate import main as calibrate
    return calibrate(["--launch-only"] * args.launch_only + ["--walk-only"] * args.walk_only)


def cmd_config(args: argparse.Namespace) -> int:
    from . import config
    print(config.table())
    return 0


def cmd_cache(args: argparse.Namespace) -> int:
    from .runtime.cache_admin import clear, info
    if args.action == "clear":
        print(clear())
    else:
        print(info())
    return 0


def _explain_args_ok(args: argparse.Namespace) -> str | None:
    """Bad `--html` paths and device names are reported before anything compiles."""
    from .plan.devices import UnknownDevice, table_device
    from .tools.report_html import ReportError, check_writable
    layers = getattr(args, "layers", None)
    if getattr(args, "inductor", False) and layers is None:
        return "--inductor counts Inductor's kernels per layer: it needs --layers"
    if layers is not None:
        clash = [flag for flag, on in (("--what-if", args.what_if is not None), ("--json", args.json),
                                       ("--html", bool(args.html))) if on]
        if clash:
            return f"--layers prints the per-layer summary only; it cannot be combined with {', '.join(clash)}"
        if args.num_layers < 1:
            return f"--num-layers must be at least 1 (got {args.num_layers})"
    try:
        if getattr(args, "html", None):
            check_writable(args.html)
        for name in ([args.device] if getattr(args, "device", None) else []) + list(getattr(args, "what_if", None)
                                                                                 or []):
            table_device(name)
    except (ReportError, UnknownDevice) as e:
        return str(e)
    return None


def _explain_extras(args: argparse.Namespace, report, out) -> int:
    """--what-if / --json / --html after the report was built."""
    import json as _json

    from .tools.whatif import format_table
    table = None
    if args.what_if is not None or args.json or args.html:
        # the device override is in force here: the report was planned for args.device
        table = report.what_if(None, list(args.what_if) if args.what_if else None)
    if args.json:
        print(_json.dumps(table, indent=2), file=out)
    elif args.what_if is not None:
        print(format_table(table))
    if args.html:
        from .tools.report_html import ReportError
        try:
            path = report.to_html(args.html, what_if=table, title="stitchml explain: example transformer block")
        except ReportError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(f"HTML report: {os.path.abspath(path)}")
    return 0


def cmd_explain(args: argparse.Namespace) -> int:
    import contextlib

    import stitchml
    from . import config
    bad = _explain_args_ok(args)
    if bad:
        print(f"error: {bad}", file=sys.stderr)
        return 2
    out = sys.stdout  # --json: only the JSON object goes here, the rest to stderr
    if args.layers is not None:
        with config.override(**({"device": args.device} if args.device else {})):
            return _cmd_explain_layers(args)
    with contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext(), \
            config.override(**({"device": args.device} if args.device else {})):
        report, rc = _cmd_explain(args, stitchml)
        extra = _explain_extras(args, report, out)
    return extra or rc


def _cmd_explain(args: argparse.Namespace, stitchml):
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
    return report, (1 if problems else 0)


LAYER_MODELS = ("example", "bert", "gpt2", "llama")


def _layer_model(args: argparse.Namespace, device: torch.device):
    """(model, inputs, (title, input shapes)) for `explain --layers MODEL` at the command's sizes."""
    from .tools.examples import example_inputs
    from .tools.layers import ExampleStack, reference_blocks
    torch.manual_seed(args.seed)
    if args.layers == "example":
        model = ExampleStack(args.num_layers, args.hidden, args.heads, dropout=0.0, seed=args.seed).to(device)
        inputs = example_inputs(args.batch, args.seq, args.hidden, args.heads, device=device)
        plural = "s" if args.num_layers > 1 else ""
        return model, inputs, (f"{args.num_layers} example transformer block{plural} (hidden={args.hidden}, "
                               f"heads={args.heads})", f"x ({args.batch}, {args.seq}, {args.hidden})")
    name = {"bert": "BERT", "gpt2": "GPT-2", "llama": "LLaMA"}[args.layers]
    model, inputs = reference_blocks(args.batch, args.seq, args.hidden, args.heads, args.num_layers)[name]
    return (model.to(device), tuple(t.to(device) for t in inputs),
            (f"{name}-style model, {args.num_layers} layers (hidden={args.hidden}, heads={args.heads})",
             f"tokens ({args.batch}, {args.seq})"))


def _cmd_explain_layers(args: argparse.Namespace) -> int:
    """`explain --layers`: each nn.ModuleList child planned alone through the capture
    path (pattern rewrites included): kernels, bytes, predicted time per layer."""
    import importlib.util

    from .tools.layers import summarise_layers
    if args.layers != "example" and importlib.util.find_spec("transformers") is None:
        print(f"error: --layers {args.layers} builds a Hugging Face model: `transformers` is not installed",
              file=sys.stderr)
        return 2
    device = _device()
    model, inputs, (title, shapes) = _layer_model(args, device)
    model.train(args.backward)
    print(f"layers of: {title}, {shapes} on {device}")
    print(f"mode: {'training (forward + backward)' if args.backward else 'inference'}; planning only, no kernel "
          "runs" + ("; Inductor compiles each layer for real (slow on a CPU)" if args.inductor else ""))
    if args.inductor and device.type == "cpu":
        print("note: on this CPU Inductor emits C++ (cpp_fused_* loop nests), not GPU kernels: its count is shown "
              "for reference and is not comparable with stitchml's kernel count")
    print()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        summary = summarise_layers(model, *inputs, backward=args.backward, inductor=args.inductor, title=title)
    print(summary.to_text())
    problems = [f"stitchml warning: {w.message}" for w in caught if "stitchml" in str(w.message)]
    if not summary.rows:
        problems.append("no layer was summarised")
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


def _demo_section(title: str, block, x: torch.Tensor, mask: torch.Tensor, *, train: bool,
                  cotangent: torch.Tensor | None, checks: list, problems: list):
    """Run `block` eagerly and compiled (fresh copies, fresh backend), print the plan,
    append (name, relative error) to `checks` and anything that went wrong to `problems`."""
    import traceback

    from .capture.backend import StitchBackend
    from .tools.explain import Report

    tag = "training" if train else "inference"
    eager_blk, comp_blk = copy.deepcopy(block).train(train), copy.deepcopy(block).train(train)
    x_e, x_c = x.clone().requires_grad_(train), x.clone().requires_grad_(train)
    backend = StitchBackend()
    expected = _run_eager(eager_blk, (x_e, mask), train=train, cotangent=cotangent)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            actual = _run_compiled(comp_blk, (x_c, mask.clone()), backend, train=train, cotangent=cotangent)
        except Exception as e:  # report it as a failure, with the traceback
            traceback.print_exc(file=sys.stdout)
            actual = None
            problems.append(f"{tag}: the compiled run raised {type(e).__name__}: {e}")
    report = Report(backend.records, backend.patterns, partitions=backend.partitions)
    _print_plan(title, report)
    if actual is None:
        checks.append((f"{tag} output", float("inf")))
        return report
    problems.extend(f"{tag}: {p}" for p in _problems(report, caught))
    checks.append((f"{tag} output", _rel_err(actual, expected)))
    if not train:
        return report
    checks.append(("grad x", _rel_err(x_c.grad, x_e.grad) if x_c.grad is not None else float("inf")))
    comp_params = dict(comp_blk.named_parameters())
    for name, p_e in eager_blk.named_parameters():
        p_c = comp_params[name]
        if p_c.grad is None or p_e.grad is None:
            checks.append((f"grad {name}", float("inf")))
            problems.append(f"training: no gradient for {name}")
        else:
            checks.append((f"grad {name}", _rel_err(p_c.grad, p_e.grad)))
    return report


def cmd_demo(args: argparse.Namespace) -> int:
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
    _demo_section("inference (eval mode, no grad)", block, x, mask, train=False, cotangent=None,
                  checks=checks, problems=problems)
    # 2. training: forward + backward with a random cotangent; dropout p=0 so that eager and
    #    compiled compute the same numbers
    gen = torch.Generator().manual_seed(args.seed + 1)
    cot = torch.randn(x.shape, generator=gen, dtype=x.dtype).to(device)
    train_report = _demo_section("training forward + backward (train mode, dropout p=0)", block, x, mask,
                                 train=True, cotangent=cot, checks=checks, problems=problems)
    if args.html:  # the explain report of the training step, as a page
        from .tools.report_html import ReportError
        try:
            path = train_report.to_html(args.html, title="stitchml demo: transformer block training step")
            print(f"HTML explain report (training step): {os.path.abspath(path)}\n")
        except ReportError as e:
            problems.append(str(e))

    # 3. verdict
    print(f"--- verification against eager (relative error ||compiled - eager|| / ||eager||, "
          f"tolerance {TOLERANCE:g}) ---")
    bad = [(n, e) for n, e in checks if not e <= TOLERANCE]
    for name, err in checks:
        print(f"  {name:24} {err:.2e}  {'ok' if err <= TOLERANCE else 'FAIL'}")
    for p in problems:
        print(f"  problem: {p}")
    worst_name, worst = max(checks, key=lambda c: c[1])
    n_out = sum(1 for n, _ in checks if n.endswith(" output"))
    n_grads = sum(1 for n, _ in checks if n.startswith("grad "))
    summary = (f"max relative error {worst:.2e} ({worst_name}) over {n_out} outputs and {n_grads} "
               f"gradients, tolerance {TOLERANCE:g}")
    if bad or problems:
        what = "; ".join([f"{n} rel err {e:.2e}" for n, e in bad] + problems)
        print(f"FAIL: {summary}. Failed: {what}")
    else:
        print(f"PASS: {summary}")
    print(f"(demo took {time.perf_counter() - t_start:.1f} s)")
    return 1 if bad or problems else 0


def _exit_on_sigterm(signum, frame) -> None:
    raise SystemExit(128 + signum)


def cmd_bench(args: argparse.Namespace) -> int:
    from .bench.harness import BenchOptions, run_bench, select_cases, ttt_selected
    opts = BenchOptions(suites=tuple(args.suite or ("all",)), cases=tuple(args.case or ()), quick=args.quick,
                        out=args.out, dtype=args.dtype, reps=args.reps, contenders=tuple(args.contender or ()),
                        progress=not args.no_progress, plots=not args.no_plots, resume=args.resume,
                        compile_time=not args.no_compile_time)
    if args.list:
        for spec in select_cases(opts):
            print(f"{spec.suite:10} {spec.name:45} dtypes: {','.join(spec.dtypes)}")
        if ttt_selected(opts):
            print(f"{'time_to_target':10} time_to_target")
        return 0
    if _interpreted(_device()):
        print("stitchml bench: no CUDA GPU in use: Triton kernels run under the interpreter; timings will be "
              "flagged as NOT meaningful.", flush=True)
    # `timeout` sends SIGTERM: exit through the harness's finally, which writes results.md and the
    # plots for what was measured (results.json is already rewritten after every case)
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        run = run_bench(opts)
    finally:
        signal.signal(signal.SIGTERM, previous)
    failed = [(f"{r.case} {r.dtype}", r.contender, r.reason) for r in run.results if r.status == "FAILED"]
    failed += [("time_to_target", r["contender"], r["reason"]) for r in run.time_to_target
               if r["status"] == "FAILED"]
    counts = Counter(r.status for r in run.results)
    print(f"bench: {len(run.results)} results ({', '.join(f'{n} {s}' for s, n in sorted(counts.items()))}), "
          f"{len(run.time_to_target)} time-to-target rows, {run.elapsed_s:.0f} s")
    for what, who, why in failed:
        print(f"  FAILED {what} {who}: {why}")
    print(f"wrote {len(run.files)} files to {run.out}:")
    for f in run.files:
        print(f"  {f}")
    return 0


# --------------------------------------------------------------------------- entry point

def _add_size_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--batch", type=int, default=2, help="batch size (default 2)")
    p.add_argument("--seq", type=int, default=16, help="sequence length (default 16)")
    p.add_argument("--hidden", type=int, default=64, help="hidden size (default 64)")
    p.add_argument("--heads", type=int, default=4, help="attention heads (default 4)")
    p.add_argument("--seed", type=int, default=0, help="random seed for weights and inputs (default 0)")


def cmd_ops(args: argparse.Namespace) -> int:
    from .tools.opstable import table
    print(table(), end="")
    return 0


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
    p.add_argument("--html", metavar="OUT.html", default=None,
                   help="also write the explain report of the training step as a self-contained HTML page")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("explain", help="show what stitchml does with the example block",
                       description="Compile the built-in transformer block with stitchml.explain and print "
                                   "its kernels, schemes, thread mappings, modelled bytes and eager ops.")
    _add_size_args(p)
    p.add_argument("--backward", action="store_true",
                   help="training mode: compile and run forward and backward")
    p.add_argument("--dropout", type=float, default=0.0,
                   help="dropout probability with --backward (default 0.0; eval mode never drops)")
    p.add_argument("--what-if", nargs="*", metavar="DEVICE", default=None,
                   help="predict the step time of the chosen plan and of alternatives (rules, no-global, "
                        "no-horizontal, no-placement, no-product-fold, unfused, the chosen plan on the other "
                        "devices; or only on the DEVICEs named)")
    p.add_argument("--device", metavar="NAME", default=None,
                   help="device of the device table to predict for (H100, H200, A100, cpu; default: the "
                        "visible GPU, else cpu)")
    p.add_argument("--json", action="store_true",
                   help="print the what-if table as one JSON object on stdout (everything else to stderr)")
    p.add_argument("--html", metavar="OUT.html", default=None,
                   help="write the self-contained HTML report (graph, kernels, roofline, refusals, what-if)")
    p.add_argument("--layers", nargs="?", const="example", default=None, choices=LAYER_MODELS, metavar="MODEL",
                   help="per-layer summary instead: each layer planned alone (kernels, bytes moved, predicted "
                        "time, pattern rewrites); MODEL: example (default: a stack of example blocks), bert, "
                        "gpt2, llama (Hugging Face `transformers`, eager attention)")
    p.add_argument("--num-layers", type=int, default=2, metavar="N",
                   help="layers of the --layers model (default 2)")
    p.add_argument("--inductor", action="store_true",
                   help="with --layers: also Inductor's kernel count per layer (compiles each layer with "
                        "Inductor; on a CPU those are C++ loop nests, not GPU kernels)")
    p.set_defaults(func=cmd_explain)

    p = sub.add_parser("config", help="list every knob: environment variable, default, help")
    p.set_defaults(func=cmd_config)

    p = sub.add_parser("ops", help="every core ATen op as stitched, library (with why) or eager (with why)")
    p.set_defaults(func=cmd_ops)

    p = sub.add_parser("cache", help="what the on-disk caches hold (plans, kernel sources, modules, "
                                     "calibrations), or clear them")
    p.add_argument("action", choices=["info", "clear"])
    p.set_defaults(func=cmd_cache)

    p = sub.add_parser("calibrate", help="measure this GPU's copy bandwidth and launch cost for the cost model")
    p.add_argument("--launch-only", action="store_true", help="print the launch overheads, store nothing")
    p.add_argument("--walk-only", action="store_true",
                   help="print the memory latency a walk over row blocks pays a block, store nothing")
    p.set_defaults(func=cmd_calibrate)

    _add_bench_parser(sub)
    return parser


def _add_bench_parser(sub) -> None:
    p = sub.add_parser(
        "bench", help="benchmark stitchml against eager, Inductor, max-autotune and JAX",
        description="Run benchmark suites: every contender on the same inputs, checked against eager before "
                    "timing (a wrong or crashing contender is reported FAILED with the reason). Writes "
                    "OUT/results.json (every sample and the environment), OUT/results.md and PNG plots. "
                    "Without a GPU the kernels run in the Triton interpreter and timings are flagged as not "
                    "meaningful; use --quick there.")
    p.add_argument("--suite", action="append", choices=["micro", "models", "simulator", "time_to_target", "all"],
                   help="suite to run (repeatable; default all)")
    p.add_argument("--case", action="append", metavar="NAME",
                   help="run only this case (repeatable): a full name like 'softmax_fwd[N=4096]', a family "
                        "like 'softmax_fwd', or a glob; see --list")
    p.add_argument("--quick", action="store_true",
                   help="tiny sizes in every suite (a smoke test that runs in minutes on a CPU); also skips "
                        "max-autotune, and on a CPU Inductor for models/simulator/time_to_target")
    p.add_argument("--out", metavar="DIR", default=None,
                   help="output directory (default bench/results/<device>-<date>; with --quick "
                        "bench/out/quick-<device>-<date>, which git ignores)")
    p.add_argument("--dtype", choices=["fp32", "bf16", "both"], default=None,
                   help="element type of the micro and model cases (default: both; fp32 with --quick); the "
                        "simulator and time_to_target always run fp32")
    p.add_argument("--reps", type=int, default=None, metavar="N",
                   help="timed repetitions per case and contender (default 100 on a GPU, 10 on a CPU, 3 with "
                        "--quick); long cases are cut to a ~10 s budget")
    p.add_argument("--contender", action="append", metavar="NAME",
                   choices=["eager", "inductor", "max-autotune", "inductor-ro", "stitchml", "stitchml-nograph",
                            "stitchml-pdl", "jax"],   # (bench.contenders.CONTENDER_NAMES, not imported here)
                   help="run only these contenders (repeatable; default all but stitchml-pdl, the programmatic "
                        "dependent launch A/B, run only when named; eager is the baseline for speedups)")
    p.add_argument("--resume", action="store_true",
                   help="continue the run in OUT (same device): keep the rows OUT/results.json has, measure only "
                        "the missing (case, dtype, contender) rows, rewrite the report over all of them; repeat "
                        "a time-limited command until it says 0 results")
    p.add_argument("--no-compile-time", action="store_true",
                   help="models suite: skip the compile-time measurement (cold call on empty caches, then a "
                        "fresh process on the warm caches: one more compile per row)")
    p.add_argument("--list", action="store_true", help="list the selected cases and exit")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--no-plots", action="store_true", help="do not write PNG plots")
    p.set_defaults(func=cmd_bench)


def _rerun_interpreted(argv: Sequence[str]) -> int:
    """Run `python -m stitchml.cli ARGV` with TRITON_INTERPRET=1 set from the start,
    passing its output through; return its exit code."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    sys.stdout.flush()
    proc = subprocess.Popen([sys.executable, "-m", "stitchml.cli", *argv], env=env,
                            stdout=subprocess.PIPE, text=True, bufsize=1)
    assert proc.stdout is not None
    for line in proc.stdout:
        sys.stdout.write(line)
    sys.stdout.flush()
    return proc.wait()


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if _INTERPRET_TOO_LATE and args.func in (cmd_demo, cmd_explain, cmd_bench):
        # triton was imported before TRITON_INTERPRET was set: its kernels would not run
        return _rerun_interpreted(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
