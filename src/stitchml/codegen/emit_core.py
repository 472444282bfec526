"""The index/scope core of the Triton emitter: names, scopes, the domain's axis
variables, masks, and *pulling* values.

Code is emitted by pulling: each kernel output is requested at its index (symbolic
expressions of the domain's axis variables, `ir/index.py`) and every producer is
requested at the index its consumer maps to, through views.  Requests are memoised
per scope, so a value pulled twice at the same index is computed once
(operator-level reuse), and a value whose index depends only on the row axis is
computed once per row and broadcast (element-level reuse of regional stitching).

Reductions (`emit_reduce.py`) and stores (`emit_store.py`) build on this core; the
drivers per kernel form are in `triton_kernel.py`.
"""
from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Collection, Iterable, Iterator

import torch

from ..ir import index as ix
from ..ir import nodes as ir
from ..plan.data import KernelPlan
from ..plan.graph_view import is_free
from ..plan.row_loops import online_partner, through_views
from .prefetch import prefetched_walk
from .triton_ops import (HALF_EXACT_OPS, TL_DTYPE, bitcast_expr, cast_expr, compute_dtype, literal, pointwise_expr,
                         round_half)

_RANDOM_CALLS = ("tl.rand", "_rand4(", "_randn4(")   # expressions `emit` never shares

if TYPE_CHECKING:
    from .emit_reduce import Reductions

ROW, COL = "row", "col"
# a concatenation of at least this many buffers read at one offset picks a base pointer
# by position and loads once, instead of loading every part under a mask (`_cat_by_pointer`)
CAT_POINTER_PARTS = 4
# selects by position nest at most this deep in one expression, then go through a value of
# their own: Python's parser refuses ~200 nested parentheses (fuzz seed 32198: the gradient
# of one chunk of a split into 216, a select over 216 parts)
SELECT_NESTING = 64


def _select_by_position(pos: str, parts: list[tuple[int, str]], named: Callable[[str], str]) -> str:
    """`tl.where(pos < end_0, v_0, tl.where(pos < end_1, v_1, ... v_last))` over parts
    (end, value text) in order, each SELECT_NESTING levels handed to `named` (which emits
    the expression and returns its value's name) so that no expression nests deeper."""
    result = parts[-1][1]
    for depth, (end, value) in enumerate(reversed(parts[:-1]), 1):
        result = f"tl.where({pos} < {end}, {value}, {result})"
        if depth % SELECT_NESTING == 0:
            result = named(result)
    return result


@dataclass(frozen=True)
class Val:
    name: str
    axes: frozenset
    dtype: torch.dtype  # compute dtype


@dataclass
class Scope:
    has_col: bool
    lines: list[str] = field(default_factory=list)
    cache: dict = field(default_factory=dict)
    exprs: dict = field(default_factory=dict)  # expression text → Val (CSE across IR nodes)
    # order in which a column loop walks its row: None (any), "forward", or "reverse" (a
    # scan read backwards: lanes and blocks run from the row's end, `emit_scan.py`)
    direction: str | None = None
    aligned: bool = False   # some access in this column loop is addressed from an aligned row start


# the names a column scope defines (`define_vars`, the drivers): renamed per row segment
_COL_NAMES = re.compile(r"\b(cflat|cmask|zc|c\d+)\b")


