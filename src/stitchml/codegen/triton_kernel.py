"""Plan kernel → Triton source.

Code is emitted by *pulling*: each kernel output is requested at its index (symbolic
expressions of the domain's axis variables) and every producer is requested at the
index its consumer maps to, through views.  Requests are memoised per scope, so a
value pulled twice at the same index is computed once (operator-level reuse), and a
value whose index depends only on the row axis is computed once per row and
broadcast (element-level reuse of regional stitching).

Row-looped kernels get one loop over column blocks per reduction (two-pass), and a
final loop for the element-wise outputs; row values are hoisted out of the loops.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field

import torch

from ..ir import index as ix
from ..ir import nodes as ir
from ..plan.data import KernelPlan
from ..plan.graph_view import is_free
from .triton_ops import (REDUCE_COMBINE, TL_DTYPE, cast_expr, compute_dtype, literal, pointwise_expr,
                         reduce_identity, store_expr)

ROW, COL = "row", "col"


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


@dataclass
class KernelSource:
    name: str
    params: list[tuple[str, int]]   # (kind, node id): kind in in/out/seed/partial
    param_names: list[str]
    body: list[str]                 # statements; the program id is written `tl.program_id(0)`
    grid: int
    num_warps: int
    levels: dict[int, frozenset]    # node id → axes it was evaluated over (for tests / explain)

    @property
    def source(self) -> str:
        # a seed or barrier base changes every call: specialising on its value (== 1, a
        # multiple of 16) would compile a new variant for some calls
        fresh = [n for (kind, _), n in zip(self.params, self.param_names) if kind in ("seed", "base")]
        deco = f"@triton.jit(do_not_specialize={fresh!r})" if fresh else "@triton.jit"
        return (f"{deco}\ndef {self.name}({', '.join(self.param_names)}):\n"
                + "\n".join("    " + line for line in self.body) + "\n")


class Emitter:
    def __init__(self, g: ir.Graph, k: KernelPlan):
        self.g, self.k = g, k
        self.members = set(k.members)
        self.dom = k.domain
        self.m = k.mapping
        self.looped = self.m.form == "row_looped"
        self.flat = self.dom.is_flat
        self.top = Scope(has_col=not self.looped)
        self.scopes = [self.top]
        self.tmp = 0
        self.params: list[tuple[str, int]] = []
        self.pname: dict[tuple[str, int], str] = {}
        self.levels: dict[int, set] = {}
        self._needs_memo: dict[tuple[int, int], bool] = {}
        # conditions under which the current values are needed (a cat's branch): loads
        # are masked by them so no lane reads outside its buffer
        self.cond: tuple[tuple[str, frozenset], ...] = ()
        big = max([self.dom.rows * self.dom.cols] + [g[i].numel for i in k.inputs] + [g[o].numel for o in k.outputs])
        self.idx64 = big >= 2**31 - 1

    # -- naming --------------------------------------------------------------
    def _new(self, prefix="t") -> str:
        self.tmp += 1
        return f"{prefix}{self.tmp}"

    def _param(self, kind: str, nid: int) -> str:
        key = (kind, nid)
        if key not in self.pname:
            self.pname[key] = f"{kind}{len(self.pname)}"
            self.params.append(key)
        return self.pname[key]

    def _emit(self, scope: Scope, expr: str, axes, dtype, prefix="t") -> Val:
        if expr in scope.exprs and "tl.rand" not in expr:
            return scope.exprs[expr]
        name = self._new(prefix)
        scope.lines.append(f"{name} = {expr}")
        val = Val(name, frozenset(axes), dtype)
        scope.exprs[expr] = val
        return val

    def _scope_for(self, axes) -> Scope:
        return self.scopes[-1] if COL in axes else self.top

    # -- domain variables ---------------------------------------------------
    def _axis_vars(self, axis: str):
        dims = [i for i in range(len(self.dom.shape)) if (i in self.dom.col_dims) == (axis == COL)]
        sizes = [self.dom.shape[i] for i in dims]
        return dims, sizes

    def _define_vars(self, scope: Scope, axis: str) -> dict[int, ix.Expr]:
        dims, sizes = self._axis_vars(axis)
        flatname = "rflat" if axis == ROW else "cflat"
        out, stride = {}, 1
        for d, s in reversed(list(zip(dims, sizes))):
            name = f"{axis[0]}{d}"
            expr = flatname if stride == 1 else f"({flatname} // {stride})"
            if d != dims[0]:
                expr = f"({expr} % {s})"
            if s > 1:
                scope.lines.append(f"{name} = {expr}")
            out[d] = ix.var(name, s, axis)
            stride *= s
        return out

    def full_index(self) -> tuple[ix.Expr, ...]:
        return tuple(self.vars[d] for d in range(len(self.dom.shape)))

    # -- masks ----------------------------------------------------------------
    def _mask(self, axes) -> str | None:
        parts = [m for a, m in ((ROW, "rmask"), (COL, "cmask")) if a in axes]
        return " & ".join(parts) if parts else None

    def _offset(self, e: ix.Expr, axes) -> str:
        s = ix.render(e)
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
        else:
            val = self._load(nid, index)
        self._scope_for(val.axes).cache[key] = val
        self.levels.setdefault(nid, set()).update(val.axes)
        return val

    def _load(self, nid: int, index) -> Val:
        n = self.g[nid]
        off = ix.offset(index, n.stride)
        axes = ix.axes(off)
        for _, cond_axes in self.cond:
            axes = axes | cond_axes
        ptr = self._param("in", nid)
        mask = " & ".join([m for m in [self._mask(axes)] if m] + [c for c, _ in self.cond]) or None
        m = f", mask={mask}, other=0" if mask else ""
        cd = compute_dtype(n.dtype)
        conv = ".to(tl.float32)" if cd != n.dtype else ""
        address = self._offset(off, axes)
        if not ix.axes(off) and axes:  # a scalar element read under a block mask: make the pointer a block
            zero = " + ".join(z for a, z in ((ROW, "zr"), (COL, "zc")) if a in axes)
            address = f"({zero} + {ix.render(off)})"
        return self._emit(self._scope_for(axes), f"tl.load({ptr} + {address}{m}){conv}", axes, cd)

    def _compute(self, n: ir.Node, index) -> Val:
        if n.kind == ir.VIEW:
            return self.value(n.refs[0], view_index(self.g, n, index))
        if n.kind == ir.POINTWISE:
            return self._pointwise(n, index)
        if n.kind == ir.REDUCE:
            return self._reduce(n, index)
        if n.kind == ir.CAT:
            return self._cat(n, index)
        if n.kind == ir.GATHER:
            return self._gather(n, index)
        if n.kind == ir.RAND:
            flat = ix.flatten(index, n.shape)
            axes = ix.axes(flat)
            seed = self._param("seed", n.id)
            fn = "tl.randn" if n.op == "normal" else "tl.rand"
            return self._emit(self._scope_for(axes), f"{fn}({seed}, {self._offset(flat, axes)})", axes,
                              torch.float32)
        raise NotImplementedError(f"cannot emit {n.kind}")

    def _pointwise(self, n: ir.Node, index) -> Val:
        cd = compute_dtype(n.dtype)
        if n.op == "full":
            v = literal(n.attr("value"), cd)
            return self._emit(self.top, f"tl.full([1], {v}, {TL_DTYPE[cd]})", (), cd)
        if n.op == "iota":
            e = index[n.attr("dim")]
            axes = ix.axes(e)
            return self._emit(self._scope_for(axes), f"({self._offset(e, axes)}).to(tl.int64)", axes, cd)
        args, axes, in_dtype = [], set(), None
        for a in n.args:
            if isinstance(a, ir.Ref):
                v = self.value(a.id, index)
                args.append(v.name)
                axes |= v.axes
                in_dtype = in_dtype or v.dtype
            else:
                args.append(None)
        scalar_dtype = in_dtype if in_dtype is not None else cd
        if n.op == "where":
            scalar_dtype = cd
        args = [x if x is not None else literal(a, scalar_dtype) for x, a in zip(args, n.args)]
        if n.op == "cast":
            src = self.g[n.refs[0]].dtype
            expr = cast_expr(args[0], src, n.dtype)
        else:
            expr = pointwise_expr(n.op, args, in_dtype, n.dtype)
        return self._emit(self._scope_for(axes), expr, axes, cd)

    def _cat(self, n: ir.Node, index) -> Val:
        dim, sizes = n.attr("dim"), n.attr("sizes")
        pos = index[dim]
        start, result, axes = 0, None, set(ix.axes(pos))
        parts = []
        p = ix.render(pos)
        outer = self.cond
        for ref, size in zip(n.args, sizes):
            sub = list(index)
            # inside its branch a size-1 part is read at 0: say so, so that a per-row
            # value (e.g. a reduction) is not asked for at a column-dependent index
            sub[dim] = ix.const(0) if size == 1 else pos - start
            self.cond = outer + ((f"({p} >= {start}) & ({p} < {start + size})", frozenset(ix.axes(pos))),)
            v = self.value(ref.id, tuple(sub))
            axes |= v.axes
            parts.append((start, size, v))
            start += size
        self.cond = outer
        result = parts[-1][2].name
        for s, size, v in reversed(parts[:-1]):
            result = f"tl.where({p} < {s + size}, {v.name}, {result})"
        return self._emit(self._scope_for(axes), result, axes, compute_dtype(n.dtype))

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
        scope = self._scope_for(iv.axes)
        wrapped = self._emit(scope, f"tl.where({iv.name} < 0, {iv.name} + {bound}, {iv.name})", iv.axes, iv.dtype)
        mask = self._mask(iv.axes)
        ok = f"({wrapped.name} >= 0) & ({wrapped.name} < {bound})"
        scope.lines.append(f"tl.device_assert({ok if not mask else f'{ok} | ~({mask})'}, "
                           f"'index out of range')")
        fixed = self._emit(scope, f"tl.minimum(tl.maximum({wrapped.name}, 0), {bound - 1})", iv.axes, iv.dtype)
        loaded = ix.loaded(fixed.name, bound, frozenset(iv.axes))
        src_index = tuple(loaded if e is None else e for e in src_index)
        return self.value(src, src_index)

    # -- reductions ----------------------------------------------------------
    def _reduce_input_index(self, n: ir.Node, index):
        src = self.g[n.refs[0]]
        dims = n.attr("dims")
        red_sizes = tuple(src.shape[d] for d in dims)
        red = ix.unravel(self.col_flat, red_sizes)
        full, ki, ri = [], iter(index), iter(red)
        for d in range(len(src.shape)):
            full.append(next(ri) if d in dims else next(ki))
        return tuple(full), red, red_sizes

    def _reduce(self, n: ir.Node, index) -> Val:
        outer, self.cond = self.cond, tuple(c for c in self.cond if COL not in c[1])
        try:
            return self._reduce_unmasked(n, index, outer)
        finally:
            self.cond = outer

    def _reduce_unmasked(self, n: ir.Node, index, outer_cond=()) -> Val:
        if any(COL in ix.axes(e) for e in index):
            raise NotImplementedError("reduction requested at a column-dependent index")
        op = n.op
        if op in ("argmax", "argmin"):
            return self._argreduce(n, index)
        cd = compute_dtype(n.dtype)
        ident = reduce_identity(op, cd)
        combine = REDUCE_COMBINE[op]
        if not self.looped:
            full, _, _ = self._reduce_input_index(n, index)
            v = self.value(n.refs[0], full)
            body = f"tl.where(rmask & cmask, {v.name}, {ident})"
            expr = f"tl.sum({body}, 1)" if op == "sum" else f"tl.reduce({body}, 1, {combine})"
            return self._emit(self.top, f"{expr}[:, None]", {ROW}, cd)
        # one loop over the row's column blocks for this reduction and every sibling
        # that can share it (the deviations' sum and sum of squares of a variance):
        # each extra loop would read the row again
        group = [n] + self._loop_companions(n, index, outer_cond)
        accs = []
        for r in group:
            acc = self._new("acc")
            rcd = compute_dtype(r.dtype)
            self.top.lines.append(f"{acc} = tl.full([{self.m.block_r}, {self.m.block_c}], "
                                  f"{reduce_identity(r.op, rcd)}, {TL_DTYPE[rcd]})")
            accs.append(acc)
        self._open_loop()
        for r, acc in zip(group, accs):
            full, _, _ = self._reduce_input_index(r, index)
            v = self.value(r.refs[0], full)
            rident = reduce_identity(r.op, compute_dtype(r.dtype))
            self.scopes[-1].lines.append(f"{acc} = {REDUCE_COMBINE[r.op]}({acc}, "
                                         f"tl.where(rmask & cmask, {v.name}, {rident}))")
        self._close_loop()
        vals = []
        for r, acc in zip(group, accs):
            expr = f"tl.sum({acc}, 1)" if r.op == "sum" else f"tl.reduce({acc}, 1, {REDUCE_COMBINE[r.op]})"
            vals.append(self._emit(self.top, f"{expr}[:, None]", {ROW}, compute_dtype(r.dtype)))
        for r, val in zip(group[1:], vals[1:]):  # found by value() when they are requested
            self.top.cache[(r.id, index, outer_cond)] = val
            self.levels.setdefault(r.id, set()).add(ROW)
        return vals[0]

    def _loop_companions(self, n: ir.Node, index, cond) -> list[ir.Node]:
        """Reductions of this kernel that can be computed in `n`'s loop: same reduced
        shape and axes, not yet computed at this index, and independent of `n`
        (neither needs the other's result)."""
        out = []
        src_shape = self.g[n.refs[0]].shape
        for mid in sorted(self.members):
            c = self.g[mid]
            if (c.id == n.id or c.kind != ir.REDUCE or c.op not in REDUCE_COMBINE or c.shape != n.shape
                    or c.attr("dims") != n.attr("dims") or self.g[c.refs[0]].shape != src_shape
                    or (c.id, index, cond) in self.top.cache or c.attr("split_chunks")):
                continue
            if self._needs(c.id, n.id) or self._needs(n.id, c.id):
                continue
            if any(self._needs(c.id, o.id) or self._needs(o.id, c.id) for o in out):
                continue
            out.append(c)
        return out

    def _needs(self, a: int, b: int) -> bool:
        """Does node `a` read node `b`'s value (through this kernel's members and free nodes)?"""
        memo = self._needs_memo
        if (a, b) not in memo:
            seen, stack, found = set(), [a], False
            while stack and not found:
                for r in self.g[stack.pop()].refs:
                    if r == b:
                        found = True
                        break
                    if r not in seen and (r in self.members or is_free(self.g[r])):
                        seen.add(r)
                        stack.append(r)
            memo[(a, b)] = found
        return memo[(a, b)]

    def _argreduce(self, n: ir.Node, index) -> Val:
        src = self.g[n.refs[0]]
        is_max = n.op == "argmax"
        best_node = ir.Node(-n.id - 1, ir.REDUCE, "amax" if is_max else "amin", n.args, n.shape, src.dtype,
                            None, n.attrs)
        best = self._reduce(best_node, index)
        big = "9223372036854775807"
        acc = None
        if self.looped:
            acc = self._new("acc")
            self.top.lines.append(f"{acc} = tl.full([{self.m.block_r}, {self.m.block_c}], {big}, tl.int64)")
            self._open_loop()
        full, red, red_sizes = self._reduce_input_index(n, index)
        v = self.value(n.refs[0], full)
        pos = ix.flatten(red, red_sizes)
        scope = self.scopes[-1]
        hit = f"(({v.name} == {best.name}) | (({v.name} != {v.name}) & ({best.name} != {best.name})))"
        cand = f"tl.where(rmask & cmask & {hit}, ({ix.render(pos)} + zc).to(tl.int64), {big})"
        if self.looped:
            scope.lines.append(f"{acc} = _nanmin({acc}, {cand})")
            self._close_loop()
            return self._emit(self.top, f"tl.min({acc}, 1)[:, None]", {ROW}, torch.int64)
        return self._emit(self.top, f"tl.min({cand}, 1)[:, None]", {ROW}, torch.int64)

    def _open_loop(self):
        scope = Scope(has_col=True)
        self.scopes.append(scope)
        scope.lines.append(f"cflat = cbase + tl.arange(0, {self.m.block_c})[None, :]")
        scope.lines.append(f"cmask = cflat < {self.dom.cols}")
        scope.lines.append("zc = cflat * 0")
        self._define_vars(scope, COL)

    def _close_loop(self):
        scope = self.scopes.pop()  # loops never nest: each closes into `top`
        self.top.lines.append(f"for cbase in range(0, {self.dom.cols}, {self.m.block_c}):")
        self.top.lines.extend("    " + line for line in scope.lines)

    # -- stores ----------------------------------------------------------------
    def _permuted_index(self, n: ir.Node):
        """If `n` is (a same-shape element-wise op of) a permute of a domain-shaped
        value, index it by the permuted domain index, so its producers stay at the
        domain's own index (no reduction is asked for at a transposed position)."""
        while True:
            if n.kind == ir.VIEW and n.op == "permute" and self.g[n.refs[0]].shape == self.dom.shape:
                full = self.full_index()
                return tuple(full[d] for d in n.attr("dims"))
            if n.kind == ir.POINTWISE and n.refs and all(self.g[r].shape == n.shape for r in n.refs):
                n = self.g[n.refs[0]]
                continue
            return None

    def output_index(self, nid: int) -> tuple[ix.Expr, ...]:
        n = self.g[nid]
        if n.shape == self.dom.shape:
            return self.full_index()
        permuted = self._permuted_index(n)
        if permuted is not None:
            return permuted
        if not self.flat and n.numel == self.dom.rows:
            row_index = tuple(self.vars[d] for d in range(len(self.dom.shape)) if d not in self.dom.col_dims)
            row_shape = tuple(s for d, s in enumerate(self.dom.shape) if d not in self.dom.col_dims)
            return ix.unravel(ix.flatten(row_index, row_shape), n.shape)
        return ix.unravel(ix.flatten(self.full_index(), self.dom.shape), n.shape)

    def store(self, nid: int) -> None:
        n = self.g[nid]
        index = self.output_index(nid)
        v = self.value(nid, index)
        off = ix.offset(index, n.stride)
        axes = ix.axes(off) | v.axes
        ptr = self._param("out", nid)
        mask = self._mask(axes) or "rmask"
        val = store_expr(v.name, n.dtype)
        if not ix.axes(off):  # a scalar destination: make the pointer a block like the value
            mask = "rmask"
            off = ix.offset(index, n.stride)
            self._scope_for(axes).lines.append(f"tl.store({ptr} + (zr + {ix.render(off)}), {val}, mask={mask})")
            return
        self._scope_for(axes).lines.append(f"tl.store({ptr} + {self._offset(off, axes)}, {val}, mask={mask})")

    def scatter_store(self, nid: int) -> None:
        """Embedding backward: add each row of grad into out[index[row]] (atomics)."""
        n = self.g[nid]
        grad, idx = n.refs
        full = self.full_index()
        g = self.value(grad, full)
        iv = self.value(idx, full[:-1])
        pad = n.attr("padding_idx")
        off = ix.offset((ix.loaded(iv.name, n.shape[0], frozenset(iv.axes)), full[-1]), n.stride)
        ptr = self._param("out", nid)
        keep = f" & ({iv.name} != {pad})" if pad is not None and pad >= 0 else ""
        self.scopes[-1].lines.append(
            f"tl.atomic_add({ptr} + {ix.render(off)}, {g.name}, mask=rmask & cmask{keep}, sem='relaxed')")

    def partial_store(self, nid: int) -> None:
        """A column reduction: accumulate over this program's row blocks, then write
        one partial row per program; a combine kernel reduces the partials."""
        n = self.g[nid]
        src = self.g[n.refs[0]]
        lead = len(n.attr("dims"))
        red = ix.unravel(self.row_flat, src.shape[:lead])
        kept = ix.unravel(self.col_flat, src.shape[lead:])
        v = self.value(src.id, tuple(red) + tuple(kept))
        cd = compute_dtype(n.dtype)
        ident = reduce_identity(n.op, cd)
        combine = REDUCE_COMBINE[n.op]
        acc = self._new("pacc")
        self.before.append(f"{acc} = tl.full([{self.m.block_r}, {self.m.block_c}], {ident}, {TL_DTYPE[cd]})")
        self.top.lines.append(f"{acc} = {combine}({acc}, tl.where(rmask & cmask, {v.name}, {ident}))")
        ptr = self._param("partial", nid)
        red_expr = f"tl.sum({acc}, 0)" if n.op == "sum" else f"tl.reduce({acc}, 0, {combine})"
        pid = "tl.program_id(0).to(tl.int64)" if self.idx64 else "tl.program_id(0)"
        cflat_lines = [f"cflat = tl.arange(0, {self.m.block_c})[None, :]", f"cmask = cflat < {self.dom.cols}"]
        self.after.extend(cflat_lines)
        self.after.append(f"tl.store({ptr} + {pid} * {self.dom.cols} + cflat, {red_expr}[None, :], mask=cmask)")

    # -- whole kernel ----------------------------------------------------------
    def emit(self) -> KernelSource:
        m, dom = self.m, self.dom
        t = self.top.lines
        pid = "tl.program_id(0).to(tl.int64)" if self.idx64 else "tl.program_id(0)"
        if self.k.partials:  # the row block of the grid-stride walk below
            pid = "rblk.to(tl.int64)" if self.idx64 else "rblk"
        if self.flat:
            t.append(f"rflat = {pid} * {m.block_r} + tl.arange(0, {m.block_r})")
        else:
            t.append(f"rflat = {pid} * {m.block_r} + tl.arange(0, {m.block_r})[:, None]")
        t.append(f"rmask = rflat < {dom.rows}")
        t.append("zr = rflat * 0")
        self.vars = self._define_vars(self.top, ROW)
        self.col_flat = ix.const(0)
        if not self.flat and not self.looped:
            t.append(f"cflat = tl.arange(0, {m.block_c})[None, :]")
            t.append(f"cmask = cflat < {dom.cols}")
            t.append("zc = cflat * 0")
            self.vars.update(self._define_vars(self.top, COL))
        if not self.flat:
            col_dims = list(dom.col_dims)
            col_sizes = tuple(dom.shape[d] for d in col_dims)
            if self.looped:
                # loop scopes define c* names themselves; the symbols are shared
                for d in col_dims:
                    self.vars[d] = ix.var(f"c{d}", dom.shape[d], COL)
            self.col_flat = ix.flatten(tuple(self.vars[d] for d in col_dims), col_sizes)
            row_dims = [d for d in range(len(dom.shape)) if d not in dom.col_dims]
            self.row_flat = ix.flatten(tuple(self.vars[d] for d in row_dims),
                                       tuple(dom.shape[d] for d in row_dims))
        self.before: list[str] = []   # accumulators of column partials (outside the row-block walk)
        self.after: list[str] = []    # their final reduction and store
        for o in self.k.partials:
            self.partial_store(o)
        outputs = [o for o in self.k.outputs if o not in self.k.partials]
        row_level = [o for o in outputs if not self._is_full(o)]
        full_level = [o for o in outputs if self._is_full(o)]
        for o in row_level:
            self.store(o)
        if full_level:
            if self.looped:
                self._open_loop()
            for o in full_level:
                if self.g[o].kind == ir.SCATTER_ADD:
                    self.scatter_store(o)
                else:
                    self.store(o)
            if self.looped:
                self._close_loop()
        params = [self.pname[p] for p in self.params]
        lines = self.top.lines
        if self.k.partials:
            # programs walk the row blocks with a grid stride (the grid is written out,
            # not tl.num_programs: as a phase of a global kernel the launch grid differs)
            blocks = -(-dom.rows // m.block_r)
            lines = (self.before + [f"for rblk in range(tl.program_id(0), {blocks}, {m.grid}):"]
                     + ["    " + x for x in lines] + self.after)
        return KernelSource(self.k.name, list(self.params), params, lines, m.grid, m.num_warps,
                            {k: frozenset(v) for k, v in self.levels.items()})

    def _is_full(self, nid: int) -> bool:
        if self.g[nid].kind == ir.SCATTER_ADD:
            return True
        return self.flat or self.g[nid].numel != self.dom.rows or self.dom.cols == 1


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
    if op == "as_strided":
        flat = ix.offset(index, n.attr("stride"), n.attr("offset"))
        return ix.unravel(flat, src.shape)
    raise NotImplementedError(f"view op {op}")


def generate(g: ir.Graph, k: KernelPlan) -> KernelSource:
    if k.mapping.form == "combine":
        return generate_combine(g, k)
    # pulling recurses once per dependency level (a few frames per node): allow as
    # many levels as the graph has nodes, e.g. 100 unrolled simulator steps
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old, min(8 * len(g.nodes) + 1000, 200_000)))
    try:
        return Emitter(g, k).emit()
    finally:
        sys.setrecursionlimit(old)


