"""Layout ops lowered as index maps (no copies): reshapes, permutes, expands, slices,
selects, windows (unfold), concatenation, as_strided (a re-index, or a read of a graph
input's storage), and the ops built from them:
constant padding, roll, repeat, and diagonals (diagonal, diag_embed, diagonal_scatter)."""
from __future__ import annotations

import re
from typing import Sequence

import torch

from ..ir import nodes as ir
from ..ir.nodes import Ref, contiguous_strides, non_overlapping, prod
from .context import LowerCtx, static_shape
from .registry import Unsupported, register

aten = torch.ops.aten
prims = torch.ops.prims


def _shape(node):
    return static_shape(node.meta["val"])


@register(aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.squeeze.dim,
          aten.squeeze.dims, aten.squeeze.default, aten.unsqueeze.default, aten.flatten.using_ints,
          aten.unflatten.int, prims.reshape.default)
def _reshape(ctx: LowerCtx, node, x, *args, **kwargs):
    return ctx.reshape(x, _shape(node))


@register(aten.permute.default, prims.transpose.default)
def _permute(ctx, node, x, dims):
    nd = len(ctx.shape(x))
    dims = tuple(d % nd for d in dims) if nd else ()
    return ctx.view("permute", x, _shape(node), (("dims", dims),))


@register(aten.transpose.int)
def _transpose(ctx, node, x, d0, d1):
    nd = len(ctx.shape(x))
    dims = list(range(nd))
    if nd:
        dims[d0 % nd], dims[d1 % nd] = dims[d1 % nd], dims[d0 % nd]
    return ctx.view("permute", x, _shape(node), (("dims", tuple(dims)),))


@register(aten.t.default)
def _t(ctx, node, x):
    dims = (1, 0) if len(ctx.shape(x)) == 2 else tuple(range(len(ctx.shape(x))))
    return ctx.view("permute", x, _shape(node), (("dims", dims),))


@register(aten.expand.default, prims.broadcast_in_dim.default)
def _expand(ctx, node, x, *args, **kwargs):
    shape = _shape(node)
    if node.target is prims.broadcast_in_dim.default:
        # broadcast_in_dim(x, shape, dims): place x's dims at `dims`, others are new size-1 dims
        dims = args[1]
        mid = [1] * len(shape)
        for i, d in enumerate(dims):
            mid[d] = ctx.shape(x)[i]
        x = ctx.reshape(x, tuple(mid))
    return ctx.broadcast_to(x, shape)


@register(aten.slice.Tensor)
def _slice(ctx, node, x, dim=0, start=None, end=None, step=1):
    shape = _shape(node)
    in_shape = ctx.shape(x)
    dim %= len(in_shape)
    size = in_shape[dim]
    start = 0 if start is None else start
    start = start + size if start < 0 else start
    start = min(max(start, 0), size)
    # a slice of the whole dim is still a view node (not `x` itself): eager returns a
    # view, and the graph keeps one structure over the sizes of a dynamic bucket
    # (position_ids[:, :s] is the whole buffer only at s == its length)
    return ctx.view("slice", x, shape, (("dim", dim), ("start", start), ("step", step)))


@register(aten.unfold.default)
def _unfold(ctx, node, x, dim, size, step):
    """Windows of `size` every `step` along `dim`, as an index map of the operand's
    elements (not torch's decomposition into `as_strided` with the operand's strides,
    which addresses storage: an expanded or offset graph input ran eagerly)."""
    if not ctx.shape(x):   # a 0-d operand: its one element, as a tensor of shape (1,) (or (0,))
        return ctx.reshape(x, _shape(node)) if prod(_shape(node)) else ctx.full(_shape(node), 0, ctx.dtype(x))
    dim %= len(ctx.shape(x))
    return ctx.view("unfold", x, _shape(node), (("dim", dim), ("step", step)))


