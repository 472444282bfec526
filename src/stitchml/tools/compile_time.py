"""Where compile time goes, on any machine: planning + code generation of a model's
training graphs (BERT-base by default), cold (empty caches) and warm (a second process
with the caches the first one left), and optionally the Triton compilation of the
distinct kernels for a GPU target without a GPU (sm_90), serial and in parallel.

    python -m stitchml.tools.compile_time [--layers 12] [--aot] [--json]

Each measurement runs in a fresh process (`--one` is that process): the figures are
what a user's first and second job see.  Capture (Dynamo + AOTAutograd) is not
counted: it is the same for every backend.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch._dynamo.backends.common import aot_autograd


def _graphs(layers: int, batch: int, seq: int) -> list[tuple[str, torch.fx.GraphModule]]:
    """The forward and backward ATen graphs of a BERT training step (our decompositions)."""
    from ..capture.decomp import decomposition_table
    from .graphstats import bert_base
    model, ids = bert_base(batch, seq, layers)
    found: list[tuple[str, torch.fx.GraphModule]] = []

    def keep(kind):
        def compiler(gm, example_inputs):
            found.append((kind, gm))
            return gm.forward
        return compiler

    backend = aot_autograd(fw_compiler=keep("forward"), bw_compiler=keep("backward"),
                           decompositions=decomposition_table())
    torch._dynamo.reset()
    out = torch.compile(model, backend=backend)(ids)
    out.last_hidden_state.float().sum().backward()
    return found


def measure_once(layers: int, batch: int, seq: int, aot: bool) -> dict:
    """(In this process) plan + generate every graph; optionally compile for sm_90."""
    from .. import pipeline
    from ..runtime import kernel_cache, plan_cache
    graphs = _graphs(layers, batch, seq)
    out: dict = {"graphs": []}
    c0, t0 = time.process_time(), time.perf_counter()
    built = []
    for kind, gm in graphs:
        b = pipeline.build_static(gm, torch.device("cuda"))   # code for a GPU; nothing runs
        built.append(b)
        t = b.times
        out["graphs"].append({"kind": kind, "kernels": len(b.plan.kernels), "lower_s": t.lower_s,
                              "plan_s": t.plan_s, "codegen_s": t.codegen_s, "plan_cached": t.plan_cached})
    out["wall_s"] = time.perf_counter() - t0
    out["cpu_s"] = time.process_time() - c0
    texts = {f"{i}.{n}": ks.source for i, b in enumerate(built) for n, ks in b.kernels.items()}
    out["kernel_sources"] = len(texts)
    out["distinct_bodies"] = len({kernel_cache._body_key(t)[0] for t in texts.values()})
    out["kernel_cache"] = dict(kernel_cache.STATS)
    out["plan_cache"] = dict(plan_cache.STATS)
    if aot:
        from ..runtime.precompile import compile_for_target, shutdown
        kernels = {f"{i}.{n}": ks for i, b in enumerate(built) for n, ks in b.kernels.items()}
        graph_of = {f"{i}.{n}": b.graph for i, b in enumerate(built) for n in b.kernels}
        merged = _OneGraph(graph_of, kernels)
        out["aot_parallel"] = compile_for_target(merged.kernels, merged, parallel=True)
        shutdown()
    return out


class _OneGraph:
    """Kernels of several graphs addressed as one (node ids prefixed by the graph)."""

    def __init__(self, graph_of: dict, kernels: dict):
        from dataclasses import replace
        self.graphs = graph_of
        self.kernels = {}
        for name, ks in kernels.items():
            params = [(kind, (name, nid)) if nid >= 0 else (kind, nid) for kind, nid in ks.params]
            self.kernels[name] = replace(ks, params=params)

    def __getitem__(self, key):
        name, nid = key
        return self.graphs[name][nid]


def _run(cache: str, args: argparse.Namespace, aot: bool) -> dict:
    env = dict(os.environ, STITCHML_CACHE_DIR=cache, STITCHML_PLAN_CACHE="1")
    env.setdefault("STITCHML_DEVICE", "H100")   # plan for the GPU the kernels are for
    if aot:
        env.pop("TRITON_INTERPRET", None)
    cmd = [sys.executable, "-m", "stitchml.tools.compile_time", "--one", "--layers", str(args.layers),
           "--batch", str(args.batch), "--seq", str(args.seq)] + (["--aot"] if aot else [])
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
    if res.returncode != 0:
        raise RuntimeError(f"measurement process failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--aot", action="store_true", help="also compile the distinct kernels for sm_90 (no GPU)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(measure_once(args.layers, args.batch, args.seq, args.aot)))
        return 0
    with tempfile.TemporaryDirectory(prefix="stitchml-compile-time-") as cache:
        cold = _run(cache, args, args.aot)
        warm = _run(cache, args, False)
    result = {"model": f"BERT-base training ({args.layers} layers, b{args.batch} s{args.seq})",
              "cold": cold, "warm": warm, "machine": f"{os.cpu_count()} cores", "torch": torch.__version__}
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    print(result["model"], "on", result["machine"])
    for name, r in (("cold", cold), ("warm", warm)):
        stages = " + ".join(f"{g['kind']} lower {g['lower_s']:.2f}s plan {g['plan_s']:.2f}s codegen "
                            f"{g['codegen_s']:.2f}s{' (cached)' if g['plan_cached'] else ''}" for g in r["graphs"])
        print(f"  {name}: lower+plan+codegen {r['wall_s']:.2f} s wall, {r['cpu_s']:.2f} s CPU  [{stages}]")
    print(f"  kernels {cold['kernel_sources']}, distinct bodies {cold['distinct_bodies']} "
          f"(generated {cold['kernel_cache']['generated']}, reused in memory {cold['kernel_cache']['memory_hits']})")
    if "aot_parallel" in cold:
        a = cold["aot_parallel"]
        print(f"  sm_90 compile of {a['distinct']} distinct kernels: {a['wall_s']:.1f} s wall on {a['workers']} "
              f"workers (sum of per-kernel times {a['sum_s']:.1f} s); failures: {len(a['failed'])}")
        for f in a["failed"][:5]:
            print("    ", f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