def generate_combine(g: ir.Graph, k: KernelPlan) -> KernelSource:
    """Reduce the (programs x cols) partials of column reductions into their outputs."""
    rows = k.domain.shape[0]
    bc = k.mapping.block_c
    lines = [f"c = tl.program_id(0) * {bc} + tl.arange(0, {bc})"]
    params, names = [], []
    for i, nid in enumerate(k.outputs):
        n = g[nid]
        cols = n.numel
        cd = compute_dtype(n.dtype)
        ident = reduce_identity(n.op, cd)
        combine = REDUCE_COMBINE[n.op]
        off = ix.offset(ix.unravel(ix.var("c", cols, ROW), n.shape), n.stride)
        store = store_expr(f"acc{i}", n.dtype)
        lines += [
            f"cmask{i} = c < {cols}",
            f"acc{i} = tl.full([{bc}], {ident}, {TL_DTYPE[cd]})",
            f"for r in range({rows}):",
            f"    acc{i} = {combine}(acc{i}, tl.load(part{i} + r * {cols} + c, mask=cmask{i}, other={ident}))",
            # a one-element output has a constant offset: keep the pointer a block (c * 0)
            f"tl.store(out{i} + {ix.render(off) if ix.axes(off) else f'(c * 0 + {ix.render(off)})'}, "
            f"{store}, mask=cmask{i})",
        ]
        params += [("partial", nid), ("out", nid)]
        names += [f"part{i}", f"out{i}"]
    return KernelSource(k.name, params, names, lines, k.mapping.grid, k.mapping.num_warps, {})
