"""Scatters (issue 18): `scatter_add` / `scatter_reduce(sum)` (and 'mean': sums and
counts, then divided; 'amax'/'amin': an int64 atomic max of order-preserving keys;
'prod': a compare-and-swap multiply;
`index_reduce` through them) into the scatter-add
kernel form (atomics; refused under torch.use_deterministic_algorithms(True)),
`scatter.src` as a scatter-write (an atomic max picks each destination's last
writer, a gather reads it: deterministic), and
`_unsafe_masked_index` (a gather whose masked-off positions take a fill value)."""
from __future__ import annotations

import torch

from ..ir import nodes as ir
from ..ir.nodes import Ref, contiguous_strides
from .context import FLOAT_TYPES, LowerCtx, static_shape
from .registry import Unsupported, register
from .rules_index import _index, _scatter_add_rows, scatter_winner, scatter_written, stored_sum

aten = torch.ops.aten


def _iota(ctx: LowerCtx, shape, dim: int) -> Ref:
    return Ref(ctx.g.add(ir.POINTWISE, "iota", (), shape, torch.int64, contiguous_strides(shape),
                         (("dim", dim),)))


def _untouched(ctx: LowerCtx, node, x, index) -> Ref | None:
    """An empty index scatters nothing (eager accepts any rank then): x itself."""
    if ir.prod(ctx.shape(index)) != 0:
        return None
    val = node.meta["val"]
    return ctx.pointwise("identity", (ctx.cast(x, val.dtype),), static_shape(val), val.dtype)


def _scatter_index(ctx: LowerCtx, shape, dim: int, index, src) -> tuple[Ref, Ref]:
    """scatter's addressing: the element of src at p goes to x at p with `dim` replaced
    by index[p].  Returns (the linear destination of each index element, flat (m,);
    the part of src the index covers, flat (m, 1), or the scalar of scatter.value)."""
    nd = len(shape)
    if nd == 0:
        raise Unsupported("scatter of a 0-d tensor")
    ishape = ctx.shape(index)
    if len(ishape) != nd:
        raise Unsupported("scatter needs index of the same rank as the input")
    if isinstance(src, Ref) and any(ishape[d] > ctx.shape(src)[d] for d in range(nd)):
        raise Unsupported("scatter index larger than src")
    i64 = torch.int64
    idx = ctx.cast(index, i64)
    neg = ctx.pointwise("lt", (idx, 0), ishape, torch.bool)
    idx = ctx.pointwise("where", (neg, ctx.pointwise("add", (idx, shape[dim]), ishape, i64), idx), ishape, i64)
    lin, stride = None, 1
    for d in reversed(range(nd)):
        coord = idx if d == dim else _iota(ctx, ishape, d)
        term = coord if stride == 1 else ctx.pointwise("mul", (coord, stride), ishape, i64)
        lin = term if lin is None else ctx.pointwise("add", (lin, term), ishape, i64)
        stride *= shape[d]
    m = ir.prod(ishape)
    if not isinstance(src, Ref):  # scatter.value: the scalar itself
        return ctx.reshape(lin, (m,)), src
    if tuple(ctx.shape(src)) != tuple(ishape):  # only the part of src the index covers is scattered
        src = _narrowed(ctx, src, ishape)
    return ctx.reshape(lin, (m,)), ctx.reshape(src, (m, 1))


def _scatter_sum(ctx: LowerCtx, node, x, dim: int, index, src, include_self: bool = True) -> Ref:
    val = node.meta["val"]
    if (same := _untouched(ctx, node, x, index)) is not None:
        return same
    shape = static_shape(val)
    if not shape:  # 0-d: index 0 adds src's value once
        at = torch.int64 if val.dtype == torch.bool else val.dtype
        total = ctx.pointwise("add", (ctx.reshape(ctx.cast(src, at), ()), ctx.cast(x, at) if
                                      include_self else 0), (), at)
        return stored_sum(ctx, total, (), val.dtype)
    lin, vals = _scatter_index(ctx, shape, dim % max(len(shape), 1), index, src)
    acc = ctx.reshape(_scatter_add_rows(ctx, ctx.cast(vals, val.dtype), lin, ir.prod(shape), 1), shape)
    at = ctx.dtype(acc)
    if include_self:
        acc = ctx.pointwise("add", (ctx.cast(x, at), acc), shape, at)
    else:  # positions no index reaches keep x (the scatter-write's winner marks the reached ones)
        hit = ctx.pointwise("gt", (ctx.reshape(scatter_winner(ctx, lin, ir.prod(shape)), shape), 0), shape,
                            torch.bool)
        acc = ctx.pointwise("where", (hit, acc, ctx.cast(x, at)), shape, at)
    return stored_sum(ctx, acc, shape, val.dtype)


