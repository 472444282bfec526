"""Recording kernel launches for an ahead-of-time compile (knob `record_launches`).

The tests, the model sweeps and the fuzzer run every kernel through Triton's
interpreter, which accepts code that the real compiler refuses (a dtype mix, a block
shape, a construct the GPU lowering lacks).  With the knob set to a folder, each
distinct launch is appended to `FOLDER/launches-<pid>.jsonl`: the kernel's module file
and function name, the Triton signature of its arguments, what the JIT would specialise
(an integer equal to 1 becomes the constant 1, a pointer or integer divisible by 16 is
marked so, as on a GPU) and the launch options.  `tools/aot_replay.py` compiles every
recorded kernel for sm_90.  Only kernels whose module is a file (stitchml's generated
kernels and its Triton ops) are recorded; a launch that cannot be described is skipped,
never an error of the run.
"""
from __future__ import annotations

import inspect
import json
import os
from pathlib import Path
from typing import Any

from .. import config
from .launcher import arg_spec

_SEEN: set[tuple[str, str]] = set()   # (folder, record) written by this process


def describe(fn: Any, args: tuple, options: dict) -> dict | None:
    """The JSON-ready record of launching Triton function `fn` with `args` and
    `options`, or None where it cannot be described (no source file, an argument of
    an unknown kind)."""
    from ..codegen.triton_ops import SIG_DTYPE
    py = getattr(fn, "fn", None)
    code = getattr(py, "__code__", None)
    if code is None or not os.path.isfile(code.co_filename):
        return None
    params = list(inspect.signature(py).parameters.values())
    fresh = set((getattr(fn, "kwargs", None) or {}).get("do_not_specialize") or ())   # (the interpreter's)
    fresh |= {p.name for p in getattr(fn, "params", ()) if getattr(p, "do_not_specialize", False)}   # (the JIT's)
    bound = dict(zip((p.name for p in params), args))
    for p in params:
        if p.name not in bound:
            if p.name in options:
                bound[p.name] = options[p.name]
            elif p.default is not inspect.Parameter.empty:
                bound[p.name] = p.default
            else:
                return None
    values = [bound[p.name] for p in params]
    sig: dict[str, str] = {}
    consts: dict[str, Any] = {}
    aligned: list[str] = []
    # what the JIT specialises on, as the launcher's checks see it (`launcher.arg_spec`)
    for p, v, spec in zip(params, values, arg_spec(tuple(values))):
        if "constexpr" in str(p.annotation):
            if not isinstance(v, (bool, int, float, str, type(None))):
                return None
            consts[p.name] = v
        elif hasattr(v, "data_ptr"):
            if v.dtype not in SIG_DTYPE:
                return None
            sig[p.name] = "*" + SIG_DTYPE[v.dtype]
            if spec[0]:
                aligned.append(p.name)
        elif isinstance(v, bool):
            sig[p.name] = "i1"
        elif isinstance(v, int):
            narrow, one, by16 = spec
            if one and p.name not in fresh:
                consts[p.name] = 1
                continue
            sig[p.name] = "i32" if narrow else "i64"
            if by16 and p.name not in fresh:
                aligned.append(p.name)
        elif isinstance(v, float):
            sig[p.name] = "fp32"
        elif v is None:
            consts[p.name] = None
        else:
            return None
    opts = {k: v for k, v in options.items()
            if (k in ("num_warps", "num_stages", "maxnreg") and isinstance(v, int))
            or (k == "launch_pdl" and isinstance(v, bool))}
    return {"path": code.co_filename, "name": py.__name__, "sig": sig, "consts": consts, "aligned": aligned,
            "options": opts}


def record(fn: Any, args: tuple, options: dict) -> None:
    """Append the launch's record to the knob's folder, once per distinct record."""
    folder = config.get("record_launches")
    if not folder:
        return
    try:
        rec = describe(fn, args, options)
    except Exception:   # (a launch that cannot be described is not an error of the run)
        return
    if rec is None:
        return
    line = json.dumps(rec, sort_keys=True)
    if (folder, line) in _SEEN:
        return
    _SEEN.add((folder, line))
    path = Path(folder)
    path.mkdir(parents=True, exist_ok=True)
    with open(path / f"launches-{os.getpid()}.jsonl", "a", encoding="utf-8") as f:
        f.write(line + "\n")


__all__ = ["describe", "record"]