@register(aten.select.int)
def _select(ctx, node, x, dim, index):
    in_shape = ctx.shape(x)
    dim %= len(in_shape)
    index = index + in_shape[dim] if index < 0 else index
    return ctx.view("select", x, _shape(node), (("dim", dim), ("index", index)))


@register(aten.cat.default)
def _cat(ctx, node, tensors, dim=0):
    shape, dtype = _shape(node), node.meta["val"].dtype
    dim %= len(shape)
    # empty operands (legacy 1-D empties included) add nothing: leave them out
    parts = [ctx.cast(t, dtype) for t in tensors if prod(ctx.shape(t)) > 0]
    if not parts or prod(shape) == 0:
        return ctx.full(shape, 0, dtype)
    return _concat(ctx, parts, shape, dim, dtype)


@register(aten.stack.default)
def _stack(ctx, node, tensors, dim=0):
    """A cat of the operands, each with a new size-1 dim at `dim`."""
    shape, dtype = _shape(node), node.meta["val"].dtype
    dim %= len(shape)
    if prod(shape) == 0:
        return ctx.full(shape, 0, dtype)
    parts = []
    for t in tensors:
        ts = ctx.shape(t)
        parts.append(ctx.reshape(ctx.cast(t, dtype), ts[:dim] + (1,) + ts[dim:]))
    return _concat(ctx, parts, shape, dim, dtype)


def element_view(ctx: LowerCtx, node: torch.fx.Node, x: Ref, size: Sequence[int], stride: Sequence[int],
                 storage_offset: int | None) -> tuple[list[int], tuple[int, ...], int]:
    """as_strided(x, size, stride, storage_offset) as a view of x's elements: (order,
    strides, offset) such that it is the as_strided view of x permuted to `order` (its
    dims by decreasing stride, eager's layout from the metadata, size-1 dims last) and
    laid out contiguously.  A dense layout: the same numbers.  A layout with gaps (a
    strided slice; op_db's non-contiguous samples through unfold's decomposition): each
    stride and the offset split into whole steps of the operand's dims, largest stride
    first; when every split is exact and every addressed position stays inside the
    operand's dims, each one is an element and the view an affine re-index of them.
    Positions between the elements, overlapping layouts, and views reaching past the
    operand are refused."""
    val = node.args[0].meta["val"]
    if ctx.node(x).kind == ir.INPUT and val.storage_offset() != 0:
        # (Dynamo does not guard the offset: which of the input's elements an absolute
        # offset addresses is known at run time only; a read takes `storage_read` instead)
        raise Unsupported("as_strided(_scatter) of a graph input at a storage offset, which Dynamo does not guard")
    off = (0 if storage_offset is None else storage_offset) - val.storage_offset()
    shape, strides = tuple(val.shape), tuple(val.stride())
    size, stride = tuple(size), tuple(stride)
    inner = sorted((d for d in range(len(shape)) if shape[d] != 1), key=lambda d: -strides[d])
    order = inner + [d for d in range(len(shape)) if shape[d] == 1]
    dense = contiguous_strides(tuple(shape[d] for d in order))
    if any(strides[d] != dense[i] for i, d in enumerate(inner)):
        if not non_overlapping(shape, strides):
            raise Unsupported("as_strided of an operand whose storage overlaps (not a dense layout)")

        def steps(p: int) -> list[int] | None:
            out = []
            for d in inner:
                q, p = divmod(p, strides[d])
                out.append(q)
            return out if p == 0 else None
        base = steps(off) if off >= 0 else None
        split = [steps(st) if n > 1 else [0] * len(inner) for n, st in zip(size, stride)]
        if base is None or any(c is None for c in split) or any(
                base[i] + sum((n - 1) * c[i] for n, c in zip(size, split) if n > 0) >= shape[d]
                for i, d in enumerate(inner)):
            raise Unsupported("as_strided of an operand with gaps addresses storage between its elements")
        stride = tuple(sum(c[i] * dense[i] for i in range(len(inner))) for c in split)
        off = sum(base[i] * dense[i] for i in range(len(inner)))
    if off < 0 or off + sum((n - 1) * st for n, st in zip(size, stride) if n > 0) >= max(val.numel(), 1):
        raise Unsupported("as_strided reaches past the elements of its operand")
    return order, stride, off


