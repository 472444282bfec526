"""Compile for sm_90 every kernel a run under the interpreter launched (knob `record_launches`).

    STITCHML_RECORD_LAUNCHES=DIR TRITON_INTERPRET=1 python -m pytest tests ...
    TRITON_INTERPRET=0 python -m stitchml.tools.aot_replay DIR [--jobs N] [--arch 90]

The interpreter runs any Python that Triton's language accepts; a GPU compiles it through
MLIR, LLVM and ptxas, which refuse some of it.  A kernel that only the interpreter ever
ran could fail its first compile on a user's GPU (and its graph fall back to eager).  This
tool reads the launches a run recorded (`runtime/launch_record.py`: module file, function,
argument types, the JIT's specialisation, launch options), drops repeats, compiles each
with Triton for the target (no GPU needed) in a process pool and prints every failure with
its module file.  A kernel refused at its warp count is compiled at the others, as the
launcher does on a GPU (`launcher.compiling_warps`): the verdict says which count it would
run at, or that none compiles (then its graph would run eagerly, with a warning).  Exit
status 1 if a kernel compiles at no warp count.  Triton must not be in interpreter mode.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any


def read_records(folder: str) -> list[dict]:
    """The distinct launch records under `folder` (every `launches-*.jsonl`)."""
    seen: dict[str, dict] = {}
    for f in sorted(Path(folder).glob("launches-*.jsonl")):
        for line in f.read_text(encoding="utf-8").splitlines():
            if line.strip() and line not in seen:
                seen[line] = json.loads(line)
    return list(seen.values())


def _function(path: str, name: str) -> Any:
    """The Triton function `name` of module file `path`: a generated kernel module (run
    with the helpers' namespace, as the runtime loads it) or a module of stitchml."""
    import importlib

    import stitchml
    package = Path(stitchml.__file__).resolve().parent
    p = Path(path).resolve()
    if package in p.parents:
        rel = p.relative_to(package.parent).with_suffix("")
        return getattr(importlib.import_module(".".join(rel.parts)), name)
    from ..runtime.kernel_cache import exec_kernel_module
    return getattr(exec_kernel_module(p, f"stitchml_replay_{p.stem}"), name)


def compile_record(rec: dict, arch: int = 90) -> dict:
    """Compile one recorded launch for sm_`arch`: {ok, registers, spills | error}; a
    refused one that is not a grid-barrier kernel also gets `warps`: the first other
    warp count that compiles (the launcher's retry), None if none does."""
    from ..runtime.launcher import compiling_warps
    from .aot_check import compile_function
    try:
        fn = _function(rec["path"], rec["name"])
    except Exception as e:   # (a module that no longer loads is a verdict too)
        return {"ok": False, "error": f"{type(e).__name__}: {str(e)[:500]}"}
    verdict = compile_function(fn, rec["sig"], rec["consts"], rec["options"], arch, rec["aligned"])
    options = rec["options"]
    if not verdict["ok"] and "maxnreg" not in options:
        def compile_at(warps: int) -> None:
            other = compile_function(fn, rec["sig"], rec["consts"], {**options, "num_warps": warps}, arch,
                                     rec["aligned"])
            if not other["ok"]:
                raise RuntimeError(other["error"])
        verdict["warps"] = compiling_warps(compile_at, int(options.get("num_warps", 4)))
    return verdict


def _compile_chunk(recs: list[dict], arch: int) -> list[dict]:
    return [compile_record(r, arch) for r in recs]


def replay(folder: str, jobs: int = 1, arch: int = 90) -> list[tuple[dict, dict]]:
    """(record, verdict) for every distinct launch recorded under `folder`."""
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise RuntimeError("aot_replay needs Triton out of interpreter mode (TRITON_INTERPRET=0)")
    recs = read_records(folder)
    if jobs <= 1 or len(recs) < 2:
        return list(zip(recs, _compile_chunk(recs, arch)))
    chunks = [recs[i::jobs] for i in range(jobs)]
    with ProcessPoolExecutor(jobs) as pool:
        verdicts = list(pool.map(_compile_chunk, chunks, [arch] * jobs))
    return [(r, v) for chunk, vs in zip(chunks, verdicts) for r, v in zip(chunk, vs)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", help="the folder the run recorded its launches into (knob record_launches)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="compiling processes")
    ap.add_argument("--arch", type=int, default=90, help="CUDA compute capability compiled for (90: Hopper)")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    results = replay(a.folder, a.jobs, a.arch)
    failed = [(r, v) for r, v in results if not v["ok"]]
    lost = [(r, v) for r, v in failed if v.get("warps") is None]
    spilled = [(r, v) for r, v in results if v["ok"] and v.get("spills")]
    import triton
    print(f"{len(results)} distinct launches compiled for sm_{a.arch} by Triton {triton.__version__} "
          f"in {time.perf_counter() - t0:.0f} s: {len(results) - len(failed)} ok, {len(failed)} failed "
          f"({len(failed) - len(lost)} of them compile at another warp count), {len(spilled)} with stack use")
    for r, v in failed:
        retry = (f"compiles at {v['warps']} warps: the launch runs there" if v.get("warps") is not None
                 else "compiles at no warp count: its graph would run eagerly")
        print(f"FAILED {r['path']} {r['name']} {r['sig']} {r['consts']} {r['options']} ({retry})\n    {v['error']}")
    for r, v in spilled:
        print(f"stack {v['spills']} bytes, {v['registers']} registers: {r['path']} {r['name']}")
    return 1 if lost else 0


if __name__ == "__main__":
    sys.exit(main())
