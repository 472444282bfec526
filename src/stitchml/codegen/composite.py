"""Launch fusion built from finished kernel bodies.

- horizontal (HFuse): independent kernels in one launch; program ids [0, g0) run
  body 0, [g0, g0 + g1) run body 1, and so on.
- global (AStitch's global scheme): dependent kernels as phases of one persistent
  launch.  Every program walks each phase's virtual program ids with a grid stride;
  a grid barrier separates phases.  The grid must not exceed the programs resident in
  one wave, or programs spinning at the barrier starve those not yet scheduled.
  The phase-split twin is simply the member kernels launched one by one.
"""
from __future__ import annotations

import ast
import functools
import io
import tokenize
from typing import Sequence

from .kernel_source import KernelSource

BARRIER = '''
@triton.jit
def _grid_barrier(counter, target):
    # every program adds 1; all wait until the count reaches `target`.  The counter
    # only grows: the host passes a new base per launch, so no reset is needed (under
    # CUDA graphs the wrapper zeroes it before the launch instead: a replay repeats bases).
    tl.debug_barrier()
    tl.atomic_add(counter, 1, sem="release", scope="gpu")
    seen = tl.atomic_add(counter, 0, sem="acquire", scope="gpu")
    while seen < target:
        seen = tl.atomic_add(counter, 0, sem="acquire", scope="gpu")
    tl.debug_barrier()
'''


def _as_function(body: Sequence[str]) -> str:
    return "def _body():\n" + "".join("    " + line + "\n" for line in body)


def local_names(param_names: Sequence[str], body: Sequence[str]) -> set[str]:
    """Every name a kernel body binds (parameters, assignment and loop targets, tuple
    targets included), read from its syntax tree."""
    names = set(param_names)
    for node in ast.walk(ast.parse(_as_function(body))):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return names


def _renamed(ks: KernelSource, prefix: str, pid: str) -> tuple[list[str], list[str]]:
    """The body with its own names prefixed and `tl.program_id(0)` replaced by `pid`.
    Works on tokens: attribute names (`tl.sum`) and keyword names (`axis=`) are never
    renamed, whatever locals the body has."""
    body = _renamed_body(tuple(ks.body), tuple(ks.param_names), prefix, pid)
    return list(body), [prefix + p for p in ks.param_names]


@functools.lru_cache(maxsize=4096)
def _renamed_body(body: tuple[str, ...], param_names: tuple[str, ...], prefix: str, pid: str) -> tuple[str, ...]:
    # (once per body: a 12-layer model's launch groups repeat the same members 12 times,
    # and tokenizing them was a third of BERT-base's code generation on the 2-core CPU)
    names = local_names(param_names, body)
    text = _as_function(body)
    starts = [0]
    for line in text.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    toks = [t for t in tokenize.generate_tokens(io.StringIO(text).readline)]
    edits: list[tuple[int, int, str]] = []
    depth = 0
    for i, t in enumerate(toks):
        if t.type == tokenize.OP:
            depth += (t.string in "([{") - (t.string in ")]}")
        if t.type != tokenize.NAME:
            continue
        a = starts[t.start[0] - 1] + t.start[1]
        b = starts[t.end[0] - 1] + t.end[1]
        prev, nxt = toks[i - 1].string, toks[i + 1].string if i + 1 < len(toks) else ""
        if t.string == "tl" and nxt == "." and [x.string for x in toks[i + 2:i + 6]] == ["program_id", "(", "0", ")"]:
            edits.append((a, starts[toks[i + 5].end[0] - 1] + toks[i + 5].end[1], pid))
        elif t.string in names and prev != "." and not (nxt == "=" and depth > 0) and t.string != "_body":
            edits.append((a, b, prefix + t.string))
    out, pos = [], 0
    for a, b, new in edits:
        out.append(text[pos:a])
        out.append(new)
        pos = b
    out.append(text[pos:])
    lines = "".join(out).split("\n")[1:]
    return tuple(line[4:] for line in lines if line.strip())


def horizontal(name: str, members: list[KernelSource]) -> KernelSource:
    body = ["pid = tl.program_id(0)"]
    params: list = []
    names: list[str] = []
    start = 0
    for i, ks in enumerate(members):
        lines, pnames = _renamed(ks, f"h{i}_", f"(pid - {start})")
        cond = f"pid < {start + ks.grid}"
        body.append(("if " if i == 0 else "elif ") + cond + ":")
        body.extend("    " + x for x in lines)
        params += ks.params
        names += pnames
        start += ks.grid
    return KernelSource(name, params, names, body, start, max(k.num_warps for k in members), {})


def persistent(name: str, phases: list[KernelSource], grid: int) -> KernelSource:
    body = ["pid = tl.program_id(0)"]
    params: list = []
    names: list[str] = []
    for i, ks in enumerate(phases):
        lines, pnames = _renamed(ks, f"g{i}_", f"g{i}_vpid")
        body.append(f"for g{i}_vpid in range(pid, {ks.grid}, {grid}):")
        body.extend("    " + x for x in lines)
        if i + 1 < len(phases):
            body.append(f"_grid_barrier(counter, base + {(i + 1) * grid})")
        params += ks.params
        names += pnames
    params += [("counter", -1), ("base", -1)]
    names += ["counter", "base"]
    return KernelSource(name, params, names, body, grid, max(k.num_warps for k in phases), {})