def in_storage_order(ctx: LowerCtx, x: Ref, val: torch.Tensor, order: list[int]) -> Ref:
    if order == list(range(len(order))):
        return x
    return ctx.view("permute", x, tuple(val.shape[d] for d in order), (("dims", tuple(order)),))


@register(aten.as_strided.default)
def _as_strided(ctx, node, x, size, stride, storage_offset=None):
    """as_strided addresses its operand's storage, laid out as eager lays it out (the
    operand's metadata, not our buffer): as a view of the operand's elements in storage
    order (`element_view`) — a plain re-index, whatever our own buffer's layout.  Of a
    graph input, a view that is no re-index of its elements (one reading storage between
    them, before or past them, or at an absolute offset Dynamo does not guard) reads the
    input's storage itself (`storage_read`)."""
    val = node.args[0].meta["val"]
    try:
        order, stride, off = element_view(ctx, node, x, size, stride, storage_offset)
    except Unsupported:
        read = storage_read(ctx, node, x, size, stride, storage_offset)
        if read is None:
            raise
        return read
    x = in_storage_order(ctx, x, val, order)
    return ctx.view("as_strided", x, _shape(node), (("stride", tuple(stride)), ("offset", off)))


_TANGENT = re.compile(r"tangents_\d+$")


def storage_read(ctx: LowerCtx, node: torch.fx.Node, x: Ref, size: Sequence[int], stride: Sequence[int],
                 storage_offset: int | None) -> Ref | None:
    """as_strided of a graph input as a dense view of the storage range it addresses: a
    node of its own (an INPUT with `storage_of`, the input's position) that the wrapper
    binds to that range of the input's storage, `as_strided((extent,), (1,), offset)`
    as eager's own call would address it (an absolute offset; the input's own where
    `storage_offset` is None), so it holds at any storage offset the input comes with,
    and eager's bounds check guards it.  None where `x` is not a graph input itself (a
    value of ours has no storage of eager's layout) or the sizes are symbolic.  Such an
    input is not written in place (`plan/in_place.py`) nor copied into a CUDA graph
    (`runtime/cuda_graphs.py`): either would move storage the kernel reads by position."""
    n = ctx.node(x)
    if n.kind != ir.INPUT or n.attr("constant") or n.attr("index") is None or n.attr("storage_of") is not None:
        return None
    if node.args[0].op != "placeholder" or any(
            p.op == "placeholder" and _TANGENT.match(p.name) for p in node.graph.nodes):
        # a backward's saved tensor or tangent may be a value of ours, whose storage
        # between its elements need not be eager's: forward and inference graphs only
        # (AOTAutograd names a backward's incoming gradients `tangents_i`)
        return None
    if not all(type(v) is int for v in (*size, *stride)) or not (storage_offset is None or type(storage_offset) is int):
        return None
    shape = _shape(node)
    if prod(shape) == 0 or any(st < 0 for st in stride):
        return None
    extent = 1 + sum((s - 1) * st for s, st in zip(size, stride))
    sid = ctx.g.add(ir.INPUT, f"storage({n.op})", (), (extent,), n.dtype, (1,),
                    (("storage_of", n.attr("index")), ("storage_offset", storage_offset)))
    return ctx.view("as_strided", Ref(sid), shape, (("stride", tuple(stride)), ("offset", 0)))


@register(aten.split.Tensor, aten.split_with_sizes.default, aten.unbind.int, aten.chunk.default)
def _split(ctx, node, x, sizes=None, dim=0):
    vals = node.meta["val"]
    in_shape = ctx.shape(x)
    if node.target is aten.unbind.int:
        dim = sizes if sizes is not None else 0
    dim %= len(in_shape)
    outs, start = [], 0
    for v in vals:
        shape = static_shape(v)
        if node.target is aten.unbind.int:
            outs.append(ctx.view("select", x, shape, (("dim", dim), ("index", start))))
            start += 1
            continue
        if shape == in_shape:
            outs.append(x)
        else:
            outs.append(ctx.view("slice", x, shape, (("dim", dim), ("start", start), ("step", 1))))
        start += shape[dim]
    return tuple(outs)


