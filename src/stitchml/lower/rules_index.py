"""Indexed reads and writes: embedding, index_select, gather (index maps whose index
is a loaded value), one-hot scatter, and embedding's dense backward (scatter-add)."""
from __future__ import annotations

import torch

from ..ir import nodes as ir
from ..ir.nodes import Ref, contiguous_strides
from .context import LowerCtx, static_shape
from .registry import Unsupported, register

aten = torch.ops.aten


def _gather_node(ctx: LowerCtx, node, src: Ref, index: Ref, dim: int, mode: str, shape=None) -> Ref:
    val = node.meta["val"]
    shape = static_shape(val) if shape is None else shape
    if ctx.dtype(index) not in (torch.int32, torch.int64):
        raise Unsupported("index tensor must be int32 or int64")
    return Ref(ctx.g.add(ir.GATHER, mode, (src, index), shape, val.dtype, contiguous_strides(shape),
                         (("dim", dim), ("bound", ctx.shape(src)[dim]))))


@register(aten.embedding.default)
def _embedding(ctx, node, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    if len(ctx.shape(weight)) != 2:
        raise Unsupported("embedding weight must be 2-D")
    return _gather_node(ctx, node, weight, indices, 0, "embedding")


@register(aten.index_select.default)
def _index_select(ctx, node, x, dim, index):
    nd = len(ctx.shape(x))
    if nd == 0 or len(ctx.shape(index)) != 1:
        raise Unsupported("index_select of a 0-d tensor or with a 0-d index")
    return _gather_node(ctx, node, x, index, dim % nd, "index_select")


@register(aten.index.Tensor)
def _index(ctx, node, x, indices):
    """x[..., idx] with one integer index tensor after leading full slices: an
    index_select of the flattened index, its dim then unflattened to idx's shape."""
    used = [i for i, t in enumerate(indices) if t is not None]
    if len(used) != 1:
        raise Unsupported("advanced indexing with several index tensors")
    dim, idx = used[0], indices[used[0]]
    if not isinstance(idx, Ref) or ctx.dtype(idx) not in (torch.int32, torch.int64):
        raise Unsupported("index must be an int32/int64 tensor (boolean masks give data-dependent shapes)")
    xshape, ishape = ctx.shape(x), ctx.shape(idx)
    flat = (ir.prod(ishape),)
    sel_shape = xshape[:dim] + flat + xshape[dim + 1:]
    if len(ishape) != 1:
        idx = ctx.reshape(idx, flat)
    sel = _gather_node(ctx, node, x, idx, dim, "index_select", sel_shape)
    return ctx.reshape(sel, static_shape(node.meta["val"]))


@register(aten.gather.default)
def _gather(ctx, node, x, dim, index, *, sparse_grad=False):
    nd = len(ctx.shape(x))
    if nd == 0 or len(ctx.shape(index)) != nd:
        raise Unsupported("gather needs index of the same rank as the input")
    return _gather_node(ctx, node, x, index, dim % nd, "take_along")


@register(aten.scatter.value)
def _scatter_value(ctx, node, x, dim, index, value):
    """One-hot writes (`index` has size 1 along `dim`): a select on the position."""
    shape = static_shape(node.meta["val"])
    ishape = ctx.shape(index)
    nd = len(shape)
    dim %= nd
    if len(ishape) != nd or ishape[dim] != 1 or any(ishape[i] != shape[i] for i in range(nd) if i != dim):
        raise Unsupported("scatter with more than one index per row")
    dtype = node.meta["val"].dtype
    iota = Ref(ctx.g.add(ir.POINTWISE, "iota", (), shape, torch.int64, contiguous_strides(shape),
                         (("dim", dim),)))
    hit = ctx.pointwise("eq", (iota, ctx.broadcast_to(ctx.cast(index, torch.int64), shape)), shape, torch.bool)
    return ctx.pointwise("where", (hit, value, ctx.cast(x, dtype)), shape, dtype)


@register(aten.embedding_dense_backward.default)
def _embedding_backward(ctx, node, grad, indices, num_weights, padding_idx, scale_grad_by_freq):
    if scale_grad_by_freq:
        raise Unsupported("scale_grad_by_freq runs eagerly")
    val = node.meta["val"]
    shape = static_shape(val)
    if val.dtype != torch.float32:
        raise Unsupported("scatter-add kernels accumulate in float32 only")
    return Ref(ctx.g.add(ir.SCATTER_ADD, "embedding_backward", (grad, indices), shape, val.dtype,
                         contiguous_strides(shape), (("padding_idx", padding_idx),)))
