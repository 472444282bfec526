"""Indexed reads and writes: embedding, index_select, gather (index maps whose index
is a loaded value), one-hot scatter, and embedding's dense backward (scatter-add)."""
from __future__ import annotations

import torch

from .. import config
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
    nd, out = len(ctx.shape(x)), static_shape(node.meta["val"])
    if nd == 0:  # a 0-d input: the only valid index is 0, so the value itself (issue 19)
        return ctx.pointwise("identity", (ctx.reshape(x, out),), out, ctx.dtype(x))
    if len(ctx.shape(index)) == 0:  # a 0-d index selects like a one-element one
        index = ctx.reshape(index, (1,))
    if len(ctx.shape(index)) != 1:
        raise Unsupported("index_select with an index of more than one dim")
    shape = tuple(ctx.shape(index)[0] if i == dim % nd else s for i, s in enumerate(ctx.shape(x)))
    return ctx.reshape(_gather_node(ctx, node, x, index, dim % nd, "index_select", shape), out)


def _broadcast_shape(shapes) -> tuple[int, ...]:
    nd = max((len(s) for s in shapes), default=0)
    out = [1] * nd
    for s in shapes:
        for i, d in enumerate(s, nd - len(s)):
            if d != 1:
                if out[i] not in (1, d):
                    raise Unsupported(f"index tensors of shapes {shapes} do not broadcast")
                out[i] = d
    return tuple(out)


# the linear index of an element some index puts out of its dim's range: past any tensor
OUT_OF_RANGE = 1 << 62


class _Indexed:
    """Advanced indexing `x[..., i0, ..., i1, ...]` (index tensors on some dims, full
    slices elsewhere) as one linear index into a dim of a view of x:

    x is permuted so that the indexed dims come first in order (where torch puts the
    broadcast index dims first: indexed dims separated by a slice) or stay in place
    (adjacent indexed dims), then reshaped to (pre, K, post) with K the product of the
    indexed sizes, and the index tensors, broadcast to one shape I, combine into
    L = sum_j i_j * stride_j over (pre, K, post)'s middle dim.  Negative indices are
    wrapped per dim; an index out of range in any dim becomes an out-of-range L, so the
    gather's bounds assertion still fires (L alone could land in range)."""

    def __init__(self, ctx: LowerCtx, x: Ref, indices) -> None:
        xshape = ctx.shape(x)
        indices = list(indices) + [None] * (len(xshape) - len(indices))
        used = [i for i, t in enumerate(indices) if t is not None]
        if not used:
            raise Unsupported("indexing without index tensors")
        for i in used:
            t = indices[i]
            if isinstance(t, Ref) and ctx.dtype(t) in (torch.bool, torch.uint8):
                # (a write of values that do not vary along the mask is a where: decomp.py)
                raise Unsupported("a boolean mask index selects a data-dependent number of elements "
                                  "(values given per selected element: eager checks their count)")
            if not isinstance(t, Ref) or ctx.dtype(t) not in (torch.int32, torch.int64):
                raise Unsupported("index must be an int32/int64 tensor")
        self.adjacent = used == list(range(used[0], used[-1] + 1))
        self.ishape = _broadcast_shape([ctx.shape(indices[i]) for i in used])
        order = used + [d for d in range(len(xshape)) if d not in used] if not self.adjacent else None
        if order is not None and order != list(range(len(xshape))):
            x = ctx.view("permute", x, tuple(xshape[d] for d in order), (("dims", tuple(order)),))
            xshape = ctx.shape(x)
            first = 0
        else:
            first = used[0]
        self.perm = order if order is not None and order != list(range(len(order))) else None
        self.pre, self.post = xshape[:first], xshape[first + len(used):]
        sizes = [xshape[first + k] for k in range(len(used))]
        self.K = ir.prod(sizes)
        self.view_shape = xshape  # x after the permute
        self.x3 = ctx.reshape(x, (ir.prod(self.pre), self.K, ir.prod(self.post)))
        i64, ish = torch.int64, self.ishape
        lin, bad, stride = None, None, self.K
        for t, size in zip([indices[i] for i in used], sizes):
            stride //= size
            t = ctx.broadcast_to(ctx.cast(t, i64), ish)
            neg = ctx.pointwise("lt", (t, 0), ish, torch.bool)
            t = ctx.pointwise("where", (neg, ctx.pointwise("add", (t, size), ish, i64), t), ish, i64)
            if len(used) > 1:
                out = ctx.pointwise("logical_or", (ctx.pointwise("lt", (t, 0), ish, torch.bool),
                                                   ctx.pointwise("ge", (t, size), ish, torch.bool)), ish, torch.bool)
                bad = out if bad is None else ctx.pointwise("logical_or", (bad, out), ish, torch.bool)
            term = t if stride == 1 else ctx.pointwise("mul", (t, stride), ish, i64)
            lin = term if lin is None else ctx.pointwise("add", (lin, term), ish, i64)
        if bad is not None:   # (a constant past any K: no size in the kernel, so one dynamic template)
            lin = ctx.pointwise("where", (bad, OUT_OF_RANGE, lin), ish, i64)
        self.lin = ctx.reshape(lin, (ir.prod(ish),)) if len(ish) != 1 else lin

    def result_shape(self) -> tuple[int, ...]:
        return tuple(self.pre) + tuple(self.ishape) + tuple(self.post)