def _narrowed(ctx: LowerCtx, src: Ref, ishape) -> Ref:
    for d, n in enumerate(ishape):
        if ctx.shape(src)[d] != n:
            shape = tuple(n if i == d else s for i, s in enumerate(ctx.shape(src)))
            src = ctx.view("slice", src, shape, (("dim", d), ("start", 0), ("step", 1)))
    return src


def scatter_write(ctx: LowerCtx, node: torch.fx.Node, x: Ref, dim: int, index: Ref, src: Ref | int | float) -> Ref:
    """x with src's elements written at scatter's addresses (`rules_index.scatter_winner`:
    of duplicate destinations the last source position wins)."""
    val = node.meta["val"]
    shape = static_shape(val)
    if (same := _untouched(ctx, node, x, index)) is not None:
        return same
    if not shape:  # 0-d: the only valid index is 0, so src's value
        v = ctx.reshape(ctx.cast(src, val.dtype), ()) if isinstance(src, Ref) else ctx.full((), src, val.dtype)
        return ctx.pointwise("identity", (v,), (), val.dtype)
    n = ir.prod(shape)
    lin, vals = _scatter_index(ctx, shape, dim % max(len(shape), 1), index, src)
    out = scatter_written(ctx, node, scatter_winner(ctx, lin, n), vals, ctx.reshape(x, (n, 1)), val.dtype)
    return ctx.reshape(out, shape)


@register(aten.scatter.src)
def _scatter_src(ctx, node, x, dim, index, src):
    return scatter_write(ctx, node, x, dim, index, src)


@register(aten.scatter.reduce, aten.scatter.value_reduce)
def _scatter_reduce_str(ctx, node, x, dim, index, src, *, reduce):
    """The older string form: reduce="add" is scatter_add, "multiply" scatter_reduce's
    'prod' with x included (of a value: of a full tensor)."""
    if reduce not in ("add", "multiply"):
        raise Unsupported(f"scatter with reduce={reduce!r} runs eagerly (eager accepts only 'add' and 'multiply')")
    if not isinstance(src, Ref):
        src = ctx.full(tuple(ctx.shape(index)), src, node.meta["val"].dtype)
    if reduce == "multiply":
        return _scatter_prod(ctx, node, x, dim, index, src)
    return _scatter_sum(ctx, node, x, dim, index, src)


@register(aten.scatter_add.default)
def _scatter_add(ctx, node, x, dim, index, src):
    return _scatter_sum(ctx, node, x, dim, index, src)


def _on_one_element(ctx: LowerCtx, *ts):
    """0-d operands as 1-element vectors: a 0-d scatter is the 1-d one of its element."""
    return tuple(ctx.reshape(t, (1,)) if isinstance(t, Ref) and not ctx.shape(t) else t for t in ts)


def _scatter_mean(ctx: LowerCtx, node, x, dim: int, index, src, include_self: bool = True,
                  shape: tuple | None = None) -> Ref:
    """scatter_reduce / index_reduce 'mean': the scatter-add of the values and of a count
    per destination (two atomic adds into zeroed buffers), then their quotient — with x
    counted once when include_self, else x where nothing arrived; integers divide with
    floor rounding, as eager does."""
    val = node.meta["val"]
    if val.dtype == torch.bool:
        raise Unsupported("scatter_reduce 'mean' of bools")
    if (same := _untouched(ctx, node, x, index)) is not None:
        return same
    shape = static_shape(val) if shape is None else shape
    if not shape:
        x, index, src = _on_one_element(ctx, x, index, src)
        return ctx.reshape(_scatter_mean(ctx, node, x, 0, index, src, include_self, (1,)), ())
    n = ir.prod(shape)
    lin, vals = _scatter_index(ctx, shape, dim % len(shape), index, src)
    sums = ctx.reshape(_scatter_add_rows(ctx, ctx.cast(vals, val.dtype), lin, n, 1), shape)
    ones = ctx.full((ctx.shape(lin)[0], 1), 1, torch.int64)
    counts = ctx.reshape(_scatter_add_rows(ctx, ones, lin, n, 1), shape)
    at = ctx.dtype(sums)
    if include_self:
        sums = ctx.pointwise("add", (ctx.cast(x, at), sums), shape, at)
        counts = ctx.pointwise("add", (counts, 1), shape, torch.int64)
    else:
        hit = ctx.pointwise("gt", (counts, 0), shape, torch.bool)
        counts = ctx.pointwise("maximum", (counts, 1), shape, torch.int64)
    if at.is_floating_point:
        mean = ctx.pointwise("truediv", (sums, ctx.cast(counts, at)), shape, at)
    else:
        from .rules_intdiv import floor_divide_ints
        mean = floor_divide_ints(ctx, sums, counts, shape, at)
    if not include_self:
        mean = ctx.pointwise("where", (hit, mean, ctx.cast(x, at)), shape, at)
    return ctx.cast(mean, val.dtype)