def _pad_along(ctx, grad, shape, dim, start, dtype, value=0):
    """`grad` placed at [start, start+len) of a tensor of `shape` filled with `value`,
    along `dim`."""
    size = ctx.shape(grad)[dim]
    if prod(ctx.shape(grad)) == 0:
        return ctx.full(shape, value, dtype)
    parts = []
    if start > 0:
        parts.append(ctx.full(tuple(start if i == dim else s for i, s in enumerate(shape)), value, dtype))
    parts.append(ctx.cast(grad, dtype))
    rest = shape[dim] - start - size
    if rest > 0:
        parts.append(ctx.full(tuple(rest if i == dim else s for i, s in enumerate(shape)), value, dtype))
    return _concat(ctx, parts, shape, dim, dtype)


def _concat(ctx, parts, shape, dim, dtype):
    """One CAT node of `parts` along `dim` (a single part is a copy)."""
    if len(parts) == 1:
        return ctx.pointwise("identity", (parts[0],), shape, dtype)
    sizes = tuple(ctx.shape(p)[dim] for p in parts)
    return Ref(ctx.g.add(ir.CAT, "cat", tuple(parts), shape, dtype, contiguous_strides(shape),
                         (("dim", dim), ("sizes", sizes))))


def _narrow(ctx, x, dim, start, length):
    shape = ctx.shape(x)
    if start == 0 and length == shape[dim]:
        return x
    out = tuple(length if i == dim else s for i, s in enumerate(shape))
    return ctx.view("slice", x, out, (("dim", dim), ("start", start), ("step", 1)))


@register(aten.constant_pad_nd.default)
def _constant_pad(ctx, node, x, pad, value=0):
    if isinstance(value, Ref):
        raise Unsupported("pad value is a tensor")
    return constant_pad(ctx, x, pad, value, node.meta["val"].dtype)


