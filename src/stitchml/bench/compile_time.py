"""Compile time in the models suite (issue 14.5).

For every contender and model row:
- cold: the first call in the bench process (Dynamo + AOTAutograd + the backend's
  compile + the first run), with EMPTY on-disk caches: the harness points Triton's,
  Inductor's and stitchml's cache directories at a fresh folder for the row
  (`isolated_caches`), so an earlier run on the same machine cannot make it warm;
- warm cache, fresh process: a subprocess (`python -m stitchml.bench.compile_time`)
  with the SAME cache folder builds the same case and makes its first call; its time
  to the end of that call is what a restarted job pays (`fresh_process`);
- for stitchml, the split of its compile into lowering, planning, code generation,
  the plan-cache lookup/store, Triton compilation and loading, and their sum up to
  code generation (`plan_codegen_s`: lower + plan-cache + plan + codegen, the figure
  issue 14 bounds on CPU), read from the backend's records (`stitch_split`:
  `CompiledGraph.times`, where the pipeline keeps them; degrades to `compile_seconds`
  alone), and the rest of the cold call as "other" (Dynamo/AOT tracing, Triton
  compiling at first launch when no compile pool ran, the first run itself).

Caveat (written in every row's method): Inductor's compile-worker processes are started
once per bench process, with the cache directory of the row that started them; rows
compile different graphs, so they do not share kernels, but that is not enforced.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator, Sequence

CACHE_ENV = ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "STITCHML_CACHE_DIR")
FRESH_TIMEOUT_S = 900.0
RESULT_TAG = "STITCHML_COMPILE_TIME "


def cache_env(root: Path) -> dict[str, str]:
    return {var: str(root / var.split("_")[0].lower()) for var in CACHE_ENV}


@contextlib.contextmanager
def isolated_caches(root: Path) -> Iterator[dict[str, str]]:
    """Point the three compile caches at empty folders under `root` for the block."""
    env = cache_env(root)
    saved = {k: os.environ.get(k) for k in env}
    for path in env.values():
        Path(path).mkdir(parents=True, exist_ok=True)
    os.environ.update(env)
    try:
        yield env
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# stitchml's compile stages: (our key, field of CompiledGraph.times (pipeline.StageTimes), older flat field)
STAGES = (("lower_s", "lower_s", "lower_seconds"), ("plan_s", "plan_s", "plan_seconds"),
          ("codegen_s", "codegen_s", "codegen_seconds"), ("plan_cache_s", "plan_cache_s", "plan_cache_seconds"),
          ("triton_s", "compile_s", "triton_seconds"), ("load_s", "load_s", "load_seconds"))
UP_TO_CODEGEN = ("lower_s", "plan_cache_s", "plan_s", "codegen_s")


def _stage(rec: Any, times_field: str, flat_field: str) -> float | None:
    times = getattr(rec, "times", None)
    v = getattr(times, times_field, None) if times is not None else None
    if v is None:
        v = getattr(rec, flat_field, None)
    return None if v is None else float(v)


def cache_files(root: Path) -> dict[str, int]:
    """Files in each of the row's cache folders: a cold call that wrote nothing into its
    folder did not honour the variable, and the fresh process then measures no warm cache."""
    return {var: sum(1 for f in Path(path).rglob("*") if f.is_file()) if Path(path).exists() else 0
            for var, path in cache_env(root).items()}


def stitch_split(records: Sequence[Any]) -> dict[str, Any]:
    """stitchml's compile time over the graphs of one model, from `CompiledGraph`s:
    total (`compile_seconds`: lower + plan + codegen + load, + Triton where compiled
    ahead of the first launch), per stage where the records carry `times`
    (pipeline.StageTimes) or flat `*_seconds` fields, else None (older compiler), and
    the first call of each graph (`first_call_seconds`: Triton compiles there when no
    compile pool ran)."""
    out: dict[str, Any] = {"graphs": len(records),
                           "compile_s": sum(float(getattr(r, "compile_seconds", 0.0) or 0.0) for r in records)}
    for key, times_field, flat_field in STAGES:
        vals = [_stage(r, times_field, flat_field) for r in records]
        out[key] = sum(v for v in vals if v is not None) if vals and all(v is not None for v in vals) else None
    parts = [out[k] for k in UP_TO_CODEGEN]
    out["plan_codegen_s"] = sum(parts) if all(v is not None for v in parts) else None
    firsts = [getattr(r, "first_call_seconds", None) for r in records]
    out["first_calls_s"] = sum(float(v) for v in firsts) if firsts and all(v is not None for v in firsts) else None
    out["plan_cache_hits"] = sum(bool(getattr(getattr(r, "times", None), "plan_cached", False)) for r in records)
    out["kernels"] = sum(len(getattr(r, "kernels", None) or {}) for r in records)
    return out


def summarise(cold_s: float | None, split: dict[str, Any] | None) -> dict[str, Any]:
    out: dict[str, Any] = {"cold_s": cold_s}
    if split is not None:
        out["stitch"] = split
        if cold_s is not None:
            out["other_s"] = max(0.0, cold_s - split["compile_s"])
    return out


def fresh_process(case: str, dtype: str, contender: str, root: Path, *, quick: bool,
                  timeout_s: float = FRESH_TIMEOUT_S) -> dict[str, Any]:
    """Run the case's first call in a new Python process with the caches under `root`
    (filled by the cold call before): {first_call_s, process_s, stitch split, ...} or
    {"error": why}."""
    cmd = [sys.executable, "-m", "stitchml.bench.compile_time", "--case", case, "--dtype", dtype,
           "--contender", contender] + (["--quick"] if quick else [])
    env = dict(os.environ, **cache_env(root))
    src = str(Path(__file__).resolve().parents[2])      # run from source too (PYTHONPATH=src on the GPU machines)
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"error": f"fresh process timed out after {timeout_s:.0f} s"}
    wall = time.perf_counter() - t0
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(RESULT_TAG):
            data = json.loads(line[len(RESULT_TAG):])
            data["process_s"] = wall
            return data
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
    return {"error": f"fresh process exited {proc.returncode} without a result: {' | '.join(tail)[:400]}"}


def measure_in_fresh_process(case: str, dtype: str, contender: str, quick: bool) -> dict[str, Any]:
    """The child's side: build the case, make its first call, report."""
    import torch

    from .contenders import make_cotangents
    from .harness import make_context, pick_contenders, suite_cases
    from .workload import flat_tensors
    t_start = time.perf_counter()
    specs = [s for s in suite_cases("models", quick) if s.name == case]
    if not specs:
        return {"error": f"no models case {case!r}"}
    from .harness import BenchOptions
    ctx = make_context(BenchOptions(quick=quick))
    w = specs[0].build(dtype, ctx.device)
    if w.mode != "fwd":     # the cotangents come from eager's outputs (as in the bench process)
        torch.manual_seed(0)
        with torch.enable_grad():
            outs = flat_tensors(w.fn(*w.inputs))
        w.cotangents = make_cotangents(w, outs)
        del outs
    c = pick_contenders([contender])[0]
    t_setup = time.perf_counter() - t_start
    p = c.prepare(w, ctx)
    out: dict[str, Any] = {"first_call_s": p.cold_s, "setup_s": t_setup, "problems": p.problems}
    backend = getattr(c, "backend", None)
    if backend is not None:
        out["stitch"] = stitch_split(backend.records)
    return out


def cleanup(root: Path) -> None:
    shutil.rmtree(root, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="one models-suite case's first call in this process (compile "
                                             "time with whatever caches the environment points at)")
    ap.add_argument("--case", required=True)
    ap.add_argument("--dtype", default="fp32")
    ap.add_argument("--contender", required=True)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    try:
        res = measure_in_fresh_process(args.case, args.dtype, args.contender, args.quick)
    except Exception as e:   # report, do not crash the parent's row
        res = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    print(RESULT_TAG + json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
