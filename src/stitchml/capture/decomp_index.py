"""Our decompositions of data-dependent index ops (issue 18) onto ops that stitch: the scan
form (`cumsum`), gathers, and the scatter forms of `index_put`.

- `masked_scatter(x, mask, source)` (multimodal models write image features into the
  token embeddings this way): the k-th True element of the broadcast mask takes
  source's k-th element; k is the mask's running count, an inclusive `cumsum` of the
  flattened mask minus one, so the op is a scan, a gather and a `where`.  Its gradient
  for `source` (`masked_scatter_backward`) writes each selected gradient element to its
  k with the scatter-write (deterministic), unselected ones to a slot that is dropped.
- `_embedding_bag` (sum and mean bags, with or without per-sample weights and a padding
  index; recommendation models): each index's bag is the running count of bag starts at
  or before it (`cumsum` of the starts scattered into a zero vector, minus one); the
  rows are gathered and added into their bag with the scatter-add form.  The backward
  gathers each index's bag gradient and adds it into the weight rows; the per-sample
  weights' gradient is a row dot product.  The extra outputs (offset2bag, bag sizes)
  are our own: only our backward reads them.  Max bags (`_embedding_bag_max`): scatter
  amax of the rows and scatter amin of the winning positions; the backward adds each
  bag's gradient at its winners.  `scale_grad_by_freq` and `sparse` change only the
  gradient, so the forward stitches with either.  The backward divides each index's
  gradient by how often the index occurs (`scale_grad_by_freq`, sum and mean bags) on
  CUDA; on the CPU it stays eager with its reason: eager's CPU kernel divides the k-th
  distinct index's gradient by the count of the k-th *sorted* index (an upstream slip,
  `counts[indices_data[i]]` for `counts[indices_data[start]]`), which no stitched form
  should copy.  A sparse gradient is a sparse tensor: eager.
As with every index op, an index out of range (here: a source with fewer elements than
the mask selects) is an error in eager; kernels clamp the address and `tl.device_assert`
it, which only Triton's debug mode checks (README, known limits).
"""
from __future__ import annotations

import math
from types import NotImplementedType
from typing import Sequence

import torch

aten = torch.ops.aten

_SUM, _MEAN, _MAX = 0, 1, 2


def _running_position(mask_flat: torch.Tensor) -> torch.Tensor:
    """0-based rank of every True element among the True ones (garbage where False)."""
    return torch.cumsum(mask_flat.to(torch.int64), 0) - 1


def masked_scatter(x: torch.Tensor, mask: torch.Tensor, source: torch.Tensor) -> torch.Tensor | NotImplementedType:
    if mask.dtype != torch.bool or source.numel() == 0:
        return NotImplemented
    shape = torch.broadcast_shapes(x.shape, mask.shape)
    m = mask.expand(shape).reshape(-1)
    pos = torch.where(m, _running_position(m), 0)
    picked = source.reshape(-1)[pos]
    return torch.where(m, picked, x.expand(shape).reshape(-1)).reshape(shape)


def masked_scatter_backward(grad: torch.Tensor, mask: torch.Tensor,
                            sizes: Sequence[int]) -> torch.Tensor | NotImplementedType:
    if mask.dtype != torch.bool:
        return NotImplemented
    n = math.prod(int(s) for s in sizes)
    m = mask.expand(grad.shape).reshape(-1)
    dest = torch.where(m, _running_position(m), n)      # unselected → slot n, dropped below
    out = grad.new_zeros(n + 1).index_put((dest,), grad.reshape(-1))
    return out[:n].reshape(tuple(sizes))


def _bags(indices, offsets, include_last_offset: bool):
    n = indices.numel()
    bags = offsets.numel() - 1 if include_last_offset else offsets.numel()
    starts = torch.zeros(n + 1, dtype=torch.int64, device=indices.device)
    starts = starts.index_put((offsets[:bags].to(torch.int64),), torch.ones((), dtype=torch.int64,
                                                                           device=indices.device), accumulate=True)
    return bags, torch.cumsum(starts, 0)[:n] - 1


