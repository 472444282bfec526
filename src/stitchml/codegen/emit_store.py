"""Stores of the Triton emitter: kernel outputs at their index, atomic scatter-adds,
and column partials (per-program partial rows of a column reduction)."""
from __future__ import annotations

import torch

from ..ir import index as ix
from ..ir import nodes as ir
from .emit_core import COL, ROW, KernelBuilder
from .triton_ops import REDUCE_COMBINE, TL_DTYPE, compute_dtype, reduce_identity, store_expr


class Stores:
    def __init__(self, b: KernelBuilder):
        self.b = b
        self.before: list[str] = []   # accumulators of column partials (outside the row-block walk)
        self.after: list[str] = []    # their final reduction and store

    def is_full(self, nid: int) -> bool:
        """Stored per element (in the column loop of a looped kernel), not per row."""
        b = self.b
        if b.g[nid].kind == ir.SCATTER_ADD:
            return True
        return b.flat or b.g[nid].numel != b.dom.rows or b.dom.cols == 1

    def _permuted_index(self, n: ir.Node):
        """If `n` is (a same-shape element-wise op of) a permute of a domain-shaped
        value, index it by the permuted domain index, so its producers stay at the
        domain's own index (no reduction is asked for at a transposed position)."""
        b = self.b
        while True:
            if n.kind == ir.VIEW and n.op == "permute" and b.g[n.refs[0]].shape == b.dom.shape:
                full = b.full_index()
                return tuple(full[d] for d in n.attr("dims"))
            if n.kind == ir.POINTWISE and n.refs and all(b.g[r].shape == n.shape for r in n.refs):
                n = b.g[n.refs[0]]
                continue
            return None

    def output_index(self, nid: int) -> tuple[ix.Expr, ...]:
        b = self.b
        n = b.g[nid]
        if n.shape == b.dom.shape:
            return b.full_index()
        permuted = self._permuted_index(n)
        if permuted is not None:
            return permuted
        if not b.flat and n.numel == b.dom.rows:
            row_index = tuple(b.vars[d] for d in range(len(b.dom.shape)) if d not in b.dom.col_dims)
            row_shape = tuple(s for d, s in enumerate(b.dom.shape) if d not in b.dom.col_dims)
            return ix.unravel(ix.flatten(row_index, row_shape), n.shape)
        return ix.unravel(ix.flatten(b.full_index(), b.dom.shape), n.shape)

    def store(self, nid: int) -> None:
        b = self.b
        n = b.g[nid]
        if n.kind == ir.SCATTER_ADD:
            return self._scatter_add(nid)
        index = self.output_index(nid)
        v = b.value(nid, index)
        off = ix.offset(index, n.stride)
        b.stores.append((nid, off))
        axes = ix.axes(off) | v.axes
        if COL in axes and ROW not in axes and b.m.block_r > 1 and not b.flat:
            # a column-only value under a block of several rows may still span them (a
            # scalar is loaded as a block of the row axis, `KernelBuilder.offset`): the
            # pointer a [BLOCK_R, C] block too, the mask keeping the real rows (DeBERTa-v2's
            # relative-position buckets from two 0-d tensors, one row, a dynamic template's
            # row block of 32)
            axes = axes | {ROW}
        ptr = b.param("out", nid)
        val = store_expr(v.name, n.dtype)
        if not axes:  # a scalar value and destination: a block of the row axis, one lane stores
            b.scope_for(axes).lines.append(f"tl.store({ptr} + (zr + {b.render_index(off)}), {val}, mask=rmask)")
            return
        # the pointer a block like the value: a store broadcasts the value to the pointer's
        # shape, never the other way (a one-row reduction under a fixed row block of a
        # dynamic template: a [BLOCK_R, C] value, a destination indexed by the column alone)
        zeros = [z for a, z in ((ROW, "zr"), (COL, "zc")) if a in axes and a not in ix.axes(off)]
        address = (b.aligned_address(nid, off, axes)
                   or (b.offset(off, axes) if not zeros else f"({' + '.join(zeros)} + {b.render_index(off)})"))
        mask = b.mask(axes) or "rmask"
        b.scope_for(axes).lines.append(f"tl.store({ptr} + {address}, {val}, mask={mask})")

    def _scatter_add(self, nid: int) -> None:
        """Embedding backward: add each row of grad into out[index[row]] (atomics); with
        attr combine="max", the scatter-write's winner: the largest value (a source
        position + 1) kept per destination."""
        b = self.b
        n = b.g[nid]
        grad, idx = n.refs
        full = b.full_index()
        g = b.value(grad, full)
        iv = b.value(idx, full[:-1])
        pad = n.attr("padding_idx")
        off = ix.offset((ix.loaded(iv.name, n.shape[0], frozenset(iv.axes)), full[-1]), n.stride)
        ptr = b.param("out", nid)
        keep = f" & ({iv.name} != {pad})" if pad is not None and pad >= 0 else ""
        # a destination row out of range is an error in eager: assert it (live in the
        # interpreter and with TRITON_DEBUG=1) and drop the write, so no lane writes
        # outside the buffer (advanced indexing marks an index out of range in any dim
        # with a linear index past every row: `rules_index.OUT_OF_RANGE`)
        rows = n.shape[0]
        inside = f"({iv.name} >= 0) & ({iv.name} < {rows})"
        mask = b.mask(iv.axes)
        b.scopes[-1].lines.append(f"tl.device_assert({inside if not mask else f'{inside} | ~({mask})'}, "
                                  f"'index out of range')")
        keep += f" & {inside}"
        value = g.name
        if not g.axes:
            # a constant summand (a count: segment lengths' offsets, embedding bags' sizes)
            # is a [1] block; Triton 3.6's atomics take a value of the pointer's rank only
            # (the interpreter broadcasts: 57 kernels of the tests refused for sm_90 by
            # `tools/aot_replay.py`, bench/NOTES.md, forty-second session)
            value = b.emit(b.scopes[-1], f"tl.where(rmask & cmask, {g.name}, {g.name})", {ROW, COL}, g.dtype)
            value = value.name
        address = b.render_index(off)
        if ix.axes(off) != {ROW, COL}:
            # an address along fewer axes than the value (a constant destination: the
            # scatter-write of a one-element view, fuzz seed 41776) is a smaller block:
            # the interpreter refuses the pair, so the address is widened to the tile
            address = f"(zr + zc + {address})"
        if n.attr("combine") == "mul":  # a compare-and-swap loop (triton_ops._atomic_mul)
            wide = n.dtype in (torch.float64, torch.int64)
            b.scopes[-1].lines.append(
                f"_atomic_mul({ptr}, {address}, {value}, rmask & cmask{keep}, "
                f"{n.dtype.is_floating_point}, {wide})")
            return
        op = "atomic_max" if n.attr("combine") == "max" else "atomic_add"
        b.scopes[-1].lines.append(f"tl.{op}({ptr} + {address}, {value}, mask=rmask & cmask{keep}, sem='relaxed')")

    def _partial_parts(self, nid: int) -> tuple[ir.Node, str, torch.dtype, str, str]:
        """A column reduction's summand at this program's (row, column) index: the node,
        the value's name, the compute type, the identity and the program's partial row."""
        b = self.b
        n = b.g[nid]
        src = b.g[n.refs[0]]
        # reduced dims along the program's rows, kept along its columns, both in natural
        # order (leading dims, or leading in memory: `plan/grouping.py::outer_in_memory`)
        dims = n.attr("dims")
        kept_dims = [d for d in range(len(src.shape)) if d not in dims]
        idx: list = [None] * len(src.shape)
        for ds, flat in ((dims, b.row_flat), (kept_dims, b.col_flat)):
            for d, e in zip(ds, ix.unravel(flat, tuple(src.shape[d] for d in ds))):
                idx[d] = e
        v = b.value(src.id, tuple(idx))
        cd = compute_dtype(n.dtype)
        pid = "tl.program_id(0).to(tl.int64)" if b.idx64 else "tl.program_id(0)"
        row = f"{b.param('partial', nid)} + {pid} * {b.dom.cols}"
        return n, v.name, cd, reduce_identity(n.op, cd), row

    def partial(self, nid: int, segment: int | None = None) -> None:
        """A column reduction: accumulate over this program's row blocks, then write
        one partial row per program; a combine kernel reduces the partials.  In a row
        held as segments (`Mapping.segments`), call it inside each segment: an
        accumulator a segment, stored at the segment's columns."""
        b = self.b
        n, v, cd, ident, row = self._partial_parts(nid)
        combine = REDUCE_COMBINE[n.op]
        acc = b.new("pacc")
        self.before.append(f"{acc} = tl.full([{b.m.block_r}, {b.m.block_c}], {ident}, {TL_DTYPE[cd]})")
        b.scopes[-1].lines.append(f"{acc} = {combine}({acc}, tl.where(rmask & cmask, {v}, {ident}))")
        red_expr = f"tl.sum({acc}, 0)" if n.op == "sum" else f"tl.reduce({acc}, 0, {combine})"
        first = (segment or 0) * b.m.block_c
        self.after.extend([f"cflat = {first} + tl.arange(0, {b.m.block_c})[None, :]",
                           f"cmask = cflat < {b.dom.cols}"])
        self.after.append(f"tl.store({row} + cflat, {red_expr}[None, :], mask=cmask)")

    def looped_partial(self, nid: int) -> None:
        """A column reduction in a row-looped kernel (inside its last loop): the column
        block's reduction over the program's rows, stored as the block of the program's
        partial row.  Each program owns its partial row; where it walks row blocks
        (`Mapping.row_blocks` > 1, a grid stride from its program id) every block after
        its first adds to what the one before stored: the load and the store have the
        same pointers, so each thread reads back its own store."""
        n, v, cd, ident, row = self._partial_parts(nid)
        body = f"tl.where(rmask & cmask, {v}, {ident}).to({TL_DTYPE[cd]})"
        red_expr = f"tl.sum({body}, 0)" if n.op == "sum" else f"tl.reduce({body}, 0, {REDUCE_COMBINE[n.op]})"
        if self.b.m.row_blocks > 1:
            b = self.b
            part = b.new("part")
            prev = b.new("prev")
            b.scopes[-1].lines += [
                f"{part} = {red_expr}[None, :]",
                # (the row block as a tensor of cflat's shape: a scalar condition in a mask is
                # refused by the interpreter)
                f"{prev} = tl.load({row} + cflat, mask=cmask & (cflat * 0 + rblk > tl.program_id(0)), "
                f"other={ident})",
                f"tl.store({row} + cflat, {REDUCE_COMBINE[n.op]}({prev}, {part}), mask=cmask)"]
            return
        self.b.scopes[-1].lines.append(f"tl.store({row} + cflat, {red_expr}[None, :], mask=cmask)")

__all__ = ["Stores"]