class SegmentLines(list):
    """The lines of one row segment (`Mapping.segments`): appended to the kernel's
    straight-line body, each with the segment's own column names (`cflat` → `cflat_s1`,
    `c1` → `c1_s1`), so that the segments' code can interleave with the row-level code
    that combines them while each keeps its own lanes."""

    def __init__(self, body: list[str], index: int):
        super().__init__()
        self.body, self.suffix = body, f"_s{index}"

    def append(self, line: str) -> None:
        self.body.append(_COL_NAMES.sub(lambda m: m.group(0) + self.suffix, line))

    def extend(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.append(line)

    def __iadd__(self, lines):
        self.extend(lines)
        return self


def _reach(n: ir.Node) -> int:
    """How many elements from its first one a buffer's last element lies (its numel when
    dense; more for a strided view)."""
    if not n.stride or not n.shape:
        return n.numel
    if 0 in n.shape:
        return 0
    return 1 + sum((d - 1) * abs(st) for d, st in zip(n.shape, n.stride))


def vector_elems(dtype: torch.dtype) -> int:
    """Elements of `dtype` in a 16-byte vector access (1 where one is wider)."""
    return 16 // dtype.itemsize if dtype.itemsize <= 8 else 1


class KernelBuilder:
    """State of one kernel being emitted: the top scope (per row block), an open
    column loop (row-looped kernels), parameters, and the memo of pulled values."""

    reductions: "Reductions"   # set by the driver (triton_kernel.py) right after construction

    def __init__(self, g: ir.Graph, k: KernelPlan):
        self.g, self.k = g, k
        self.members = set(k.members)
        # the half-precision values this kernel writes (see `value`)
        self._stored_half = {o for o in k.outputs if g[o].dtype in (torch.float16, torch.bfloat16)}
        self.dom = k.domain
        self.m = k.mapping
        self.looped = self.m.form == "row_looped"
        self.flat = self.dom.is_flat
        # rows held as segments side by side (`Mapping.segments`): the top scope holds the
        # row values, one scope a segment its columns (`open_segments`, `in_segment`)
        segmented = self.m.segments > 1 and self.m.form in ("row_persistent", "packed_rows")
        self.top = Scope(has_col=not self.looped and not segmented)
        self.scopes = [self.top]
        self.segs: list[Scope] = []
        self.seg_base = 0   # the first column of the segment being emitted
        self.tmp = 0
        self.params: list[tuple[str, int]] = []
        self.pname: dict[tuple[str, int], str] = {}
        self.levels: dict[int, set] = {}
        self.vars: dict[int, ix.Expr] = {}
        # per axis: {variable name: its stride in the axis' flat index} (variables of size > 1)
        self.flat_strides: dict[str, dict[str, int]] = {}
        self.col_flat: ix.Expr = ix.const(0)
        self.row_flat: ix.Expr = ix.const(0)
        self.row_pid = ""   # the program's row block, a scalar (set by the driver's `_rows`)
        self.row_bases: dict[tuple[int, int, int], str] = {}   # aligned row starts (`aligned_address`)
        self.whole_defined = False   # the row's whole column blocks from `lead` (`_close_aligned`)
        # conditions under which the current values are needed (a cat's branch): loads
        # are masked by them so no lane reads outside its buffer
        self.cond: tuple[tuple[str, frozenset], ...] = ()
        # every global read as (node, offset in the domain's variables): the planner's
        # probe of access patterns (`triton_kernel.load_offsets`)
        self.loads: list[tuple[int, ix.Expr]] = []
        self.stores: list[tuple[int, ix.Expr]] = []   # (full-element stores, for the planner's probes)
        # int64 index arithmetic where an offset can pass 2**31: the domain, or the farthest
        # element a buffer's strides reach (a small view of a big storage)
        big = max([self.dom.rows * self.dom.cols] + [_reach(g[i]) for i in k.inputs + k.outputs])
        self.idx64 = big >= 2**31 - 1

    def col_arange(self) -> str:
        """The column lanes of a block: int64 under `idx64`, since a column variable times a
        large stride (a transposed read, a tile's column) passes 2**31 there too."""
        lanes = f"tl.arange(0, {self.m.block_c})[None, :]"
        return f"{lanes}.to(tl.int64)" if self.idx64 else lanes

    # -- naming --------------------------------------------------------------
    def new(self, prefix: str = "t") -> str:
        self.tmp += 1
        return f"{prefix}{self.tmp}"

    def param(self, kind: str, nid: int) -> str:
        key = (kind, nid)
        if key not in self.pname:
            self.pname[key] = f"{kind}{len(self.pname)}"
            self.params.append(key)
        return self.pname[key]

    def emit(self, scope: Scope, expr: str, axes: Collection[str], dtype: torch.dtype, prefix: str = "t") -> Val:
        if expr in scope.exprs and not any(r in expr for r in _RANDOM_CALLS):
            return scope.exprs[expr]
        name = self.new(prefix)
        scope.lines.append(f"{name} = {expr}")
        val = Val(name, frozenset(axes), dtype)
        scope.exprs[expr] = val
        return val

    def scope_for(self, axes: Collection[str]) -> Scope:
        if COL in axes and self.segs and self.scopes[-1] is self.top:
            raise AssertionError("a column value pulled outside the row segments (emitter bug)")
        return self.scopes[-1] if COL in axes else self.top

    # -- row segments (Mapping.segments) --------------------------------------
    def open_segments(self) -> None:
        """The column scopes of a row held as `segments` tiles of `block_c` columns: each
        defines its lanes (`cflat_s<i>` from column i x block_c; a segment wholly inside the
        row has a constant mask, which Triton folds) and the column variables."""
        cols, bc = self.dom.cols, self.m.block_c
        for i in range(self.m.segments):
            scope = Scope(has_col=True, lines=SegmentLines(self.top.lines, i))
            whole = (i + 1) * bc <= cols
            scope.lines += [f"cflat = {i * bc} + {self.col_arange()}",
                            f"cmask = tl.full([1, {bc}], True, tl.int1)" if whole else f"cmask = cflat < {cols}",
                            "zc = cflat * 0"]
            self.vars.update(self.define_vars(scope, COL))   # (the same symbols: renamed per segment)
            self.segs.append(scope)

    @contextlib.contextmanager
    def in_segment(self, i: int) -> Iterator[Scope]:
        """Emit into row segment `i`: column values are pulled, cached and named there."""
        self.scopes.append(self.segs[i])
        outer, self.seg_base = self.seg_base, i * self.m.block_c
        try:
            yield self.segs[i]
        finally:
            self.scopes.pop()
            self.seg_base = outer

    # -- domain variables ---------------------------------------------------
    def define_vars(self, scope: Scope, axis: str) -> dict[int, ix.Expr]:
        dims = sorted(self.dom.col_dims) if axis == COL else list(self.dom.row_dims)
        sizes = [self.dom.shape[i] for i in dims]
        flatname = "rflat" if axis == ROW else "cflat"
        out, stride = {}, 1
        strides = self.flat_strides.setdefault(axis, {})
        for d, s in reversed(list(zip(dims, sizes))):
            name = f"{axis[0]}{d}"
            expr = flatname if stride == 1 else f"({flatname} // {stride})"
            if d != dims[0]:
                expr = f"({expr} % {s})"
            if s > 1:
                scope.lines.append(f"{name} = {expr}")
                strides[name] = stride
            out[d] = ix.var(name, s, axis)
            stride *= s
        return out

    def _as_flat(self, e: ix.Expr) -> ix.Expr:
        """`e` with k · (Σ over an axis' variables of var · its flat stride) written as
        k · rflat (or cflat): the same value in every lane, masked ones included (the
        variables are that flat index's mixed-radix digits, the outermost unbounded).
        A contiguous access in a kernel whose domain is unravelled for other operands
        (a pad, a broadcast, a strided source) is then `ptr + rflat`, which Triton sees
        as contiguous and vectorises; `ptr + r0 * C + r1` it cannot (with an odd C not
        even the rows are aligned), and the H200 ran such pads at ~20 % of copy
        bandwidth (bench/NOTES.md, 2026-11-25)."""
        for axis, flatname in ((ROW, "rflat"), (COL, "cflat")):
            strides = self.flat_strides.get(axis)
            if not strides or len(strides) < 2:
                continue     # (one variable is the flat index already)
            named = [(a.name, k) for a, k in e.terms if isinstance(a, ix.Var) and a.axis == axis]
            coefs = dict(named)
            if set(coefs) != set(strides) or len(named) != len(coefs):   # (a name twice: a restricted twin)
                continue
            first = next(iter(strides))
            k, r = divmod(coefs[first], strides[first])
            if r or k == 0 or any(coefs[n] != k * st for n, st in strides.items()):
                continue
            total = self.dom.rows if axis == ROW else self.dom.cols
            rest = tuple((a, c) for a, c in e.terms if not (isinstance(a, ix.Var) and a.axis == axis))
            e = ix.Expr(rest + ((ix.Var(flatname, total, axis), k),), e.const)
        return e

    def full_index(self) -> tuple[ix.Expr, ...]:
        return tuple(self.vars[d] for d in range(len(self.dom.shape)))

    def open_loop(self) -> None:
        """Start a loop over the row's column blocks (row-looped kernels)."""
        scope = Scope(has_col=True)
        self.scopes.append(scope)
        scope.lines.append(f"cflat = cbase + {self.col_arange()}")
        scope.lines.append(f"cmask = cflat < {self.dom.cols}")
        scope.lines.append("zc = cflat * 0")
        self.define_vars(scope, COL)

    def close_loop(self) -> None:
        scope = self.scopes.pop()  # loops never nest: each closes into `top`
        if scope.direction == "reverse":
            # walk the row from its end: lane position p holds column cols - 1 - p, so a
            # prefix in lane order is a suffix of the row (the lines above are per lane
            # and every reduction is order-free: only scans see the direction)
            assert scope.lines[0].startswith("cflat = cbase + ") and scope.lines[1].startswith("cmask = ")
            scope.lines[0:2] = [scope.lines[0].replace("cflat", "cpos", 1), f"cmask = cpos < {self.dom.cols}",
                                f"cflat = {self.dom.cols - 1} - cpos"]
        if scope.aligned and scope.direction is None:
            return self._close_aligned(scope)
        if scope.aligned:
            # (a scan claimed this loop's order after an access was addressed from the
            # aligned row start: the same addresses, without the vector hint's use)
            scope.lines.insert(scope.lines.index("zc = cflat * 0"), "crel = cflat - lead")
        cols, bc = self.dom.cols, self.m.block_c
        full = cols - cols % bc
        if self.k.column_tail and scope.direction != "reverse" and bc <= full < cols:
            # the whole column blocks first, with a column mask that is one constant: Triton
            # vectorises an access only where its mask is uniform over the vector, and
            # `cflat < cols` is not for an odd `cols` (GPT-2's 50257-wide logits were read
            # 2 bytes at a time); then the last, partial block with the real mask
            assert scope.lines[1] == f"cmask = cflat < {cols}"
            whole = list(scope.lines)
            whole[1] = f"cmask = tl.full([1, {bc}], True, tl.int1)"
            self.top.lines.extend(self._column_loop(0, full, bc, whole, scope))
            self.top.lines.append(f"for cbase in range({full}, {cols}, {bc}):")
            self.top.lines.extend("    " + line for line in scope.lines)
            return
        self.top.lines.extend(self._column_loop(0, cols, bc, scope.lines, scope))

    def _column_loop(self, start: int, stop: Any, step: int, body: list[str], scope: Scope) -> list[str]:
        """`for cbase in range(start, stop, step): body`; in a row-looped kernel on a persistent
        grid (`KernelPlan.prefetch`: a program an SM, each waiting a memory latency a column
        block), with the next block's loads issued before this block's arithmetic
        (`codegen/prefetch.py`), where the loop has two blocks or more and runs forward (a
        scan's running carry does not feed its loads)."""
        if (self.k.prefetch and self.m.form == "row_looped" and scope.direction in (None, "forward")
                and isinstance(stop, int) and stop - start > step):
            last = start + (stop - 1 - start) // step * step
            walk = prefetched_walk(body, "cbase", str(start), stop, step, last=last)
            if walk is not None:
                return walk
        return [f"for cbase in range({start}, {stop}, {step}):"] + ["    " + line for line in body]

    def _close_aligned(self, scope: Scope) -> None:
        """The loop over a row whose whole column blocks start at `lead`, the row's first
        16-byte boundary (`KernelPlan.row_align`): `crel` counts columns from there, so an
        address `aligned row start + crel` is one Triton can prove 16-byte aligned and
        contiguous.  Then one masked loop over what is left: lane q < lead holds column q
        (the row's head), lane q >= lead column q + whole (its tail).  Only for loops whose
        order is free (reductions, element-wise outputs; not scans)."""
        cols, bc = self.dom.cols, self.m.block_c
        assert scope.lines[0].startswith("cflat = cbase + ") and scope.lines[1] == f"cmask = cflat < {cols}"
        lanes = scope.lines[0][len("cflat = cbase + "):]
        body = scope.lines[2:]
        if not self.whole_defined:   # (the same in every loop of the row: defined once)
            self.top.lines.append(f"whole = ({cols} - lead) // {bc} * {bc}")
            self.whole_defined = True
        self.top.lines.append(f"for cbase in range(0, whole, {bc}):")
        self.top.lines.extend("    " + line for line in [
            f"crel = cbase + {lanes}", "cflat = lead + crel", f"cmask = tl.full([1, {bc}], True, tl.int1)"] + body)
        self.top.lines.append(f"for cbase in range(0, {cols} - whole, {bc}):")
        self.top.lines.extend("    " + line for line in [
            "cq = cbase + " + lanes, "cflat = tl.where(cq < lead, cq, cq + whole)", "crel = cflat - lead",
            f"cmask = cq < {cols} - whole"] + body)

    # -- aligned row starts (KernelPlan.row_align) -----------------------------
    def row_linear(self, e: ix.Expr) -> tuple[int, int] | None:
        """(k, c) where `e` (an offset in the domain's variables) is the flat column plus
        k times the flat row plus c: an access contiguous along the row, its row start an
        affine function of the row.  Else None."""
        e = self._as_flat(e)
        col, k = False, 0
        for a, coef in e.terms:
            if not isinstance(a, ix.Var) or a.axis not in (ROW, COL):
                return None
            flat = a.name in ("rflat", "cflat") or self.flat_strides.get(a.axis) == {a.name: 1}
            if not flat:
                return None
            if a.axis == COL:
                if col or coef != 1:
                    return None
                col = True
            else:
                k = coef
        return (k, e.const) if col else None

    def aligned_address(self, nid: int, off: ix.Expr, axes: Collection[str]) -> str | None:
        """The address of an access in a column loop as `aligned row start + crel`, where
        the access's row start is congruent to the plan's anchor (`KernelPlan.row_align`)
        modulo its own 16-byte vector; else None (addressed as usual)."""
        if not self.k.row_align or COL not in axes or len(self.scopes) < 2 or self.m.block_r != 1:
            return None
        lin = self.row_linear(off)
        vec = vector_elems(self.g[nid].dtype)
        ka, ca, va = self.k.row_align
        if lin is None or vec < 2 or va % vec:
            return None
        k, c = lin
        if (k - ka) % vec or (c - ca) % vec:
            return None
        key = (k, c, vec)
        # (the hint is a promise Triton does not check, and the interpreter ignores: a wrong
        # one is a misaligned vector access on the GPU; tests/test_align_rows.py evaluates
        # these lines for every row)
        if key not in self.row_bases:
            if not self.row_bases:
                # the anchor's columns before its row's first 16-byte boundary
                self.top.lines.append(f"lead = ({va} - ({self.row_pid} * {ka % va} + {ca % va}) % {va}) % {va}")
            name = self.row_bases[key] = f"arow{len(self.row_bases)}"
            self.top.lines.append(f"{name} = tl.multiple_of({self.row_pid} * {k} + {c} + lead, {vec})")
        self.scopes[-1].aligned = True
        return f"({self.row_bases[key]} + crel)"

    # -- masks ----------------------------------------------------------------
    def mask(self, axes: Collection[str]) -> str | None:
        parts = [m for a, m in ((ROW, "rmask"), (COL, "cmask")) if a in axes]
        return " & ".join(parts) if parts else None

    def render_index(self, e: ix.Expr) -> str:
        """`ix.render(e)`, with every floor division or modulo that holds another one
        computed once, into a named temporary in the scope its axes need.  Index maps
        composed through several reshapes and strided slices (an interleaved rotary
        embedding's backward) repeat the same inner quotient many times over: rendered
        as one expression their text grows exponentially with the depth (seconds of
        code generation, and as much interpreted work per element)."""
        return ix.render(e, self._index_atom)

    def _index_atom(self, a) -> str:
        text = ix.render_atom(a, self.render_index)
        nested = isinstance(a, (ix.Div, ix.Mod)) and any(isinstance(b, (ix.Div, ix.Mod)) for b, _ in a.expr.terms)
        if not nested:
            return text
        axes = ix.axes(a.expr)
        return self.emit(self.scope_for(axes), text, axes, torch.int32, prefix="i").name

    def offset(self, e: ix.Expr, axes: Collection[str]) -> str:
        s = self.render_index(self._as_flat(e))
        if not axes:
            return f"(zr + {s})"
        return s

    # -- pulling values ------------------------------------------------------
    def value(self, nid: int, index: tuple[ix.Expr, ...]) -> Val:
        key = (nid, index, self.cond)
        for scope in (self.top, self.scopes[-1]):
            if key in scope.cache:
                return scope.cache[key]
        n = self.g[nid]
        if nid in self.members or is_free(n):
            val = self._compute(n, index)
            if nid in self._stored_half and val.dtype == torch.float32:
                # a half value this kernel stores is read inside it as stored: every reader
                # sees one value, here and in other kernels (a backward recomputing from it
                # agrees with the forward at a kink: sign(x), x > 0; fuzz seed 11393)
                val = self.emit(self.scope_for(val.axes), round_half(val.name, n.dtype), val.axes, val.dtype)
        else:
            val = self._load(nid, index)
        self.remember(nid, index, self.cond, val)
        return val

    def remember(self, nid: int, index: tuple[ix.Expr, ...], cond: tuple, val: Val) -> None:
        """Memoise `val` as node `nid`'s value at `index` (under `cond`)."""
        self.scope_for(val.axes).cache[(nid, index, cond)] = val
        self.levels.setdefault(nid, set()).update(val.axes)

    def _load(self, nid: int, index) -> Val:
        n = self.g[nid]
        off = ix.offset(index, n.stride)
        self.loads.append((nid, off))
        axes = ix.axes(off)
        for _, cond_axes in self.cond:
            axes = axes | cond_axes
        if COL in axes and ROW not in axes and self.m.block_r > 1 and not self.flat and not self.k.transposed:
            # A row vector (a norm's weight, a bias) read in a tile of several rows is
            # loaded at the tile's shape, once per row of the tile from L1.  Loaded as
            # [1, C], Triton lays it out apart from the [R, C] loads (all warps along the
            # columns) and converts the big tiles that meet it through shared memory on
            # every iteration (3 conversions per row block of a layer-norm backward at
            # C = 1024, seen in its ttgir: `python -m stitchml.tools.aot_check --micro`).
            # Not in a tile laid out along its rows (a transposed read, `KernelPlan.
            # transposed`): there the [R, C] load took the columns' layout and the big
            # tiles were converted to it (2 conversions per iteration, 76 registers
            # against 47 with a [1, C] load: a layer-norm weight gradient over 1024 tokens).
            axes = axes | {ROW}
        return self._read(self.param("in", nid), frozenset(), off, axes, n.dtype,
                          self.aligned_address(nid, off, axes))

    def _read(self, ptr: str, ptr_axes, off: ix.Expr, axes, dtype: torch.dtype, address: str | None = None) -> Val:
        """`tl.load(ptr + off)` over `axes` under the block mask and the branch conditions,
        in the compute dtype; `ptr_axes`: the axes a pointer block already spans."""
        mask = " & ".join([m for m in [self.mask(axes)] if m] + [c for c, _ in self.cond]) or None
        m = f", mask={mask}, other=0" if mask else ""
        cd = compute_dtype(dtype)
        if address is None:
            address = self.offset(off, axes)
            # a block's axes that the address lacks (a scalar read under a block mask, a row
            # vector read at a tile's shape): zeros of those axes make the pointer a block
            zeros = [z for a, z in ((ROW, "zr"), (COL, "zc")) if a in axes and a not in ix.axes(off) | ptr_axes]
            if zeros:
                address = f"({' + '.join(zeros)} + {address})"
        if cd == torch.uint8 and dtype != cd:
            # a float8 value is held as its bits: read through a byte pointer (the masked
            # lanes' `other=0` has no float8 conversion in the interpreter)
            ptr = f"{ptr}.to(tl.pointer_type(tl.uint8))"
        load = f"tl.load({ptr} + {address}{m})"
        if dtype == torch.bfloat16:
            load = f"_from_bf16({load})"
        elif cd != dtype and cd != torch.uint8:
            load = f"{load}.to(tl.float32)"
        return self.emit(self.scope_for(axes), load, axes, cd)

    def _compute(self, n: ir.Node, index) -> Val:
        if n.kind == ir.VIEW:
            return self.value(n.refs[0], view_index(self.g, n, index))
        if n.kind == ir.POINTWISE:
            return self._pointwise(n, index)
        if n.kind == ir.REDUCE:
            return self.reductions.reduce(n, index)
        if n.kind == ir.SCAN:
            from .emit_scan import scan  # (emit_scan builds on this module)
            return scan(self, n, index)
        if n.kind == ir.CAT:
            return self._cat(n, index)
        if n.kind == ir.GATHER:
            return self._gather(n, index)
        if n.kind == ir.RAND:
            flat = ix.flatten(index, n.shape)
            axes = ix.axes(flat)
            seed = self.param("seed", n.id)
            if n.op != "normal":
                tile = self._uniform_tile(seed, flat, axes)
                if tile is not None:
                    return tile
            fn = "_randn4" if n.op == "normal" else "_rand4"   # (triton_ops: four words a Philox call)
            return self.emit(self.scope_for(axes), f"{fn}({seed}, {self.offset(flat, axes)})", axes,
                             torch.float32)
        raise TypeError(f"a {n.kind} node cannot be part of a kernel (planner bug)")

    def _uniform_tile(self, seed: str, flat: ix.Expr, axes) -> Val | None:
        """Uniforms of a whole tile from a quarter as many Philox calls, or None.

        `_rand4`, per element, gives element i word i & 3 of the Philox block at i >> 2;
        the compiler shares a call only between the registers it proves to hold one
        block.  Where the tile's lanes run along the element index (the point-wise form's
        flat block, or a row form's columns: `flat` = 1 · lane index + the same multiple
        of 4 across each row), the tile's blocks are exactly its aligned groups of 4
        lanes: one `randint4x` over a tile a quarter as wide, its four words joined back
        in lane order — the same values as `_rand4` element for element, so kernels of
        either form agree (a mask recomputed in the backward).  A bf16 dropout + layer
        norm row kernel: 1343 (per element) → 1048 (`_rand4`) → 777 sm_90 instructions
        (Triton 3.6), no layout conversion (bench/NOTES.md, twenty-sixth session).
        Row-looped kernels keep `_rand4` (their column blocks may start off a multiple of
        4 once aligned)."""
        if self.looped:
            return None
        e = self._as_flat(flat)
        if self.flat:      # the point-wise form: lanes rflat = pid * B + arange(B)
            lane_axis, width, lanes = ROW, self.m.block_r, "rflat"
        elif COL in axes:  # a row form's columns: cflat = arange(BC)[None, :]
            lane_axis, width, lanes = COL, self.m.block_c, "cflat"
        else:
            return None
        strides = self.flat_strides.get(lane_axis, {})   # the axis' variables: their flat strides
        lane_terms = [(a, k) for a, k in e.terms if lane_axis in ix.axes(ix.Expr(((a, 1),), 0))]
        if len(lane_terms) != 1 or width % 4:
            return None
        (atom, k), = lane_terms
        if k != 1 or not isinstance(atom, ix.Var) or atom.lo or not (
                atom.name == lanes or (len(strides) == 1 and strides.get(atom.name) == 1
                                       and len(self.dom.col_dims if lane_axis == COL else self.dom.row_dims) == 1)):
            return None
        rest = ix.Expr(tuple(t for t in e.terms if t not in lane_terms), e.const)
        if any(c % 4 for _, c in rest.terms) or rest.const % 4:
            return None
        quarter = f"tl.arange(0, {width // 4})"
        if self.idx64:
            quarter += ".to(tl.int64)"
        if lane_axis == ROW:
            if rest.terms:
                return None
            q = f"({self.row_pid} * {width} + {rest.const}) // 4 + {quarter}"
            shape = f"[{width}]"
        else:   # (a row segment's lanes start at its first column)
            q = f"({self.render_index(rest + self.seg_base)}) // 4 + {quarter}[None, :]"
            shape = f"[{self.m.block_r if rest.terms else 1}, {width}]"
        scope = self.scope_for(axes)
        w = [self.new("rw") for _ in range(4)]
        scope.lines.append(f"{', '.join(w)} = tl.randint4x({seed}, {q})")
        # join(join(w0, w2), join(w1, w3)) is [.., 2, 2] with word 2p + q at [p, q]: lane order
        words = f"tl.reshape(tl.join(tl.join({w[0]}, {w[2]}), tl.join({w[1]}, {w[3]})), {shape})"
        return self.emit(scope, f"tl.random.uint_to_uniform_float({words})", axes, torch.float32)

    def _pointwise(self, n: ir.Node, index) -> Val:
        cd = compute_dtype(n.dtype)
        if n.op == "full":
            v = literal(n.attr("value"), cd)
            return self.emit(self.top, f"tl.full([1], {v}, {TL_DTYPE[cd]})", (), cd)
        if n.op == "iota":
            e = index[n.attr("dim")]
            axes = ix.axes(e)
            return self.emit(self.scope_for(axes), f"({self.offset(e, axes)}).to(tl.int64)", axes, cd)
        args, axes, in_dtype, vals = [], set(), None, []
        for a in n.args:
            if isinstance(a, ir.Ref):
                v = self.value(a.id, index)
                args.append(v.name)
                axes |= v.axes
                in_dtype = in_dtype or v.dtype
                vals.append(v)
            else:
                args.append(None)
                vals.append(None)
        scalar_dtype = in_dtype if in_dtype is not None else cd
        if n.op == "where":
            scalar_dtype = cd
        args = [x if x is not None else literal(a, scalar_dtype) for x, a in zip(args, n.args)]
        if n.op in HALF_EXACT_OPS:
            # half values are held in float32 between ops, more precise than eager's stored
            # ones; a comparison sees them rounded, as eager does (`HALF_EXACT_OPS`): amin's
            # backward compared the saved float16 minimum with 2 - a recomputed unrounded,
            # found no element equal and divided by a count of 0 (fuzz seed 8476, long).
            # A Python scalar operand stays as it is: eager compares it unrounded too.
            args = [round_half(x, self.g[a.id].dtype) if isinstance(a, ir.Ref) else x for x, a in zip(args, n.args)]
        if n.op == "cast":
            src = self.g[n.refs[0]].dtype
            expr = cast_expr(args[0], src, n.dtype)
        elif n.op == "bitcast":
            expr = bitcast_expr(args[0], self.g[n.refs[0]].dtype, n.dtype)
        elif (n.op == "truediv" and cd in (torch.float32, torch.float64) and vals[1] is not None
              and COL in axes and COL not in vals[1].axes and self._softmax_division(n)):
            # e / sum(e) with e = exp(a - max(a)): one reciprocal a row and a multiply an
            # element (`triton_ops._mul_recip`, compiled).  Division by a tensor is
            # `div.full.f32` on a GPU, with range scaling for divisors beyond 2^126 or
            # below 2^-126 (four sm_90 instructions an element where one multiply does);
            # this divisor is NaN or at least 1 (the row's maximum contributes exp(0)),
            # so neither scaling can apply, and x * (1 / s) is within 1.5 ulp of x / s,
            # as div.full's 2 ulp.
            expr = f"_mul_recip({args[0]}, {args[1]})"
        else:
            expr = pointwise_expr(n.op, args, in_dtype, n.dtype)
        return self.emit(self.scope_for(axes), expr, axes, cd)

    def _softmax_division(self, n: ir.Node) -> bool:
        """Whether `n` divides e by s = sum(e), e = exp(a - amax(a)) over the same dims
        (a softmax's normalisation: s is an online pair's sum, `row_loops.online_partner`)."""
        if len(n.args) != 2 or not all(isinstance(a, ir.Ref) for a in n.args):
            return False
        s = self.g[through_views(self.g, n.args[1].id)]
        return s.kind == ir.REDUCE and s.refs[0] == n.args[0].id and online_partner(self.g, s) is not None

    def _part_indices(self, n: ir.Node, index, pos) -> list[tuple[int, int, tuple]]:
        """(start, size, index of the part) for each part of concatenation `n`."""
        dim, sizes = n.attr("dim"), n.attr("sizes")
        # a position that is one domain variable has a known range inside each branch:
        # the branch's whole index is simplified with it (`ix.restrict`)
        var = pos.terms[0][0] if (len(pos.terms) == 1 and pos.terms[0][1] == 1 and not pos.const
                                  and isinstance(pos.terms[0][0], ix.Var)) else None
        out, start = [], 0
        for size in sizes:
            sub = list(index)
            if var is not None and size > 1:
                sub = [ix.restrict(e, var, start, start + size) for e in index]
            # inside its branch a size-1 part is read at 0: say so, so that a per-row
            # value (e.g. a reduction) is not asked for at a column-dependent index
            sub[dim] = ix.const(0) if size == 1 else sub[dim] - start
            out.append((start, size, tuple(sub)))
            start += size
        return out

    def _cat_reads(self, n: ir.Node, subs) -> tuple[list[int], ix.Expr] | None:
        """Where every part of concatenation `n` is a buffer read (through views) at one
        and the same offset: the buffers' nodes and that offset; else None."""
        return self._cat_reads_at([(ref, sub) for ref, (_, _, sub) in zip(n.args, subs)], n.dtype)

    def _cat_reads_at(self, parts, dtype) -> tuple[list[int], ix.Expr] | None:
        """(buffer nodes, the one offset) where each (ref, index) of `parts` is a buffer of
        `dtype` read (through views) at the same offset; else None."""
        nodes, offsets = [], set()
        for ref, sub in parts:
            m, sub = self._through_views(ref, sub)
            if m.id in self.members or is_free(m) or m.dtype != dtype:
                return None
            nodes.append(m.id)
            offsets.add(ix.offset(sub, m.stride))
        return (nodes, offsets.pop()) if len(offsets) == 1 else None

    def _through_views(self, ref: ir.Ref, sub) -> tuple[ir.Node, tuple]:
        """The node `ref` reads through views not computed here, and the index it is read at."""
        m = self.g[ref.id]
        while m.kind == ir.VIEW and m.id not in self.members:
            sub = view_index(self.g, m, sub)
            m = self.g[m.refs[0]]
        return m, sub

    def _cat_of_cats(self, n: ir.Node, subs) -> tuple[ix.Expr, list[tuple[int, int, tuple]]] | None:
        """Where every part of concatenation `n` is (through views) a concatenation computed
        here along one other dim, alike in its sizes, whose j-th pieces are buffers read at
        one and the same offset across the parts: (the inner position, and per piece j its
        start, size and `_cat_reads` answer); else None.  DIEN's GRU backward sums a
        concatenation of 50 steps, each the three gates' gradients side by side: as a select
        of selects, 150 masked loads an element (sm_90: 37x its copy time); read piece by
        piece, one pointer chosen per row among the steps, three."""
        inner = []
        for ref, (_, _, sub) in zip(n.args, subs):
            m, sub = self._through_views(ref, sub)
            if m.kind != ir.CAT or m.id in self.members or m.dtype != n.dtype:
                return None
            inner.append((m, sub))
        first, sub0 = inner[0]
        dim, sizes = first.attr("dim"), first.attr("sizes")
        q = sub0[dim]
        if any(m.attr("dim") != dim or m.attr("sizes") != sizes or sub[dim] != q for m, sub in inner):
            return None
        per_part = [self._part_indices(m, sub, q) for m, sub in inner]
        pieces = []
        for j, (start, size, _) in enumerate(per_part[0]):
            reads = self._cat_reads_at([(m.args[j], parts[j][2]) for (m, _), parts in zip(inner, per_part)],
                                       n.dtype)
            if reads is None:
                return None
            pieces.append((start, size, reads))
        return q, pieces

    def _pieces_by_pointer(self, n: ir.Node, pos, subs, pieces) -> Val:
        """`n` read piece by piece of its parts' concatenations (`_cat_of_cats`): each piece
        one load through a pointer chosen by `n`'s position, a select over the pieces."""
        q, parts = pieces
        return self._select_parts(q, parts, lambda reads: self._cat_by_pointer(n, pos, subs, reads), n.dtype)

    def _select_parts(self, pos, parts, read: Callable[[Any], Val], dtype: torch.dtype) -> Val:
        """Concatenated parts (start, size, what `read` takes) at position `pos`: each part
        read under its range's condition, then a select by position."""
        p = self.render_index(pos)
        outer = self.cond
        axes = set(ix.axes(pos))
        vals = []
        for start, size, what in parts:
            self.cond = outer + ((f"({p} >= {start}) & ({p} < {start + size})", frozenset(ix.axes(pos))),)
            v = read(what)
            axes |= v.axes
            vals.append((start, size, v))
        self.cond = outer
        merged: list[tuple[int, int, Val]] = []   # neighbouring parts of one value as one range (the
        for start, size, v in vals:               # zeros around the gradient of a split's one chunk)
            if merged and merged[-1][2].name == v.name and merged[-1][0] + merged[-1][1] == start:
                merged[-1] = (merged[-1][0], merged[-1][1] + size, v)
            else:
                merged.append((start, size, v))
        scope, dt = self.scope_for(axes), compute_dtype(dtype)
        result = _select_by_position(p, [(start + size, v.name) for start, size, v in merged],
                                     lambda text: self.emit(scope, text, axes, dt).name)
        return self.emit(scope, result, axes, dt)

    def _cat_by_pointer(self, n: ir.Node, pos, subs, reads) -> Val:
        """A concatenation of many buffers read at one offset (a recurrence's per-step
        gradients, stacked): the position picks the part's base pointer, in the
        position's scope (per row where the position is a row's), and one load reads it.
        As a select of values, each element loaded every part under its own mask (DIEN's
        50 steps: 50 loads an element, and spills on sm_90)."""
        nodes, off = reads
        p = self.render_index(pos)
        ptrs = [self.param("in", nid) for nid in nodes]
        for nid in nodes:
            self.loads.append((nid, off))
        pos_axes = frozenset(ix.axes(pos))
        scope = self.scope_for(pos_axes)
        chosen = _select_by_position(p, [(s + size, ptr) for (s, size, _), ptr in zip(subs, ptrs)],
                                     lambda text: self.emit(scope, text, pos_axes, torch.int64, prefix="p").name)
        base = self.emit(scope, chosen, pos_axes, torch.int64, prefix="p")
        axes = set(ix.axes(off)) | pos_axes
        for _, cond_axes in self.cond:
            axes |= cond_axes
        return self._read(base.name, pos_axes, off, axes, n.dtype)

    def _rolled(self, n: ir.Node) -> tuple[int, int] | None:
        """(source, shift) where concatenation `n` is a roll of one value along its dim:
        [x[N-s:], x[:N-s]] (how `torch.roll` lowers); else None."""
        dim, sizes = n.attr("dim"), n.attr("sizes")
        if len(n.args) != 2 or not all(isinstance(a, ir.Ref) for a in n.args):
            return None
        a, b = (self.g[r.id] for r in n.args)
        if not all(m.kind == ir.VIEW and m.op == "slice" and m.attr("dim") == dim and m.attr("step") == 1
                   for m in (a, b)) or a.refs[0] != b.refs[0]:
            return None
        src = self.g[a.refs[0]]
        size = n.shape[dim]
        if src.shape != n.shape or a.attr("start") != sizes[1] or b.attr("start") != 0 or sizes[0] + sizes[1] != size:
            return None
        return src.id, sizes[0]

    def _cat(self, n: ir.Node, index) -> Val:
        dim = n.attr("dim")
        pos = index[dim]
        rolled = self._rolled(n)
        if rolled is not None:
            # one read at (i + N - s) mod N instead of a select between the two parts, each
            # computed under its own mask: Swin-T's shifted windows (a roll over two dims,
            # four parts) computed the layer norm they read four times, a row's sums each time
            src, shift = rolled
            size = n.shape[dim]
            return self.value(src, tuple(ix.mod(pos + (size - shift), size) if d == dim else e
                                         for d, e in enumerate(index)))
        subs = self._part_indices(n, index, pos)
        held = next(((r, sub) for r, (start, size, sub) in zip(n.args, subs)
                     if start <= pos.const < start + size), None) if pos.is_const else None
        if held is not None:
            # read at a known position (a row of it selected, an index map that fixed the
            # axis): the one part that holds it, under no branch condition.  A chain of
            # writes into rows (Kimi's and Qwen3-Next's chunked delta rule: 63 in-place row
            # updates, each a select over parts) evaluated every part of every level under
            # its own condition, 2^depth evaluations (a chunk of 12 took 180 s to generate)
            return self.value(held[0].id, held[1])
        if len(subs) >= CAT_POINTER_PARTS and (reads := self._cat_reads(n, subs)) is not None:
            return self._cat_by_pointer(n, pos, subs, reads)
        if len(subs) >= CAT_POINTER_PARTS and (pieces := self._cat_of_cats(n, subs)) is not None:
            return self._pieces_by_pointer(n, pos, subs, pieces)
        return self._select_parts(pos, [(start, size, (ref, sub)) for ref, (start, size, sub) in zip(n.args, subs)],
                                  lambda part: self.value(part[0].id, part[1]), n.dtype)

    def _gather(self, n: ir.Node, index) -> Val:
        src, idx = n.refs
        dim, bound = n.attr("dim"), n.attr("bound")
        if n.op == "embedding":
            iv = self.value(idx, index[:-1])
            src_index = (None, index[-1])
        elif n.op == "index_select":
            iv = self.value(idx, (index[dim],))
            src_index = tuple(None if i == dim else e for i, e in enumerate(index))
        else:  # take_along
            iv = self.value(idx, index)
            src_index = tuple(None if i == dim else e for i, e in enumerate(index))
        # negative indices count from the end, like eager; an index still out of range is
        # an error in eager: assert it (active in the interpreter and with TRITON_DEBUG=1)
        # and clamp the address so no lane reads outside the buffer
        scope = self.scope_for(iv.axes)
        wrapped = self.emit(scope, f"tl.where({iv.name} < 0, {iv.name} + {bound}, {iv.name})", iv.axes, iv.dtype)
        mask = self.mask(iv.axes)
        ok = f"({wrapped.name} >= 0) & ({wrapped.name} < {bound})"
        scope.lines.append(f"tl.device_assert({ok if not mask else f'{ok} | ~({mask})'}, "
                           f"'index out of range')")
        fixed = self.emit(scope, f"tl.minimum(tl.maximum({wrapped.name}, 0), {bound - 1})", iv.axes, iv.dtype)
        loaded = ix.loaded(fixed.name, bound, frozenset(iv.axes))
        src_index = tuple(loaded if e is None else e for e in src_index)
        return self.value(src, src_index)


def view_index(g: ir.Graph, n: ir.Node, index: tuple[ix.Expr, ...]) -> tuple[ix.Expr, ...]:
    """Map an index of the view's output to an index of its operand."""
    src = g[n.refs[0]]
    op = n.op
    if op == "reshape":
        return ix.unravel(ix.flatten(index, n.shape), src.shape)
    if op == "permute":
        dims = n.attr("dims")
        out = [None] * len(dims)
        for i, d in enumerate(dims):
            out[d] = index[i]
        return tuple(out)
    if op == "expand":
        lead = len(n.shape) - len(src.shape)
        return tuple(ix.const(0) if s == 1 else index[lead + i] for i, s in enumerate(src.shape))
    if op == "slice":
        dim, start, step = n.attr("dim"), n.attr("start"), n.attr("step")
        out = list(index)
        out[dim] = index[dim] * step + start
        return tuple(out)
    if op == "select":
        dim, i = n.attr("dim"), n.attr("index")
        return tuple(index[:dim]) + (ix.const(i),) + tuple(index[dim:])
    if op == "unfold":   # windows along dim: (.., i, .., k) reads (.., i * step + k, ..)
        dim = n.attr("dim")
        out = list(index[:-1])
        out[dim] = index[dim] * n.attr("step") + index[-1]
        return tuple(out)
    if op == "as_strided":
        flat = ix.offset(index, n.attr("stride"), n.attr("offset"))
        return ix.unravel(flat, src.shape)
    raise ValueError(f"view op {op!r} has no index map (lowering bug)")


__all__ = ["COL", "ROW", "KernelBuilder", "Scope", "Val", "vector_elems", "view_index"]
