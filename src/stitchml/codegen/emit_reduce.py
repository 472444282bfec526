"""Reductions of the Triton emitter.

Row-persistent and packed kernels hold whole rows in registers: a reduction is one
`tl.sum` / `tl.reduce` over the column axis of the values pulled at the full index.
Row-looped kernels walk the row in column blocks: each loop of
`plan/row_loops.py::loop_groups` is one pass over the row, accumulating per-lane
partials that are reduced across lanes after the loop; an online pair (row maximum and
`sum(exp(x - max))`) keeps a running maximum and rescales its sum, so softmax-like
kernels read the row once for both statistics.
"""
from __future__ import annotations

import torch

from .. import config
from ..ir import index as ix
from ..ir import nodes as ir
from ..plan.graph_view import is_free
from ..plan.row_loops import loop_groups, online_partner
from .emit_core import COL, ROW, KernelBuilder, Val
from .triton_ops import REDUCE_COMBINE, TL_DTYPE, compute_dtype, pointwise_expr, reduce_identity

assert set(REDUCE_COMBINE) == ir.COMBINABLE_REDUCES, "every combinable reduction needs a Triton combine"

_INF = 'float("inf")'


class Reductions:
    def __init__(self, b: KernelBuilder):
        self.b = b
        self.loop_of: dict[int, tuple[int, ...]] = {}
        if b.looped:
            # (column partials are reduced in the last loop, emit_store.looped_partial)
            for grp in loop_groups(b.g, tuple(m for m in b.k.members if m not in b.k.partials)):
                for r in grp:
                    self.loop_of[r] = grp
        self.running: set[int] = set()   # reductions whose loop is being emitted

    def input_index(self, n: ir.Node, index: tuple[ix.Expr, ...]) -> tuple[tuple[ix.Expr, ...], tuple, tuple[int, ...]]:
        """The index of a reduction's operand: `index` on the kept dims, the column
        axis unravelled over the reduced dims."""
        src = self.b.g[n.refs[0]]
        dims = n.attr("dims")
        red_sizes = tuple(src.shape[d] for d in dims)
        red = ix.unravel(self.b.col_flat, red_sizes)
        full, ki, ri = [], iter(index), iter(red)
        for d in range(len(src.shape)):
            full.append(next(ri) if d in dims else next(ki))
        return tuple(full), red, red_sizes

    def reduce(self, n: ir.Node, index: tuple[ix.Expr, ...]) -> Val:
        b = self.b
        outer, b.cond = b.cond, tuple(c for c in b.cond if COL not in c[1])
        try:
            return self._reduce(n, index, outer)
        finally:
            b.cond = outer

    def _reduce(self, n: ir.Node, index, outer_cond=()) -> Val:
        b = self.b
        if any(COL in ix.axes(e) for e in index):
            raise ix.IndexMismatch("reduction requested at a column-dependent index")
        if n.op in ("argmax", "argmin"):
            return self._argreduce(n, index)
        cd = compute_dtype(n.dtype)
        if b.segs:
            return self._segmented(n, index, cd)
        if not b.looped:
            full, _, _ = self.input_index(n, index)
            v = b.value(n.refs[0], full)
            body = f"tl.where(rmask & cmask, {v.name}, {reduce_identity(n.op, cd)})"
            sibs = self._sum_siblings(n, index, outer_cond, cd) if n.op == "sum" else []
            if sibs:
                return self._tuple_sum(n, body, sibs, index, outer_cond, cd)
            expr = f"tl.sum({body}, 1)" if n.op == "sum" else f"tl.reduce({body}, 1, {REDUCE_COMBINE[n.op]})"
            return b.emit(b.top, f"{expr}[:, None]", {ROW}, cd)
        group = [b.g[r] for r in self.loop_of[n.id]] if n.id in self.loop_of else [n]
        if n.id in self.running or any(r.id in self.running for r in group):
            group = [n]   # requested from inside its own loop's operands: a loop of its own
        else:
            group = [r for r in group if r.id == n.id or (r.id, index, outer_cond) not in b.top.cache]
        self.running |= {r.id for r in group}
        try:
            vals = self._loop(group, index)
        finally:
            self.running -= {r.id for r in group}
        for r, val in zip(group, vals):
            if r.id != n.id:  # found by value() when they are requested
                b.remember(r.id, index, outer_cond, val)
        return vals[[r.id for r in group].index(n.id)]

    def _segmented(self, n: ir.Node, index, cd: torch.dtype) -> Val:
        """A row held as segments (`Mapping.segments`): each segment's lanes masked to the
        identity, combined element-wise in registers (the segments share their layout:
        no data moves), then one reduction over the lanes: within a warp when the
        segment is one warp wide."""
        b = self.b
        full, _, _ = self.input_index(n, index)
        ident = reduce_identity(n.op, cd)
        acc = None
        for i in range(len(b.segs)):
            with b.in_segment(i) as seg:
                v = b.value(n.refs[0], full)
                part = b.emit(seg, f"tl.where(rmask & cmask, {v.name}, {ident})", {ROW, COL}, cd).name
            acc = part if acc is None else (f"({acc} + {part})" if n.op == "sum"
                                              else f"{REDUCE_COMBINE[n.op]}({acc}, {part})")
        acc_val = b.emit(b.top, acc, {ROW, COL}, cd)   # (segment lanes, no column names: the top scope)
        expr = f"tl.sum({acc_val.name}, 1)" if n.op == "sum" else f"tl.reduce({acc_val.name}, 1, {REDUCE_COMBINE[n.op]})"
        return b.emit(b.top, f"{expr}[:, None]", {ROW}, cd)

    # -- sibling row sums in one tuple reduction (knob `tuple_reductions`)
    def _sum_siblings(self, n: ir.Node, index, outer_cond, cd: torch.dtype) -> list[ir.Node]:
        """Up to two other row sums of this kernel that can be reduced with `n` in one
        pass: same reduced dims over an operand of the same shape, same result shape and
        compute dtype, not computed yet at this index, and neither reading `n` nor each
        other (their operands are then emitted before the reduction)."""
        b = self.b
        if not config.get("tuple_reductions") or b.segs:
            return []
        src = b.g[n.refs[0]]
        out: list[ir.Node] = []
        for mid in b.k.members:
            r = b.g[mid]
            if (r.id == n.id or r.op != "sum" or mid in b.k.partials or r.shape != n.shape
                    or r.attr("dims") != n.attr("dims") or b.g[r.refs[0]].shape != src.shape
                    or compute_dtype(r.dtype) != cd or (r.id, index, outer_cond) in b.top.cache):
                continue
            if self._reads(r.refs[0], {n.id} | {x.id for x in out}) or any(
                    self._reads(x.refs[0], {r.id}) for x in out) or self._reads(n.refs[0], {r.id}):
                continue
            out.append(r)
            if len(out) == 2:
                break
        return out

    def _reads(self, nid: int, targets: set[int]) -> bool:
        """Whether the value of `nid` depends on any of `targets` inside this kernel."""
        seen: set[int] = set()
        stack = [nid]
        while stack:
            x = stack.pop()
            if x in targets:
                return True
            # (free nodes, views and constants, are computed inline, not members: walk them too)
            if x in seen or (x not in self.b.members and not is_free(self.b.g[x])):
                continue
            seen.add(x)
            stack.extend(self.b.g[x].refs)
        return False

    def _tuple_sum(self, n: ir.Node, body: str, sibs: list[ir.Node], index, outer_cond, cd) -> Val:
        b = self.b
        bodies = [body]
        for r in sibs:
            full, _, _ = self.input_index(r, index)
            v = b.value(r.refs[0], full)
            bodies.append(f"tl.where(rmask & cmask, {v.name}, {reduce_identity('sum', cd)})")
        names = [b.new("s") for _ in bodies]
        b.top.lines.append(f"{', '.join(names)} = tl.reduce(({', '.join(bodies)}), 1, _add{len(bodies)})")
        vals = [b.emit(b.top, f"{name}[:, None]", {ROW}, cd) for name in names]
        for r, val in zip(sibs, vals[1:]):
            b.remember(r.id, index, outer_cond, val)
        return vals[0]

    def _loop(self, group: list[ir.Node], index) -> list[Val]:
        """One pass over the row: independent reductions accumulate side by side, and
        an online pair (`m = amax(x)`, `s = sum(exp(x - m))`, `plan/row_loops.py`) keeps
        a running maximum and a sum *per lane*, combined across lanes once, after the
        loop.  A running maximum per row (a cross-lane reduction every column block)
        made each block wait on a shared-memory round trip: the H200 ran a softmax over
        rows of 262144 bfloat16 values, 128 blocks a program, at 1 TB/s (128 µs for
        134 MB; twelfth session), where the RMS norm's sum of squares over the same
        rows and grid, accumulated per lane, took 24.8 µs.
        Per lane and element, one exp: with d = x - m_lane, e = exp(-|d|) is the
        new term when x does not raise the lane's maximum (s += e) and the rescale
        when it does (s = s * e + 1).  After the loop m = max over lanes and
        s = sum(s_lane * exp(m_lane - m)).
        The update is the kernel's issue budget (an H200 issues ~16 instructions a
        bfloat16 element at copy speed; it was 19 in sm_90 SASS, `tools/aot_check`'s
        "SASS a byte"), so each step is the cheapest that keeps eager's answers:
        - lanes start at the lowest finite value, not -inf: a -inf value then gives
          d = -inf, e = 0, and adds nothing without a test (from -inf, -inf - -inf
          would be NaN); a row of -inf values ends with s = 0, which is how it is
          told apart after the loop: its maximum is -inf and its sum NaN, as eager;
        - the running maximum propagates NaN in one instruction (`max.NaN`), and a
          NaN's d makes the lane's sum NaN, so the row's;
        - in float32 the exp is `ex2.approx.ftz` (`_exp_ftz`): a term below 2^-126
          adds nothing to a sum of at least 1 anyway; Triton's `exp` spends three
          instructions an element on subnormal results.
        A +inf maximum gives exp(inf - inf) = NaN as eager does."""
        b = self.b
        ids = {r.id for r in group}
        pair = next(((m, s.id) for s in group if (m := online_partner(b.g, s)) in ids), None)
        plain = [r for r in group if pair is None or r.id not in pair]
        shape = f"[{b.m.block_r}, {b.m.block_c}]"
        accs = {}
        for r in plain:
            accs[r.id] = acc = b.new("acc")
            rcd = compute_dtype(r.dtype)
            b.top.lines.append(f"{acc} = tl.full({shape}, {reduce_identity(r.op, rcd)}, {TL_DTYPE[rcd]})")
        if pair:
            mx = b.g[pair[0]]
            cd = compute_dtype(mx.dtype)
            m_run, s_acc = b.new("mrun"), b.new("sacc")
            b.top.lines.append(f"{m_run} = tl.full({shape}, {torch.finfo(cd).min!r}, {TL_DTYPE[cd]})")
            b.top.lines.append(f"{s_acc} = tl.full({shape}, 0, {TL_DTYPE[cd]})")
        b.open_loop()
        loop = b.scopes[-1]
        for r in plain:
            full, _, _ = self.input_index(r, index)
            v = b.value(r.refs[0], full)
            rident = reduce_identity(r.op, compute_dtype(r.dtype))
            loop.lines.append(f"{accs[r.id]} = {REDUCE_COMBINE[r.op]}({accs[r.id]}, "
                              f"tl.where(rmask & cmask, {v.name}, {rident}))")
        if pair:
            full, _, _ = self.input_index(mx, index)
            x = b.value(mx.refs[0], full)
            xv, d, e = b.new("xv"), b.new("d"), b.new("e")
            nanmax = REDUCE_COMBINE["amax"]
            # (float64 keeps the table's exp: the ftz form is float32's)
            exp = ((lambda a: f"_exp_ftz({a})") if cd == torch.float32
                   else (lambda a: pointwise_expr("exp", [a], cd, cd)))
            loop.lines += [
                f"{xv} = tl.where(rmask & cmask, {x.name}, -{_INF})",
                f"{d} = {xv} - {m_run}",
                f"{e} = {exp(f'(-tl.abs({d}))')}",
                f"{s_acc} = tl.where({d} > 0, {s_acc} * {e} + 1.0, {s_acc} + {e})",
                f"{m_run} = tl.maximum({m_run}, {xv}, propagate_nan=tl.PropagateNan.ALL)",
            ]
        b.close_loop()
        out = {}
        for r in plain:
            acc = accs[r.id]
            expr = f"tl.sum({acc}, 1)" if r.op == "sum" else f"tl.reduce({acc}, 1, {REDUCE_COMBINE[r.op]})"
            out[r.id] = b.emit(b.top, f"{expr}[:, None]", {ROW}, compute_dtype(r.dtype))
        if pair:
            # a lane that saw only -inf holds (lowest, 0): its term is 0 whatever m is
            m_low = b.emit(b.top, f"tl.reduce({m_run}, 1, {nanmax})[:, None]", {ROW}, cd)
            s_row = b.emit(b.top, f"tl.sum({s_acc} * {exp(f'({m_run} - {m_low.name})')}, 1)[:, None]", {ROW}, cd)
            # a row of -inf values (s = 0): maximum -inf, sum NaN, as eager
            out[pair[0]] = b.emit(b.top, f"tl.where({s_row.name} == 0, -{_INF}, {m_low.name})", {ROW}, cd)
            out[pair[1]] = b.emit(b.top, f"tl.where({s_row.name} == 0, float('nan'), {s_row.name})", {ROW}, cd)
        return [out[r.id] for r in group]

    def _argreduce(self, n: ir.Node, index) -> Val:
        b = self.b
        src = b.g[n.refs[0]]
        is_max = n.op == "argmax"
        best_node = ir.Node(-n.id - 1, ir.REDUCE, "amax" if is_max else "amin", n.args, n.shape, src.dtype,
                            None, n.attrs)
        best = self.reduce(best_node, index)
        big = "9223372036854775807"
        acc = None
        if b.looped:
            acc = b.new("acc")
            b.top.lines.append(f"{acc} = tl.full([{b.m.block_r}, {b.m.block_c}], {big}, tl.int64)")
            b.open_loop()
        full, red, red_sizes = self.input_index(n, index)
        v = b.value(n.refs[0], full)
        pos = ix.flatten(red, red_sizes)
        scope = b.scopes[-1]
        hit = f"(({v.name} == {best.name}) | (({v.name} != {v.name}) & ({best.name} != {best.name})))"
        cand = f"tl.where(rmask & cmask & {hit}, ({ix.render(pos)} + zc).to(tl.int64), {big})"
        if b.looped:
            scope.lines.append(f"{acc} = _nanmin({acc}, {cand})")
            b.close_loop()
            return b.emit(b.top, f"tl.min({acc}, 1)[:, None]", {ROW}, torch.int64)
        return b.emit(b.top, f"tl.min({cand}, 1)[:, None]", {ROW}, torch.int64)


__all__ = ["Reductions"]