@register(aten.index.Tensor, aten._unsafe_index.Tensor)
def _index(ctx, node, x, indices):
    """x[..., i0, :, i1] with integer index tensors (broadcast together, negative
    indices wrapped): an index_select of the linearised index on a (pre, K, post) view."""
    if not ctx.shape(x):
        raise Unsupported("indexing a 0-d tensor")
    a = _Indexed(ctx, x, indices)
    n = ir.prod(a.ishape)
    sel = _gather_node(ctx, node, a.x3, a.lin, 1, "index_select", (ir.prod(a.pre), n, ir.prod(a.post)))
    return ctx.reshape(sel, static_shape(node.meta["val"]))


def _refuse_nondeterministic(what: str) -> None:
    if torch.are_deterministic_algorithms_enabled():
        raise Unsupported(f"{what} adds with atomics (order-dependent rounding) and "
                          "torch.use_deterministic_algorithms(True) is set")


def _scatter_add_rows(ctx: LowerCtx, values: Ref, lin: Ref, rows: int, cols: int) -> Ref:
    """out[rows, cols] (float32, float64 for float64 values, int64 for integer ones;
    zero-initialised) with values[m, :] added into row lin[m] by atomics: the
    scatter-add kernel form of embedding's backward."""
    vt = ctx.dtype(values)
    if vt.is_floating_point:
        _refuse_nondeterministic("scatter-add")
        acc = torch.float64 if vt == torch.float64 else torch.float32
    else:  # integer sums are exact in any order: int64 atomics, deterministic
        acc = torch.int64
    vals = ctx.cast(values, acc)
    shape = (rows, cols)
    return Ref(ctx.g.add(ir.SCATTER_ADD, "index_put", (vals, lin), shape, acc,
                         contiguous_strides(shape), (("padding_idx", None),)))


def scatter_winner(ctx: LowerCtx, lin: Ref, rows: int) -> Ref:
    """The scatter-write's first kernel: for each of `rows` destinations, 1 + the last
    source position m that writes there (0 where none does), by an atomic max of m + 1
    over a zeroed int32 buffer.  The largest position wins, so duplicate destinations
    resolve deterministically, and as eager does on the CPU (it writes in order)."""
    m = ctx.shape(lin)[0]
    if m >= 2**31 - 1:
        raise Unsupported("scatter-write of 2^31 or more source positions")
    pos = Ref(ctx.g.add(ir.POINTWISE, "iota", (), (m, 1), torch.int32, contiguous_strides((m, 1)), (("dim", 0),)))
    pos1 = ctx.pointwise("add", (pos, 1), (m, 1), torch.int32)
    return Ref(ctx.g.add(ir.SCATTER_ADD, "scatter_write", (pos1, lin), (rows, 1), torch.int32,
                         contiguous_strides((rows, 1)), (("padding_idx", None), ("combine", "max"))))


