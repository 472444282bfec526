"""Shrinking a failing program while it keeps failing the same way."""
from __future__ import annotations

import re
from dataclasses import replace

from .cases import CaseResult, check
from .programs import Program


def _category(r: CaseResult) -> str:
    return re.sub(r"[-+.e\d]+", "#", r.message)[:40]


def _dce(prog: Program) -> Program:
    """Lines no output needs dropped; a statement (an in-place write to an input, e.g.
    `a3.copy_(v10.clone())`) is a side effect: kept, with what it reads."""
    needed = set(prog.outputs)
    keep = []
    for line in reversed(prog.lines):
        name, expr = line.split(" = ", 1) if " = " in line else (None, line)
        if name is None or name in needed:
            keep.append(line)
            needed |= set(re.findall(r"\b[av]\d+\b", expr))
    inputs = [i for i in prog.inputs if i.name in needed]
    # the inputs whose write is still a statement, renumbered (compared after the call)
    writes = {line.split(".copy_(", 1)[0] for line in keep if " = " not in line}
    written = [k for k, i in enumerate(inputs) if i.name in writes and prog.inputs.index(i) in prog.written]
    return replace(prog, knobs=dict(prog.knobs), inputs=inputs, lines=keep[::-1], outputs=list(prog.outputs),
                   written=written)


def reduce_program(prog: Program, budget: int = 200) -> tuple[Program, CaseResult]:
    """Greedily shrink a failing program while it fails the same way: fewer outputs (down
    to one earlier value), default knobs, contiguous inputs, no backward."""
    first = check(prog)
    if first.status not in ("fail", "error"):
        return prog, first
    want, best, best_r = _category(first), _dce(prog), first
    tries = 0

    def candidates(p: Program):
        names = [line.split(" = ", 1)[0] for line in p.lines if " = " in line]
        for v in names:
            yield replace(p, outputs=[v])
        for i, line in enumerate(p.lines):   # an in-place write less
            if " = " not in line:
                yield replace(p, lines=p.lines[:i] + p.lines[i + 1:])
        for o in p.outputs:
            if len(p.outputs) > 1:
                yield replace(p, outputs=[x for x in p.outputs if x != o])
        for k in p.knobs:
            yield replace(p, knobs={a: b for a, b in p.knobs.items() if a != k})
        for i, spec in enumerate(p.inputs):
            if spec.layout != "contiguous":
                yield replace(p, inputs=p.inputs[:i] + [replace(spec, layout="contiguous")] + p.inputs[i + 1:])
        if p.backward:
            yield replace(p, backward=False)

    improved = True
    while improved and tries < budget:
        improved = False
        for cand in candidates(best):
            cand = _dce(cand)
            if (cand.num_ops, len(cand.describe())) >= (best.num_ops, len(best.describe())):
                continue
            tries += 1
            r = check(cand)
            if r.status == first.status and _category(r) == want:
                best, best_r, improved = cand, r, True
                break
            if tries >= budget:
                break
    return best, best_r