_KEYED = (torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.int16, torch.int8, torch.uint8)
_KEYED64 = (torch.float64, torch.int64)
_INT64_MIN = -(2**63)


def _scatter_extreme64(ctx: LowerCtx, node, x, dim: int, index, src, include_self: bool, op: str,
                       shape: tuple) -> Ref:
    """amax / amin of 64-bit values: keys that order as the values do in all 64 bits
    (`triton_ops._order_key64`), an int64 atomic max into a buffer of the least int64,
    and where nothing arrived told by a count of arrivals (the least key is a value too)."""
    val = node.meta["val"]
    n = ir.prod(shape)
    lin, vals = _scatter_index(ctx, shape, dim % len(shape), index, src)
    m = ctx.shape(lin)[0]
    keys = ctx.pointwise(f"order_key64_{op[1:]}", (ctx.cast(vals, val.dtype),), (m, 1), torch.int64)
    best = ctx.reshape(Ref(ctx.g.add(ir.SCATTER_ADD, "scatter_extreme", (keys, lin), (n, 1), torch.int64,
                                     contiguous_strides((n, 1)),
                                     (("padding_idx", None), ("combine", "max"), ("init", _INT64_MIN)))),
                       shape)
    got = ctx.pointwise(f"from_order_key64_{op[1:]}", (best,), shape, val.dtype)
    ones = ctx.full((m, 1), 1, torch.int64)
    hit = ctx.pointwise("gt", (ctx.reshape(_scatter_add_rows(ctx, ones, lin, n, 1), shape), 0), shape, torch.bool)
    if include_self:
        got = ctx.pointwise("maximum" if op == "amax" else "minimum", (ctx.cast(x, val.dtype), got), shape,
                            val.dtype)
    return ctx.pointwise("where", (hit, got, ctx.cast(x, val.dtype)), shape, val.dtype)


def _scatter_extreme(ctx: LowerCtx, node, x, dim: int, index, src, include_self: bool, op: str,
                     shape: tuple | None = None) -> Ref:
    """scatter_reduce 'amax' / 'amin': each value becomes an int64 key that orders as the
    value does (`triton_ops._order_key`: NaN on top, so it propagates as in eager; a min
    as the max of reversed keys), an int64 atomic max per destination over a zeroed
    buffer (0: nothing arrived; integer atomics: deterministic), then the key decoded
    and combined with x.  Bools (amax a logical or, amin an and) as uint8 0/1."""
    val = node.meta["val"]
    dt = torch.uint8 if val.dtype == torch.bool else val.dtype
    if dt not in _KEYED + _KEYED64:
        raise Unsupported(f"scatter_reduce {op!r} of {val.dtype}")
    if (same := _untouched(ctx, node, x, index)) is not None:
        return same
    shape = static_shape(val) if shape is None else shape
    if not shape:
        x, index, src = _on_one_element(ctx, x, index, src)
        return ctx.reshape(_scatter_extreme(ctx, node, x, 0, index, src, include_self, op, (1,)), ())
    if dt in _KEYED64:
        return _scatter_extreme64(ctx, node, x, dim, index, src, include_self, op, shape)
    n = ir.prod(shape)
    lin, vals = _scatter_index(ctx, shape, dim % len(shape), index, src)
    m = ctx.shape(lin)[0]
    keys = ctx.pointwise(f"order_key_{op[1:]}", (ctx.cast(vals, dt),), (m, 1), torch.int64)
    best = ctx.reshape(Ref(ctx.g.add(ir.SCATTER_ADD, "scatter_extreme", (keys, lin), (n, 1), torch.int64,
                                     contiguous_strides((n, 1)), (("padding_idx", None), ("combine", "max")))),
                       shape)
    kt = torch.float32 if dt.is_floating_point else torch.int32
    got = ctx.cast(ctx.pointwise(f"from_order_key_{op[1:]}", (best,), shape, kt), dt)
    hit = ctx.pointwise("gt", (best, 0), shape, torch.bool)
    if include_self:
        got = ctx.pointwise("maximum" if op == "amax" else "minimum", (ctx.cast(x, dt), got), shape, dt)
    out = ctx.pointwise("where", (hit, got, ctx.cast(x, dt)), shape, dt)
    return ctx.pointwise("ne", (out, 0), shape, torch.bool) if val.dtype == torch.bool else out