def winner_rows(ctx: LowerCtx, winner: Ref, sh: tuple, skip_row: int | None = None) -> tuple[Ref, Ref]:
    """Per element of a [rows, cols] destination: whether a source row won it (`winner`,
    [rows, 1], position + 1 or 0; row `skip_row` never), and that source row (0 where
    none did, so a gather stays in bounds)."""
    w = ctx.broadcast_to(winner, sh)
    hit = ctx.pointwise("gt", (w, 0), sh, torch.bool)
    if skip_row is not None:
        row = Ref(ctx.g.add(ir.POINTWISE, "iota", (), sh, torch.int32, contiguous_strides(sh), (("dim", 0),)))
        hit = ctx.pointwise("logical_and", (hit, ctx.pointwise("ne", (row, skip_row), sh, torch.bool)), sh,
                            torch.bool)
    at = ctx.pointwise("where", (hit, ctx.pointwise("sub", (w, 1), sh, torch.int32), 0), sh, torch.int32)
    return hit, at


def scatter_written(ctx: LowerCtx, node: torch.fx.Node, winner: Ref, src_rows: Ref | int | float, x_rows: Ref,
                    dtype: torch.dtype) -> Ref:
    """The scatter-write's second kernel: each destination row is the winning source
    row (gathered) where one wrote there, else x's row; `src_rows` may be a scalar
    (scatter.value).  Everything is per element of x, so it is one kernel."""
    rows, cols = ctx.shape(x_rows)
    sh = (rows, cols)
    hit, at = winner_rows(ctx, winner, sh)
    if isinstance(src_rows, Ref):
        src = ctx.cast(src_rows, dtype)
        if ctx.shape(src)[1] != cols:
            src = ctx.broadcast_to(src, (ctx.shape(src)[0], cols))
        got = _gather_node(ctx, node, src, at, 0, "take_along", sh)
    else:
        got = src_rows
    return ctx.pointwise("where", (hit, got, ctx.cast(x_rows, dtype)), sh, dtype)


@register(aten.index_put.default, aten._unsafe_index_put.default)
def _index_put(ctx, node, x, indices, values, accumulate=False):
    """x.index_put(indices, values, accumulate=True): the values of each index position
    added into x's (linearised) row by atomics, then x added.  Duplicate indices add up,
    like eager.  Without accumulate: a scatter-write (the last of duplicate positions
    wins, see `scatter_winner`)."""
    val = node.meta["val"]
    shape = static_shape(val)
    a = _Indexed(ctx, x, indices)
    # bring values to the order (pre, I, post) of the linearised view, then rows = I
    v = ctx.broadcast_to(ctx.cast(values, val.dtype), a.result_shape())
    npre, ni = len(a.pre), len(a.ishape)
    if npre:
        dims = tuple(range(npre, npre + ni)) + tuple(range(npre)) + tuple(range(npre + ni, len(a.result_shape())))
        v = ctx.view("permute", v, tuple(a.result_shape()[d] for d in dims), (("dims", dims),))
    m, r = ir.prod(a.ishape), ir.prod(a.pre) * ir.prod(a.post)
    v2 = ctx.reshape(v, (m, r))  # rows: index positions; columns: the (pre, post) elements
    if not accumulate:
        # x's rows in the same (K, pre*post) order, written, then back like the sums
        xr = ctx.reshape(ctx.view("permute", a.x3, (a.K, ir.prod(a.pre), ir.prod(a.post)), (("dims", (1, 0, 2)),)),
                         (a.K, r))
        acc = scatter_written(ctx, node, scatter_winner(ctx, a.lin, a.K), v2, xr, val.dtype)
        return _from_rows(ctx, a, acc, shape)
    acc = _scatter_add_rows(ctx, v2, a.lin, a.K, r)              # (K, pre*post)
    at = ctx.dtype(acc)
    total = ctx.pointwise("add", (ctx.cast(x, at), _from_rows(ctx, a, acc, shape)), shape, at)
    return stored_sum(ctx, total, shape, val.dtype)


