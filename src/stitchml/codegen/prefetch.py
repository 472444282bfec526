"""Software prefetch for kernels whose programs walk row blocks (`KernelPlan.prefetch`).

A column-partial kernel runs 1-2 programs an SM, each walking 8-16 row blocks one after
another (`plan/mapping.py::_partial_walk`): in each step the program issues the row's
loads and then waits a whole memory latency for them before it computes, so with 8 warps
an SM the DRAM pipe is mostly empty.  H200, 2026-11-30 (bench/results/h200-2026-11-30-b,
models-check): these kernels ran 2.0-2.6x the cost model's bytes-over-bandwidth figure;
time = bytes / bandwidth + walk x ~0.75 us fits four of them within 15%.

Triton pipelines only loads that feed `tl.dot` (checked: `tl.range(num_stages=3)` over
such a walk compiles to plain `ld.global` for sm_90), so the prefetch is written into the
kernel: the loads of the program's next row block are issued at the top of each step,
into loop-carried values, and the step computes on the loads issued one step earlier.
A load is only waited for where its value is first used, so the next block's latency
overlaps this block's arithmetic and stores.

The transformation works on the generated body (straight-line Python statements) by
dataflow on its syntax tree:
- *index* statements compute from the walk variable and loop-invariant names only
  (row indices, masks, column aranges): they are evaluated once more for the next block;
- a `tl.load` whose address and mask are index values that depend on the walk variable
  is hoisted: `pfN` holds the next block's load, `pcN` the current one's;
- everything else (the arithmetic, stores, accumulators of column partials) is unchanged.
The next block index is clamped to the last block, so the last step's prefetch reads a
valid row (the same row for every program: L2 serves it) whatever masks the body has
(`exact_rows` kernels have no row mask).

The same rewrite serves the loops over column blocks of row-looped kernels on a persistent
grid (one program an SM walking rows: `KernelPlan.prefetch` on a `row_looped` kernel, knob
`prefetch_columns`, `planner._walk_prefetch`): each iteration issues the next column
block's loads before its own arithmetic, the last iteration's clamped to the loop's last
block (`codegen/emit_core.py::_column_loop`).
"""
from __future__ import annotations

import ast
import copy
from collections import Counter

_IMPURE = ("load", "store", "atomic", "rand", "debug", "program_id")


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _is_load(node: ast.AST) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "load"
            and isinstance(node.func.value, ast.Name) and node.func.value.id == "tl")


def _pure(node: ast.AST) -> bool:
    """No memory access, random draw or program id (an index statement may be evaluated
    for another block)."""
    for n in ast.walk(node):
        if isinstance(n, ast.Attribute) and any(w in n.attr for w in _IMPURE):
            return False
        if isinstance(n, ast.Name) and any(w in n.id for w in ("rand", "seed")):
            return False
    return True


class _Rename(ast.NodeTransformer):
    def __init__(self, names: dict[str, str]):
        self.names = names

    def visit_Name(self, node: ast.Name) -> ast.AST:
        return ast.copy_location(ast.Name(self.names.get(node.id, node.id), node.ctx), node)


class _HoistLoads(ast.NodeTransformer):
    """Replace each hoistable `tl.load(...)` by the name of its current-block value."""

    def __init__(self, hoistable):
        self.hoistable = hoistable
        self.loads: list[ast.Call] = []

    def visit_Call(self, node: ast.Call) -> ast.AST:
        if _is_load(node) and self.hoistable(node):
            self.loads.append(node)
            return ast.copy_location(ast.Name(f"pc{len(self.loads) - 1}", ast.Load()), node)
        return self.generic_visit(node)


def prefetched_walk(body: list[str], var: str, start: str, stop: int, step: int,
                    last: int | None = None) -> list[str] | None:
    """`for var in range(start, stop, step): body` with the next block's loads issued
    one step ahead, as lines (the `for` included); None when the body is not straight-line
    code or has no load to hoist (the caller keeps the plain walk).  `last`: the walk
    variable's last value, to which the next block is clamped (a loop over column blocks,
    `codegen/emit_core.py::_column_loop`: `start` is then a constant at most `last`); by
    default `stop - 1` (a grid-stride walk over row blocks counted one by one)."""
    try:
        tree = ast.parse("\n".join(body))
    except SyntaxError:
        return None
    stmts = tree.body
    for s in stmts:
        ok = (isinstance(s, ast.Assign) and len(s.targets) == 1 and isinstance(s.targets[0], ast.Name)) \
            or isinstance(s, ast.Expr)
        if not ok:
            return None
    assigned = Counter(s.targets[0].id for s in stmts if isinstance(s, ast.Assign))
    taken = set(assigned) | {n for s in stmts for n in _names(s)}
    if var + "_pf" in taken or any(n.startswith(("pf", "pc")) and n[2:].isdigit() for n in taken):
        return None   # (names this pass adds are in use: leave the body alone)
    # index statements, and which of them follow the walk variable
    index: dict[str, ast.Assign] = {}
    varying: set[str] = {var}
    for s in stmts:
        if not isinstance(s, ast.Assign):
            continue
        name, used = s.targets[0].id, _names(s.value)
        if assigned[name] != 1 or name == var or not _pure(s.value):
            continue
        if all(u == var or u in index or u not in assigned for u in used):
            index[name] = s
            if used & varying:
                varying.add(name)

    def hoistable(call: ast.Call) -> bool:
        used = _names(call)
        return (all(u == var or u in index or u not in assigned for u in used)
                and bool(used & varying))

    hoist = _HoistLoads(hoistable)
    new_body = [hoist.visit(s) for s in stmts]
    if not hoist.loads:
        return None
    # the index statements the hoisted loads need, in body order
    need: set[str] = set()
    frontier = set().union(*(_names(c) for c in hoist.loads))
    while frontier:
        n = frontier.pop()
        if n in index and n not in need:
            need.add(n)
            frontier |= _names(index[n].value)
    ahead = {n: n + "_pf" for n in need} | {var: var + "_pf"}
    ahead_stmts = [ast.unparse(_Rename(ahead).visit(copy.deepcopy(index[n])))
                   for n in (s.targets[0].id for s in stmts if isinstance(s, ast.Assign)) if n in need]
    ahead_loads = [f"pf{i} = {ast.unparse(_Rename(ahead).visit(copy.deepcopy(c)))}" for i, c in enumerate(hoist.loads)]
    # (a tensor before the loop as in it: Triton carries a name assigned in a loop through it)
    first = (f"{var}_pf = tl.minimum({start}, {stop - 1})" if last is None
             else f"{var}_pf = tl.full([], {start}, tl.int32)")
    last = stop - 1 if last is None else last
    lines = [first] + ahead_stmts + ahead_loads
    lines.append(f"for {var} in range({start}, {stop}, {step}):")
    inner = [f"pc{i} = pf{i}" for i in range(len(hoist.loads))]
    inner += [f"{var}_pf = tl.minimum({var} + {step}, {last})"] + ahead_stmts + ahead_loads
    inner += [ast.unparse(s) for s in new_body]
    return lines + ["    " + x for x in inner]


__all__ = ["prefetched_walk"]