def _kept(indices, padding_idx):
    """Positions whose index is not the padding index (None: no padding index)."""
    return indices != padding_idx if padding_idx is not None and padding_idx >= 0 else None


def _embedding_bag_supported(indices, offsets, scale_grad_by_freq, mode, sparse, per_sample_weights,
                             include_last_offset) -> bool:
    bags = offsets.numel() - (1 if include_last_offset else 0)
    # (scale_grad_by_freq and sparse change only the backward: embedding_bag_backward)
    return (mode in (_SUM, _MEAN, _MAX) and indices.dim() == 1
            and offsets.dim() == 1 and indices.numel() > 0 and bags > 0
            and (per_sample_weights is None or mode == _SUM))


def embedding_bag(weight: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor, scale_grad_by_freq: bool = False,
                  mode: int = 0, sparse: bool = False, per_sample_weights: torch.Tensor | None = None,
                  include_last_offset: bool = False, padding_idx: int | None = -1
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | NotImplementedType:
    if not _embedding_bag_supported(indices, offsets, scale_grad_by_freq, mode, sparse, per_sample_weights,
                                    include_last_offset):
        return NotImplemented
    bags, bag = _bags(indices, offsets, include_last_offset)
    if mode == _MAX:
        return _embedding_bag_max(weight, indices, bags, bag, _kept(indices, padding_idx))
    rows = weight[indices]
    keep = _kept(indices, padding_idx)
    if per_sample_weights is not None:
        rows = rows * per_sample_weights.to(rows.dtype).unsqueeze(1)
    if keep is not None:
        rows = torch.where(keep.unsqueeze(1), rows, 0)
    counted = keep.to(torch.int64) if keep is not None else torch.ones_like(indices, dtype=torch.int64)
    size = torch.zeros(bags, dtype=torch.int64, device=indices.device).index_put((bag,), counted, accumulate=True)
    out = weight.new_zeros(bags, weight.shape[1]).index_put((bag,), rows, accumulate=True)
    if mode == _MEAN:
        out = out / size.clamp(min=1).to(out.dtype).unsqueeze(1)
    size = size.to(indices.dtype)
    return out, bag.to(indices.dtype), size, size.clone()


def _embedding_bag_max(weight, indices, bags: int, bag, keep):
    """Max bags as eager computes them: the bag's first row, replaced by each later row
    that is strictly greater — so a NaN first row stays, NaN later rows are skipped, and
    a tie keeps the earlier row.  Without the loop: the maximum of the non-NaN rows
    (scatter amax), NaN where the first row is NaN, and each feature's winning position
    the least one holding that value (scatter amin of positions).  Empty bags give 0 and
    index 0; padded positions take no part."""
    n, f = indices.numel(), weight.shape[1]
    dev = indices.device
    rows = weight[indices]                                        # (n, F)
    pos = torch.arange(n, device=dev)
    big = torch.full((), n, dtype=torch.int64, device=dev)
    live = keep if keep is not None else torch.ones(n, dtype=torch.bool, device=dev)
    first = torch.full((bags,), n, dtype=torch.int64, device=dev).scatter_reduce(
        0, bag, torch.where(live, pos, big), "amin")              # (bags,): n when empty
    ninf = torch.full((), -math.inf, dtype=rows.dtype, device=dev)
    cand = torch.where(live.unsqueeze(1) & ~rows.isnan(), rows, ninf)
    b2 = bag.unsqueeze(1).expand(n, f)
    top = torch.full((bags, f), -math.inf, dtype=rows.dtype, device=dev).scatter_reduce(0, b2, cand, "amax")
    hit = (cand == top[bag]) & live.unsqueeze(1) & ~rows.isnan()
    at = torch.full((bags, f), n, dtype=torch.int64, device=dev).scatter_reduce(
        0, b2, torch.where(hit, pos.unsqueeze(1), big), "amin")
    empty = (first == n).unsqueeze(1)
    head = rows[first.clamp(max=n - 1)]                           # the first live row of each bag
    nan_head = head.isnan() & ~empty
    at = torch.where(nan_head, first.unsqueeze(1), at)
    out = torch.where(nan_head, head, top)
    out = torch.where(empty, torch.zeros((), dtype=rows.dtype, device=dev), out)
    max_idx = torch.where(empty, 0, indices.to(torch.int64)[at.clamp(max=n - 1)])
    size = torch.zeros(bags, dtype=torch.int64, device=dev).index_put((bag,), live.to(torch.int64),
                                                                       accumulate=True)
    return out, bag.to(indices.dtype), size.to(indices.dtype), max_idx.to(indices.dtype)


def embedding_bag_backward(grad: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor, offset2bag: torch.Tensor,
                           bag_size: torch.Tensor, maximum_indices: torch.Tensor, num_weights: int,
                           scale_grad_by_freq: bool, mode: int, sparse: bool, per_sample_weights: torch.Tensor | None,
                           padding_idx: int | None = -1) -> torch.Tensor | NotImplementedType:
    if sparse:
        return NotImplemented
    return embedding_bag_dense_backward(grad, indices, offset2bag, bag_size, maximum_indices, num_weights,
                                        scale_grad_by_freq, mode, per_sample_weights, padding_idx)


def _eager_count_is_wrong(device: torch.device) -> bool:
    """Whether eager's scale_grad_by_freq count is the upstream slip (its CPU kernel)."""
    return device.type == "cpu"


def embedding_bag_dense_backward(grad: torch.Tensor, indices: torch.Tensor, offset2bag: torch.Tensor,
                                 bag_size: torch.Tensor, maximum_indices: torch.Tensor, num_weights: int,
                                 scale_grad_by_freq: bool, mode: int, per_sample_weights: torch.Tensor | None,
                                 padding_idx: int | None = -1) -> torch.Tensor | NotImplementedType:
    if mode not in (_SUM, _MEAN, _MAX) or indices.dim() != 1:
        return NotImplemented
    if scale_grad_by_freq and (mode == _MAX or _eager_count_is_wrong(grad.device)):
        # max bags: F.embedding_bag rejects the pair; the CPU: eager's count is another
        # index's (module docstring), so eager runs and keeps its own answer
        return NotImplemented
    if mode == _MAX:  # each bag's gradient to its winning rows, per feature (empty bags: none)
        f = grad.shape[1]
        g = torch.where((bag_size > 0).unsqueeze(1), grad, 0)
        cols = torch.arange(f, device=grad.device).unsqueeze(0).expand(grad.shape[0], f)
        return grad.new_zeros(num_weights, f).index_put((maximum_indices.to(torch.int64), cols), g,
                                                        accumulate=True)
    bag = offset2bag.to(torch.int64)
    g = grad[bag]
    if mode == _MEAN:
        g = g / bag_size.to(torch.int64)[bag].clamp(min=1).to(g.dtype).unsqueeze(1)
    if per_sample_weights is not None:
        g = g * per_sample_weights.to(g.dtype).unsqueeze(1)
    if scale_grad_by_freq:  # each index's gradient over the number of its occurrences
        ones = torch.ones((), dtype=torch.int64, device=indices.device)
        count = torch.zeros(num_weights, dtype=torch.int64, device=indices.device).index_put(
            (indices.to(torch.int64),), ones, accumulate=True)
        g = g / count[indices].to(g.dtype).unsqueeze(1)
    if (keep := _kept(indices, padding_idx)) is not None:
        g = torch.where(keep.unsqueeze(1), g, 0)
    return grad.new_zeros(num_weights, grad.shape[1]).index_put((indices,), g, accumulate=True)


def embedding_bag_per_sample_weights_backward(grad: torch.Tensor, weight: torch.Tensor, indices: torch.Tensor,
                                              offsets: torch.Tensor, offset2bag: torch.Tensor, mode: int,
                                              padding_idx: int | None = -1) -> torch.Tensor | NotImplementedType:
    if mode != _SUM or indices.dim() != 1:
        return NotImplemented
    dot = (grad[offset2bag.to(torch.int64)] * weight[indices]).sum(1)
    if (keep := _kept(indices, padding_idx)) is not None:
        dot = torch.where(keep, dot, 0)
    return dot


_SEGMENT = {"sum": "sum", "mean": "sum", "max": "amax", "min": "amin", "prod": "prod"}
_EMPTY = {"sum": 0.0, "mean": math.nan, "max": -math.inf, "min": math.inf, "prod": 1.0}


def _segments(data, lengths, offsets, axis: int):
    """(segment count, each position's segment along axis (n,), each segment's length)
    from 1-d lengths or offsets; None where the case is not covered."""
    if data.numel() == 0 or not data.is_floating_point():
        return None
    if lengths is not None and lengths.dim() == 1:
        lengths = lengths.to(torch.int64)
        starts = torch.cumsum(lengths, 0) - lengths
    elif lengths is None and offsets is not None and offsets.dim() == 1 and offsets.numel() >= 1:
        offsets = offsets.to(torch.int64)
        starts, lengths = offsets[:-1], offsets[1:] - offsets[:-1]
    else:
        return None
    nseg, n = lengths.numel(), data.shape[axis]
    marks = torch.zeros(n + 1, dtype=torch.int64, device=data.device).index_put(
        (starts.clamp(0, n),), torch.ones((), dtype=torch.int64, device=data.device), accumulate=True)
    return nseg, torch.cumsum(marks, 0)[:n] - 1, lengths


def segment_reduce(data: torch.Tensor, reduce: str, *, lengths: torch.Tensor | None = None,
                   indices: torch.Tensor | None = None, offsets: torch.Tensor | None = None, axis: int = 0,
                   unsafe: bool = False, initial: float | None = None) -> torch.Tensor | NotImplementedType:
    """Each segment of `axis` reduced with the scatter forms (scatter_reduce into a
    buffer holding the empty segment's value): eager's rules — `initial` takes part in
    every segment (mean: added to the sum, the count unchanged) and is the value of an
    empty one, else 0 / NaN / -inf / inf / 1."""
    axis %= max(data.dim(), 1)
    got = _segments(data, lengths, offsets, axis) if indices is None and reduce in _SEGMENT else None
    if got is None:
        return NotImplemented
    nseg, seg, lens = got
    x = data.movedim(axis, 0)
    shape = (nseg,) + tuple(x.shape[1:])
    idx = seg.reshape((-1,) + (1,) * (x.dim() - 1)).expand(x.shape)
    start = _EMPTY[reduce] if initial is None else float(initial)
    base = torch.full(shape, 0.0 if reduce == "mean" else start, dtype=x.dtype, device=x.device)
    out = base.scatter_reduce(0, idx, x, _SEGMENT[reduce], include_self=False)
    lens = lens.reshape((-1,) + (1,) * (x.dim() - 1))
    if reduce == "mean":
        if initial is not None:
            out = out + float(initial)
        out = torch.where(lens > 0, out / lens.clamp(min=1).to(x.dtype), start)
    elif initial is not None and reduce != "mean":
        ini = torch.full((), float(initial), dtype=x.dtype, device=x.device)
        op = {"sum": torch.add, "max": torch.maximum, "min": torch.minimum, "prod": torch.mul}[reduce]
        out = torch.where(lens > 0, op(out, ini), ini)
    return out.movedim(0, axis)


def segment_reduce_backward(grad: torch.Tensor, output: torch.Tensor, data: torch.Tensor, reduce: str, *,
                            lengths: torch.Tensor | None = None, offsets: torch.Tensor | None = None, axis: int = 0,
                            initial: float | None = None) -> torch.Tensor | NotImplementedType:
    """The gradient for `data`: each element takes its segment's gradient (mean: over
    the length; max/min: to the elements equal to the result, a positive gradient shared
    among ties, as eager;
    prod: the product of the others — from the output where no element is zero, else
    from the product of the nonzero ones where exactly one is)."""
    axis %= max(data.dim(), 1)
    got = _segments(data, lengths, offsets, axis) if reduce in _SEGMENT else None
    if got is None:
        return NotImplemented
    nseg, seg, lens = got
    x = data.movedim(axis, 0)
    g = grad.movedim(axis, 0)[seg]
    out = output.movedim(axis, 0)
    lens_at = lens.reshape((-1,) + (1,) * (x.dim() - 1))[seg]
    zero = torch.zeros((), dtype=x.dtype, device=x.device)
    if reduce == "sum":
        gx = g
    elif reduce == "mean":
        gx = g / lens_at.clamp(min=1).to(g.dtype)
    elif reduce in ("max", "min"):
        # eager's rule, to the letter: every element equal to the result (or NaN) takes
        # the gradient; where two or more do, a positive gradient is divided among them
        # and a negative one is not
        hit = (x == out[seg]) | x.isnan()
        idx = seg.reshape((-1,) + (1,) * (x.dim() - 1)).expand(x.shape)
        count = torch.zeros(out.shape, dtype=x.dtype, device=x.device).scatter_add(0, idx, hit.to(x.dtype))[seg]
        gx = torch.where(hit, torch.where((count >= 2) & (g > 0), g / count, g), zero)
    else:  # prod
        idx = seg.reshape((-1,) + (1,) * (x.dim() - 1)).expand(x.shape)
        is_zero = x == 0
        zeros = torch.zeros(out.shape, dtype=torch.int64, device=x.device).scatter_add(0, idx, is_zero.to(torch.int64))
        one = torch.ones((), dtype=x.dtype, device=x.device)
        start = one if initial is None else torch.full((), float(initial), dtype=x.dtype, device=x.device)
        nonzero = torch.ones(out.shape, dtype=x.dtype, device=x.device).scatter_reduce(
            0, idx, torch.where(is_zero, one, x), "prod", include_self=False) * start
        z = zeros[seg]
        gx = torch.where(z == 0, g * out[seg] / torch.where(is_zero, one, x),
                         torch.where((z == 1) & is_zero, g * nonzero[seg], zero))
    return gx.movedim(0, axis).to(data.dtype)


# The reason an op still runs eagerly when its decomposition declined the case
# (`fallback.no_rule_reason` reports it instead of "no lowering rule").
DECLINED: dict[object, str] = {
    op: "embedding_bag: N-d indices or offsets, no indices, no bags or per-sample weights outside sum bags have no "
        "stitched form"
    for op in (aten._embedding_bag.default, aten._embedding_bag_forward_only.default,
               aten._embedding_bag_per_sample_weights_backward.default)
}
DECLINED.update({
    op: "embedding_bag backward: a sparse gradient is a sparse tensor, not a stitched form; scale_grad_by_freq on the "
        "CPU is left to eager, whose CPU kernel divides by another index's count (upstream)"
    for op in (aten._embedding_bag_backward.default, aten._embedding_bag_dense_backward.default)
})
DECLINED[aten.masked_scatter.default] = "masked_scatter: a non-bool mask or an empty source has no stitched form"
DECLINED[aten.segment_reduce.default] = ("segment_reduce: integer data, an empty tensor, N-d lengths/offsets or "
                                         "unsorted indices have no stitched form")
DECLINED[aten._segment_reduce_backward.default] = DECLINED[aten.segment_reduce.default]
DECLINED[aten.masked_scatter_backward.default] = DECLINED[aten.masked_scatter.default]


def table() -> dict:
    return {
        aten.masked_scatter.default: masked_scatter,
        aten.segment_reduce.default: segment_reduce,
        aten._segment_reduce_backward.default: segment_reduce_backward,
        aten.masked_scatter_backward.default: masked_scatter_backward,
        aten._embedding_bag.default: embedding_bag,
        aten._embedding_bag_forward_only.default: embedding_bag,
        aten._embedding_bag_backward.default: embedding_bag_backward,
        aten._embedding_bag_dense_backward.default: embedding_bag_dense_backward,
        aten._embedding_bag_per_sample_weights_backward.default: embedding_bag_per_sample_weights_backward,
    }