def stored_sum(ctx: LowerCtx, total: Ref, shape: tuple, dtype: torch.dtype) -> Ref:
    """An accumulated sum in the destination's type; a bool destination is true where the
    (int64) count of true values is not 0: eager adds bools as C++ does, true + true stored
    as true, i.e. a logical or."""
    if dtype == torch.bool:
        return ctx.pointwise("ne", (total, 0), shape, torch.bool)
    return ctx.cast(total, dtype)


@register(aten.index_copy.default)
def _index_copy(ctx, node, x, dim, index, source):
    """x with source's slices written at `index` along `dim`: an index_put write."""
    if not ctx.shape(x):  # 0-d: the only valid index is 0, so the source itself
        return ctx.pointwise("identity", (ctx.reshape(ctx.cast(source, node.meta["val"].dtype), ()),), (),
                             node.meta["val"].dtype)
    dim %= len(ctx.shape(x))
    return _index_put(ctx, node, x, [None] * dim + [index], source)


@register(aten.index_fill.int_Scalar, aten.index_fill.int_Tensor)
def _index_fill(ctx, node, x, dim, index, value):
    """x with `value` written at `index` along `dim` (index_copy's backward fills zeros)."""
    shape = ctx.shape(x)
    dtype = node.meta["val"].dtype
    if not shape:  # 0-d: the only valid index is 0, so the value itself
        v = ctx.reshape(ctx.cast(value, dtype), ()) if isinstance(value, Ref) else ctx.full((), value, dtype)
        return ctx.pointwise("identity", (v,), (), dtype)
    dim %= len(shape)
    ishape = ctx.shape(index) or (1,)
    index = ctx.reshape(index, ishape) if not ctx.shape(index) else index
    fill_shape = tuple(ishape[0] if d == dim else s for d, s in enumerate(shape))
    v = ctx.broadcast_to(ctx.reshape(ctx.cast(value, dtype), (1,) * len(shape)), fill_shape) \
        if isinstance(value, Ref) else ctx.full(fill_shape, value, dtype)
    return _index_put(ctx, node, x, [None] * dim + [index], v)


def _from_rows(ctx: LowerCtx, a: _Indexed, rows: Ref, shape) -> Ref:
    """A (K, pre*post) tensor back to x's layout: (K, pre, post) -> (pre, K, post) ->
    the (permuted) view -> x."""
    out = ctx.reshape(rows, (a.K, ir.prod(a.pre), ir.prod(a.post)))
    out = ctx.view("permute", out, (ir.prod(a.pre), a.K, ir.prod(a.post)), (("dims", (1, 0, 2)),))
    out = ctx.reshape(out, a.view_shape)
    if a.perm is not None:
        inv = tuple(a.perm.index(d) for d in range(len(a.perm)))
        out = ctx.view("permute", out, shape, (("dims", inv),))
    return out


@register(aten.gather.default)
def _gather(ctx, node, x, dim, index, *, sparse_grad=False):
    nd = len(ctx.shape(x))
    if nd == 0:  # 0-d: the only valid index is 0, so x at every index position
        ishape = tuple(ctx.shape(index))
        return ctx.pointwise("identity", (ctx.broadcast_to(ctx.reshape(x, (1,) * len(ishape)), ishape)
                                          if ishape else x,), ishape, ctx.dtype(x))
    if nd == 0 or len(ctx.shape(index)) != nd:
        raise Unsupported("gather needs index of the same rank as the input")
    return _gather_node(ctx, node, x, index, dim % nd, "take_along")