def _scatter_prod(ctx: LowerCtx, node, x, dim: int, index, src, include_self: bool = True,
                  shape: tuple | None = None) -> Ref:
    """scatter_reduce / index_reduce 'prod': each value multiplied into its destination
    of a buffer of ones by a compare-and-swap loop (`triton_ops._atomic_mul`), then x
    multiplied in (include_self) or kept where nothing arrived (a count of arrivals,
    an integer scatter-add).  Float products depend on the order: refused under
    deterministic algorithms; integer ones (int64, wrapping as eager's) do not."""
    from .rules_index import _refuse_nondeterministic
    val = node.meta["val"]
    if val.dtype == torch.bool:   # a product of bools is their logical and: the least of them
        return _scatter_extreme(ctx, node, x, dim, index, src, include_self, "amin", shape)
    if (same := _untouched(ctx, node, x, index)) is not None:
        return same
    shape = static_shape(val) if shape is None else shape
    if not shape:
        x, index, src = _on_one_element(ctx, x, index, src)
        return ctx.reshape(_scatter_prod(ctx, node, x, 0, index, src, include_self, (1,)), ())
    if val.dtype.is_floating_point:
        _refuse_nondeterministic("scatter_reduce 'prod'")
        acc = torch.float64 if val.dtype == torch.float64 else torch.float32
    else:
        acc = torch.int64
    n = ir.prod(shape)
    lin, vals = _scatter_index(ctx, shape, dim % len(shape), index, src)
    prod_ = ctx.reshape(Ref(ctx.g.add(ir.SCATTER_ADD, "scatter_prod", (ctx.cast(vals, acc), lin), (n, 1), acc,
                                      contiguous_strides((n, 1)),
                                      (("padding_idx", None), ("combine", "mul"), ("init", 1)))),
                        shape)
    if include_self:
        return ctx.cast(ctx.pointwise("mul", (ctx.cast(x, acc), prod_), shape, acc), val.dtype)
    ones = ctx.full((ctx.shape(lin)[0], 1), 1, torch.int64)
    hit = ctx.pointwise("gt", (ctx.reshape(_scatter_add_rows(ctx, ones, lin, n, 1), shape), 0), shape, torch.bool)
    return ctx.pointwise("where", (hit, ctx.cast(prod_, val.dtype), ctx.cast(x, val.dtype)), shape, val.dtype)


@register(aten.scatter_reduce.two)
def _scatter_reduce(ctx, node, x, dim, index, src, reduce, *, include_self=True):
    if reduce == "mean":
        return _scatter_mean(ctx, node, x, dim, index, src, include_self)
    if reduce in ("amax", "amin"):
        return _scatter_extreme(ctx, node, x, dim, index, src, include_self, reduce)
    if reduce == "prod":
        return _scatter_prod(ctx, node, x, dim, index, src, include_self)
    return _scatter_sum(ctx, node, x, dim, index, src, include_self)


@register(aten.index_reduce.default)
def _index_reduce(ctx, node, x, dim, index, source, reduce, *, include_self=True):
    """index_reduce: source's slice i along `dim` reduced into x's slice index[i] — the
    scatter form with index[i] broadcast over the slice."""
    if len(ctx.shape(index)) > 1:
        raise Unsupported("index_reduce with an index of more than one dim (eager rejects it)")
    x, index, source = _on_one_element(ctx, x, index, source)  # 0-d: the 1-element case
    sshape = ctx.shape(source)
    dim %= len(sshape)
    along = tuple(s if d == dim else 1 for d, s in enumerate(sshape))
    full = ctx.broadcast_to(ctx.reshape(index, along), sshape)
    shape = tuple(ctx.shape(x))
    if reduce == "mean":
        out = _scatter_mean(ctx, node, x, dim, full, source, include_self, shape)
    elif reduce == "prod":
        out = _scatter_prod(ctx, node, x, dim, full, source, include_self, shape)
    else:
        out = _scatter_extreme(ctx, node, x, dim, full, source, include_self, reduce, shape)
    return ctx.reshape(out, static_shape(node.meta["val"]))