def constant_pad(ctx: LowerCtx, x: Ref, pad: Sequence[int], value: bool | int | float, dtype: torch.dtype) -> Ref:
    """Pairs (before, after) from the last dim backwards; negative amounts crop (also the
    complex rule's, on a (re, im) pair)."""
    for i in range(len(pad) // 2):
        dim = len(ctx.shape(x)) - 1 - i
        before, after = pad[2 * i], pad[2 * i + 1]
        size = ctx.shape(x)[dim]
        lo, hi = max(-before, 0), max(-after, 0)
        if lo + hi >= size:  # everything cropped away: only padding is left
            shape = tuple(size + before + after if d == dim else s for d, s in enumerate(ctx.shape(x)))
            x = ctx.full(shape, value, dtype)
            continue
        x = _narrow(ctx, x, dim, lo, size - lo - hi)
        shape = tuple(s + max(before, 0) + max(after, 0) if d == dim else s for d, s in enumerate(ctx.shape(x)))
        if shape != ctx.shape(x):
            x = _pad_along(ctx, x, shape, dim, max(before, 0), dtype, value)
    return x


@register(aten.roll.default)
def _roll(ctx, node, x, shifts, dims=()):
    """Each shifted dim is a cat of its two slices."""
    dtype = node.meta["val"].dtype
    shape = ctx.shape(x)
    if not dims:  # roll of the flattened tensor
        flat = ctx.reshape(x, (prod(shape),))
        return ctx.reshape(_roll_dim(ctx, flat, shifts[0], 0, dtype), shape)
    for shift, dim in zip(shifts, dims):
        x = _roll_dim(ctx, x, shift, dim % len(shape), dtype)
    return x


def _roll_dim(ctx, x, shift, dim, dtype):
    n = ctx.shape(x)[dim]
    s = shift % n if n else 0
    if s == 0:
        return x
    return _concat(ctx, [_narrow(ctx, x, dim, n - s, s), _narrow(ctx, x, dim, 0, n - s)], ctx.shape(x), dim,
                   dtype)


@register(aten.repeat.default)
def _repeat(ctx, node, x, repeats):
    """Tile: each dim gets a new broadcast dim before it, then the pairs are merged."""
    shape = (1,) * (len(repeats) - len(ctx.shape(x))) + ctx.shape(x)
    paired = tuple(v for s in shape for v in (1, s))
    tiled = tuple(v for r, s in zip(repeats, shape) for v in (r, s))
    out = _shape(node)
    if prod(out) == 0:
        return ctx.full(out, 0, node.meta["val"].dtype)
    return ctx.reshape(ctx.broadcast_to(ctx.reshape(x, paired), tiled), out)


@register(aten.slice_backward.default)
def _slice_backward(ctx, node, grad, input_sizes, dim, start, end, step):
    if step != 1:
        raise Unsupported("strided slice_backward")
    return slice_backward_pad(ctx, grad, static_shape(node.meta["val"]), dim, start, node.meta["val"].dtype)


def slice_backward_pad(ctx: LowerCtx, grad: Ref, shape: Sequence[int], dim: int, start: int, dtype: torch.dtype,
                       trailing: Sequence[int] = ()) -> Ref:
    """The gradient zero-padded to `shape` along `dim` from `start` (normalised as eager
    does); `trailing` dims ride along untouched (the complex rule's (re, im) pair)."""
    dim %= len(shape)
    start = start + shape[dim] if start < 0 else start
    start = min(max(start, 0), shape[dim])
    return _pad_along(ctx, grad, tuple(shape) + tuple(trailing), dim, start, dtype)


@register(aten.select_backward.default)
def _select_backward(ctx, node, grad, input_sizes, dim, index):
    return select_backward_pad(ctx, grad, static_shape(node.meta["val"]), dim, index, node.meta["val"].dtype)


def select_backward_pad(ctx: LowerCtx, grad: Ref, shape: Sequence[int], dim: int, index: int, dtype: torch.dtype,
                        trailing: Sequence[int] = ()) -> Ref:
    """The gradient as a size-1 slice at `index` of `dim`, zero-padded to `shape`;
    `trailing` dims ride along untouched (the complex rule's (re, im) pair)."""
    shape = tuple(shape)
    dim %= len(shape)
    index = index + shape[dim] if index < 0 else index
    g = ctx.reshape(grad, tuple(1 if i == dim else s for i, s in enumerate(shape)) + tuple(trailing))
    return _pad_along(ctx, g, shape + tuple(trailing), dim, index, dtype)


# -- diagonals (issue 19): strided views and their scatter, as index maps ------------------

def _iota(ctx, shape, dim):
    return Ref(ctx.g.add(ir.POINTWISE, "iota", (), shape, torch.int64, contiguous_strides(shape), (("dim", dim),)))


def _diag_embed_canonical(ctx, src, base, n, m, offset, dtype):
    """A (*o, n, m) value: `src` (*o, L) on the diagonal `offset`, `base` elsewhere
    (a Ref of that shape, or a number).  Element (i, j) of the diagonal is src[i] for
    offset >= 0 and src[j] below the main diagonal."""
    o = ctx.shape(src)[:-1]
    shape = o + (n, m)
    k = len(o)
    along = n if offset >= 0 else m  # src is indexed by i (rows) or by j (columns)
    src = _pad_along(ctx, ctx.cast(src, dtype), o + (along,), k, 0, dtype)
    src = ctx.reshape(src, o + ((n, 1) if offset >= 0 else (1, m)))
    src = ctx.broadcast_to(src, shape)
    diff = ctx.pointwise("sub", (_iota(ctx, shape, k + 1), _iota(ctx, shape, k)), shape, torch.int64)
    on = ctx.pointwise("eq", (diff, offset), shape, torch.bool)
    return ctx.pointwise("where", (on, src, base), shape, dtype)


def _diag_perm(nd, d1, d2):
    others = [i for i in range(nd) if i not in (d1, d2)]
    return tuple(others) + (d1, d2)


@register(aten.diagonal.default)
def _diagonal(ctx, node, x, offset=0, dim1=0, dim2=1):
    nd = len(ctx.shape(x))
    out = _shape(node)
    if prod(out) == 0:
        return ctx.full(out, 0, node.meta["val"].dtype)
    return diagonal_view(ctx, x, offset, dim1 % nd, dim2 % nd, out)


def diagonal_view(ctx: LowerCtx, x: Ref, offset: int, d1: int, d2: int, out: Sequence[int]) -> Ref:
    """A strided view: the matrix dims moved last and flattened, then a slice with step
    m + 1 from the diagonal's first element (the other dims first, in order)."""
    shape = ctx.shape(x)
    nd = len(shape)
    perm = _diag_perm(nd, d1, d2)
    y = x if perm == tuple(range(nd)) else ctx.view("permute", x, tuple(shape[i] for i in perm), (("dims", perm),))
    n, m = shape[d1], shape[d2]
    o = tuple(shape[i] for i in perm[:-2])
    flat = ctx.reshape(y, o + (n * m,))
    start = offset if offset >= 0 else -offset * m
    return ctx.view("slice", flat, out, (("dim", len(o)), ("start", start), ("step", m + 1)))


@register(aten.diagonal_scatter.default)
def _diagonal_scatter(ctx, node, x, src, offset=0, dim1=0, dim2=1):
    shape, dtype = ctx.shape(x), node.meta["val"].dtype
    nd = len(shape)
    d1, d2 = dim1 % nd, dim2 % nd
    perm = _diag_perm(nd, d1, d2)
    cshape = tuple(shape[i] for i in perm)
    xc = ctx.cast(x, dtype) if perm == tuple(range(nd)) else ctx.view("permute", ctx.cast(x, dtype), cshape,
                                                                      (("dims", perm),))
    out = _diag_embed_canonical(ctx, src, xc, shape[d1], shape[d2], offset, dtype)
    inv = tuple(perm.index(i) for i in range(nd))
    return out if perm == tuple(range(nd)) else ctx.view("permute", out, shape, (("dims", inv),))


@register(aten.diagonal_backward.default)
def _diagonal_backward(ctx, node, grad, input_sizes, offset, dim1, dim2):
    shape, dtype = _shape(node), node.meta["val"].dtype
    nd = len(shape)
    d1, d2 = dim1 % nd, dim2 % nd
    perm = _diag_perm(nd, d1, d2)
    out = _diag_embed_canonical(ctx, grad, 0.0 if dtype.is_floating_point else 0, shape[d1], shape[d2], offset, dtype)
    inv = tuple(perm.index(i) for i in range(nd))
    return out if perm == tuple(range(nd)) else ctx.view("permute", out, shape, (("dims", inv),))


@register(aten.diag_embed.default)
def _diag_embed(ctx, node, x, offset=0, dim1=-2, dim2=-1):
    shape, dtype = _shape(node), node.meta["val"].dtype
    nd = len(shape)
    d1, d2 = dim1 % nd, dim2 % nd
    size = shape[d1]
    canon = _diag_embed_canonical(ctx, x, 0, size, size, offset, dtype)
    # canonical dims (*batch, i, j) -> output positions: i at d1, j at d2, batch in order
    perm, b = [], 0
    for k in range(nd):
        if k == d1:
            perm.append(nd - 2)
        elif k == d2:
            perm.append(nd - 1)
        else:
            perm.append(b)
            b += 1
    perm = tuple(perm)
    return canon if perm == tuple(range(nd)) else ctx.view("permute", canon, shape, (("dims", perm),))


# (the complex rules reuse these on (re, im) pairs)
diag_embed_canonical = _diag_embed_canonical
diag_perm = _diag_perm