@register(aten.scatter.value)
def _scatter_value(ctx, node, x, dim, index, value):
    """One-hot writes (`index` has size 1 along `dim`): a select on the position."""
    shape = static_shape(node.meta["val"])
    ishape = ctx.shape(index)
    nd = len(shape)
    if nd == 0:  # 0-d: `value` where the index is 0 (the only index eager accepts)
        dtype = node.meta["val"].dtype
        hit = ctx.pointwise("eq", (ctx.cast(index, torch.int64), 0), (), torch.bool)
        return ctx.pointwise("where", (hit, value, ctx.cast(x, dtype)), (), dtype)
    dim %= nd
    if len(ishape) != nd or ishape[dim] != 1 or any(ishape[i] != shape[i] for i in range(nd) if i != dim):
        from .rules_scatter import scatter_write  # the general form: a scatter-write
        return scatter_write(ctx, node, x, dim, index, value)
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
    if val.dtype not in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        raise Unsupported(f"embedding gradients of {val.dtype} run eagerly")
    tokens = ir.prod(ctx.shape(indices))
    if _dense_pays(shape, tokens):   # deterministic: no refusal needed
        return _embedding_backward_dense(ctx, node, grad, indices, shape, padding_idx)
    _refuse_nondeterministic("embedding's backward")
    if config.get("compact_embedding_grads") and _compact_pays(shape, tokens):
        return _embedding_backward_compact(ctx, node, grad, indices, shape, padding_idx)
    # half-precision gradients are summed in float32 and rounded once, as eager's CUDA
    # kernel does (it ran eagerly before: 0.22 ms of a BERT-base bf16 step on an H200)
    # (float64 gradients in float64: eager's sums)
    f = _acc(val.dtype)
    acc = Ref(ctx.g.add(ir.SCATTER_ADD, "embedding_backward", (ctx.cast(grad, f), indices), shape,
                        f, contiguous_strides(shape), (("padding_idx", padding_idx),)))
    return acc if val.dtype == f else ctx.cast(acc, val.dtype)


def _acc(dtype: torch.dtype) -> torch.dtype:
    """The type an embedding gradient is summed in: float32 for float32 and half types
    (rounded once at the end, as eager's CUDA kernel), float64 for float64."""
    return torch.float64 if dtype == torch.float64 else torch.float32


DENSE_TOKENS_PER_ROW = 8   # fewer tokens a table row: little contention, the scatter form is cheaper


def _dense_pays(shape: tuple, tokens: int) -> bool:
    """Whether `_embedding_backward_dense` replaces the scatter-add: a table of at most
    `dense_embedding_grad_rows` rows, each read by `DENSE_TOKENS_PER_ROW` tokens or more
    on average (where atomics on one address queue up)."""
    rows, _ = shape
    return 0 < rows <= int(config.get("dense_embedding_grad_rows")) and tokens >= DENSE_TOKENS_PER_ROW * rows


def _embedding_backward_dense(ctx: LowerCtx, node, grad: Ref, indices: Ref, shape: tuple, padding_idx) -> Ref:
    """Embedding's backward for a table of a few rows (token types, segments) as one
    column reduction: row e of the gradient is the float32 sum over tokens of
    `where(id == e, grad, 0)`, i.e. a [tokens, rows x H] masked broadcast of the gradient
    summed over its tokens, planned like any column sum (partials per program, then
    their combine).  The scatter form adds every token into one of those few rows with
    atomics, which a GPU performs one after another on each address.  Sums in float32,
    rounded once, as eager's CUDA kernel (float64 in float64: `_acc`); the padding row is zero."""
    val = node.meta["val"]
    f = _acc(val.dtype)
    rows, width = shape
    tokens = ir.prod(ctx.shape(indices))
    sh = (tokens, rows, width)
    ids = ctx.broadcast_to(ctx.reshape(ctx.cast(indices, torch.int64), (tokens, 1, 1)), sh)
    which = Ref(ctx.g.add(ir.POINTWISE, "iota", (), sh, torch.int64, contiguous_strides(sh), (("dim", 1),)))
    hit = ctx.pointwise("eq", (ids, which), sh, torch.bool)
    values = ctx.broadcast_to(ctx.reshape(ctx.cast(grad, f), (tokens, 1, width)), sh)
    sums = ctx.reduce("sum", ctx.pointwise("where", (hit, values, 0.0), sh, f), (0,), False, f)
    if padding_idx is not None and 0 <= padding_idx < rows:
        row = Ref(ctx.g.add(ir.POINTWISE, "iota", (), shape, torch.int64, contiguous_strides(shape), (("dim", 0),)))
        sums = ctx.pointwise("where", (ctx.pointwise("eq", (row, padding_idx), shape, torch.bool), 0.0, sums),
                             shape, f)
    return sums if val.dtype == f else ctx.cast(sums, val.dtype)