@register(aten._unsafe_masked_index.default)
def _masked_index(ctx, node, x, mask, indices, fill):
    """where(mask, x[indices], fill): masked-off indices may be out of range, so every
    index is clamped into its dim first (the gather then reads a real element)."""
    xshape = ctx.shape(x)
    val = node.meta["val"]
    shape = static_shape(val)
    clamped = []
    for d, t in enumerate(indices):
        if t is None:
            clamped.append(None)
            continue
        ts = ctx.shape(t)
        t = ctx.cast(t, torch.int64)
        t = ctx.pointwise("where", (ctx.pointwise("lt", (t, 0), ts, torch.bool), 0, t), ts, torch.int64)
        hi = xshape[d] - 1
        t = ctx.pointwise("where", (ctx.pointwise("gt", (t, hi), ts, torch.bool), hi, t), ts, torch.int64)
        clamped.append(t)
    got = _index(ctx, node, x, clamped)
    m = ctx.broadcast_to(mask, shape)
    return ctx.pointwise("where", (m, got, fill), shape, val.dtype)


@register(aten.copy.default)
def _copy(ctx, node, x, src, non_blocking=False):
    """The functional copy: src broadcast and cast to x's shape and dtype (x's values
    are all overwritten)."""
    val = node.meta["val"]
    shape = static_shape(val)
    out = ctx.broadcast_to(ctx.cast(src, val.dtype) if isinstance(src, Ref) else src, shape)
    if not isinstance(out, Ref):
        return ctx.full(shape, out, val.dtype)
    return ctx.pointwise("identity", (out,), shape, val.dtype)


@register(aten.as_strided_scatter.default)
def _as_strided_scatter(ctx, node, x, src, size, stride, storage_offset=None):
    """x with src written at as_strided(x, size, stride, offset).  A view that is a
    contiguous run of a contiguous x: the run replaced by src's elements (a cat along
    x's flattened elements).  Any other view of a densely laid out x: a scatter-write
    of src's elements at their storage positions, x taken in storage order
    (`rules_views.element_view`; of positions the view repeats, the last wins)."""
    from .rules_views import _concat, element_view, in_storage_order
    val = node.meta["val"]
    shape = static_shape(val)
    xval = node.args[0].meta["val"]
    order, stride, off = element_view(ctx, node, x, size, stride, storage_offset)
    n, total = ir.prod(size), ir.prod(shape)
    dtype = val.dtype
    if order == list(range(len(shape))) and tuple(stride) == contiguous_strides(tuple(size)):
        flat_src = ctx.reshape(ctx.cast(src, dtype), (n,))
        if n == total:
            return ctx.pointwise("identity", (ctx.reshape(flat_src, shape),), shape, dtype)
        flat_x = ctx.reshape(ctx.cast(x, dtype), (total,))
        parts = []
        if off:
            parts.append(ctx.view("slice", flat_x, (off,), (("dim", 0), ("start", 0), ("step", 1))))
        parts.append(flat_src)
        if off + n < total:
            parts.append(ctx.view("slice", flat_x, (total - off - n,), (("dim", 0), ("start", off + n), ("step", 1))))
        return ctx.reshape(_concat(ctx, parts, (total,), 0, dtype), shape)
    if n == 0:
        return ctx.pointwise("identity", (ctx.cast(x, dtype),), shape, dtype)
    size = tuple(size)
    lin = None
    for d, st in enumerate(stride):
        if size[d] == 1:
            continue
        term = ctx.pointwise("mul", (_iota(ctx, size, d), st), size, torch.int64)
        lin = term if lin is None else ctx.pointwise("add", (lin, term), size, torch.int64)
    lin = ctx.full(size, off, torch.int64) if lin is None else ctx.pointwise("add", (lin, off), size, torch.int64)
    stored = in_storage_order(ctx, ctx.cast(x, dtype), xval, order)
    sshape = ctx.shape(stored)
    out = scatter_written(ctx, node, scatter_winner(ctx, ctx.reshape(lin, (n,)), total),
                          ctx.reshape(ctx.cast(src, dtype), (n, 1)), ctx.reshape(stored, (total, 1)), dtype)
    out = ctx.reshape(out, sshape)
    if order != list(range(len(shape))):
        inverse = tuple(order.index(d) for d in range(len(shape)))
        out = ctx.view("permute", out, shape, (("dims", inverse),))
    return out