COMPACT_ROWS_PER_TOKEN = 2          # a table this many times the tokens or more ...
COMPACT_MIN_SAVED_BYTES = 16 << 20  # ... where that saves this much: its two extra launches cost ~4 µs


def _compact_pays(shape: tuple, tokens: int) -> bool:
    """Whether `_embedding_backward_compact` moves enough fewer bytes than the plain form:
    8 bytes a table element (its float32 copy zeroed, then read back) against about 12 a
    token's element (a float32 row zeroed, added into, gathered back)."""
    rows, width = shape
    return (rows >= COMPACT_ROWS_PER_TOKEN * tokens and tokens < 2**31 - 2
            and (8 * rows - 12 * tokens) * width >= COMPACT_MIN_SAVED_BYTES)


def _embedding_backward_compact(ctx: LowerCtx, node, grad: Ref, indices: Ref, shape: tuple, padding_idx) -> Ref:
    """Embedding's backward for a table much larger than the tokens that read it (a
    vocabulary: GPT-2's 50257 rows for 4096 tokens), summed in float32 over rows of
    the tokens rather than of the table.  The plain form adds into a zeroed float32
    copy of the whole table and reads it all back to round it: 8 bytes a table element
    besides the output (309 MB of GPT-2's step); here
    1. each table row's representative is the last token reading it (`scatter_winner`:
       an int32 atomic max of the token's position + 1, 0 for rows no token reads);
    2. each token adds its gradient row into its representative's row of a zeroed
       [tokens, H] float32 buffer;
    3. each table row is its representative's sum, rounded once, or 0 (rows no token
       reads, and the padding row: its tokens' sum is computed and not read).
    The sums are those of the plain form (the same additions, in an order atomics
    decide, as before)."""
    val = node.meta["val"]
    f = _acc(val.dtype)
    rows, width = shape
    tokens = ir.prod(ctx.shape(indices))
    ids = ctx.reshape(indices, (tokens,))
    winner = scatter_winner(ctx, ids, rows)                           # [rows, 1] int32
    last = Ref(ctx.g.add(ir.GATHER, "index_select", (ctx.reshape(winner, (rows,)), ids), (tokens,), torch.int32,
                         contiguous_strides((tokens,)), (("dim", 0), ("bound", rows))))
    rep = ctx.pointwise("sub", (last, 1), (tokens,), torch.int32)    # every token's row has one: >= 0
    values = ctx.cast(ctx.reshape(grad, (tokens, width)), f)
    sums = Ref(ctx.g.add(ir.SCATTER_ADD, "embedding_backward", (values, rep), (tokens, width), f,
                         contiguous_strides((tokens, width)), (("padding_idx", None),)))
    sh = (rows, width)
    hit, at = winner_rows(ctx, winner, sh, padding_idx if padding_idx is not None and 0 <= padding_idx < rows else None)
    got = Ref(ctx.g.add(ir.GATHER, "take_along", (sums, at), sh, f, contiguous_strides(sh),
                        (("dim", 0), ("bound", tokens))))
    out = ctx.pointwise("where", (hit, got, 0.0), sh, f)
    return out if val.dtype == f else ctx.cast(out, val.dtype)
