"""Our decompositions of searching ops (issue 19): searchsorted / bucketize, isin,
repeat_interleave's indices (a search in the running total of the repeats) and
nonzero_static, onto element-wise ops, gathers, scans and scatter-writes that stitch.

- `searchsorted(seq, v)`: a branch-free binary search.  Every element keeps its own
  interval [lo, hi) and takes bit_length(n) = ceil(log2(n + 1)) steps, each one gather
  of seq at mid = lo + (hi - lo) // 2 (through `sorter` if given) and `where` updates
  of lo and hi; an element whose interval is already empty keeps it.  The whole search
  is element-wise ops and gathers: one kernel, fused with what consumes it.  The steps
  are eager's own (the same mid, the same test: go right unless seq[mid] >= v, > v for
  `right`), so NaN behaves as in eager: a NaN value ends at n, a NaN met at mid sends
  the search right.  N-d sequences search row by row (a gather along the last dim);
  values and sequence are compared in their promoted dtype, as eager does.
- `bucketize(v, boundaries)`: searchsorted with the 1-d boundaries as the sequence
  (`right` means the same in both).  torch's own decomposition is a similar search and
  also stitches into one kernel, but it returns the input's dtype for empty boundaries
  (eager: int64/int32); one search serves both ops here.
- `isin(elements, test)`: small problems compare every element with every test value,
  `any(elements[..., None] == test.flatten())`, one reduction kernel over the test set
  (the broadcast is an index map, never materialised).  Its work grows with
  elements x test values; beyond `ISIN_BRUTE_MAX_PAIRS` pairs (and more than
  `ISIN_SORT_MIN_TEST` test values) the test set is sorted (torch.sort: a library op)
  and each element looks itself up with the binary search: ~log2(T) gathers instead
  of T comparisons.  That search orders NaN last (a NaN at mid sends it left), so the
  sorted set's trailing NaNs never hide a value; NaN is in no set, as in eager.  Mixed
  dtypes are compared in their promoted dtype (eager's `result_type`).
- `nonzero_static(x, size, fill_value)`: the flattened mask x != 0 (complex: either
  part), its running count (a `cumsum` scan) as each nonzero's output row, the flat
  index unravelled into coordinates by div/mod, and a scatter-write of the coordinates
  of the first `size` nonzeros into a (size + 1, ndim) buffer filled with fill_value
  (the others go to the dropped row `size`): a scan kernel and a scatter kernel.
Arguments eager rejects (see DECLINED) are declined, so that eager raises its error.  As
with every index op, a `sorter` entry out of range is an error in eager; kernels clamp
the address and `tl.device_assert` it, which only Triton's debug mode checks.
"""
from __future__ import annotations

from types import NotImplementedType

import torch

aten = torch.ops.aten

# isin's sorted form (see the module docstring): used when there are more than
# ISIN_SORT_MIN_TEST test values and more than ISIN_BRUTE_MAX_PAIRS element x test pairs.
# A compared pair costs ~2 instructions (compare, or), a search step ~10 (mid, clamp,
# address, load, compare, two selects): under 64 test values (6 steps) the search saves
# little and the sort is extra.  The sort's few launches cost ~20 us; an H100 compares
# ~1e13 pairs a second, so the brute force costs as much at ~2^27 pairs.
ISIN_SORT_MIN_TEST = 64
ISIN_BRUTE_MAX_PAIRS = 2 ** 27

_SEARCHABLE = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.bfloat16,
               torch.float32, torch.float64)


def _bit_length(n) -> int:
    """n.bit_length(), for a symbolic size too: its comparisons guard the range
    [2^(k-1), 2^k) of n, not n itself, so sizes with as many steps share a graph."""
    k = 0
    while n >= (1 << k):
        k += 1
    return k


def _search(seq: torch.Tensor, v: torch.Tensor, right: bool, sorter: torch.Tensor | None = None,
            nan_last: bool = False) -> torch.Tensor:
    """Index (int64, v's shape) where each v would be inserted into the sorted last dim
    of seq (1-d, or rows matching v's leading dims).  `nan_last`: a NaN in seq counts as
    larger than everything (isin's sorted set) instead of eager's test."""
    n = seq.shape[-1]
    rows = seq.dim() > 1
    shape = v.shape
    if not rows:
        v = v.reshape(-1)              # (a 0-d index would select, not gather)
    lo = torch.zeros(v.shape, dtype=torch.int64, device=v.device)
    if n == 0 or v.numel() == 0:
        return lo.reshape(shape)
    hi = torch.full(v.shape, n, dtype=torch.int64, device=v.device)
    for _ in range(_bit_length(n)):
        active = lo < hi
        mid = lo + torch.div(hi - lo, 2, rounding_mode="floor")
        at = torch.clamp_max(mid, n - 1)      # an empty interval's mid may be n: keep the gather in range
        if sorter is not None:
            at = sorter.gather(-1, at) if rows else sorter[at]
        probe = seq.gather(-1, at) if rows else seq[at]
        if nan_last:
            go_right = probe <= v if right else probe < v
        else:
            go_right = torch.logical_not(probe > v if right else probe >= v)
        lo = torch.where(active & go_right, mid + 1, lo)
        hi = torch.where(active & torch.logical_not(go_right), mid, hi)
    return lo.reshape(shape)


def searchsorted(sorted_sequence: torch.Tensor, self: torch.Tensor | float, *, out_int32: bool = False,
                 right: bool = False, side: str | None = None,
                 sorter: torch.Tensor | None = None) -> torch.Tensor | NotImplementedType:
    seq = sorted_sequence
    if side is not None:
        if right and side == "left":
            return NotImplemented
        right = side == "right"
    dtype = torch.result_type(seq, self)      # eager compares in the promoted dtype
    v = self.to(dtype) if isinstance(self, torch.Tensor) else torch.scalar_tensor(self, dtype=dtype,
                                                                                device=seq.device)
    if (seq.dim() == 0 or (seq.dim() > 1 and tuple(seq.shape[:-1]) != tuple(v.shape[:-1]))
            or (sorter is not None and (sorter.dtype != torch.int64 or tuple(sorter.shape) != tuple(seq.shape)))
            or dtype not in _SEARCHABLE or seq.dtype not in _SEARCHABLE
            or (isinstance(self, torch.Tensor) and self.dtype not in _SEARCHABLE)):
        return NotImplemented
    out = _search(seq.to(dtype), v, bool(right), sorter)
    return out.to(torch.int32 if out_int32 else torch.int64)


def bucketize(self: torch.Tensor | float, boundaries: torch.Tensor, *, out_int32: bool = False,
              right: bool = False) -> torch.Tensor | NotImplementedType:
    if boundaries.dim() != 1:
        return NotImplemented
    return searchsorted(boundaries, self, out_int32=out_int32, right=right)


def _isin_sorts(elements: int, test: int) -> bool:
    """Whether isin takes the sorted form (ISIN_SORT_MIN_TEST, ISIN_BRUTE_MAX_PAIRS)."""
    return test > ISIN_SORT_MIN_TEST and elements * test > ISIN_BRUTE_MAX_PAIRS


def isin(elements: torch.Tensor | float, test_elements: torch.Tensor | float, *, assume_unique: bool = False,
         invert: bool = False) -> torch.Tensor | NotImplementedType:
    if any(isinstance(a, torch.Tensor) and a.dtype not in _SEARCHABLE for a in (elements, test_elements)):
        return NotImplemented
    dtype = torch.result_type(elements, test_elements)   # eager compares in the promoted dtype
    device = elements.device if isinstance(elements, torch.Tensor) else test_elements.device

    def promoted(a):
        return a.to(dtype) if isinstance(a, torch.Tensor) else torch.scalar_tensor(a, dtype=dtype, device=device)
    e, t = promoted(elements), promoted(test_elements)
    t = t.reshape(-1)
    if t.numel() == 0:
        found = torch.zeros(e.shape, dtype=torch.bool, device=device)
    elif _isin_sorts(e.numel(), t.numel()):
        s = torch.sort(t).values
        flat = e.reshape(-1)               # (a 0-d index would select, not gather)
        at = torch.clamp_max(_search(s, flat, False, nan_last=True), t.numel() - 1)
        found = (s[at] == flat).reshape(e.shape)
    else:
        found = (e.unsqueeze(-1) == t).any(-1)
    return torch.logical_not(found) if invert else found


def nonzero_static(self: torch.Tensor, *, size: int, fill_value: int = -1) -> torch.Tensor | NotImplementedType:
    nd = self.dim()
    if size < 0:
        return NotImplemented
    if nd == 0 or self.numel() == 0 or size == 0:
        return torch.full((size, nd), fill_value, dtype=torch.int64, device=self.device)
    n = self.numel()
    if self.is_complex():              # (complex != has no rule: compare the two parts)
        mask = (torch.view_as_real(self) != 0).any(-1).reshape(-1)
    else:
        mask = (self != 0).reshape(-1)
    pos = torch.cumsum(mask.to(torch.int64), 0) - 1
    dest = torch.where(mask & (pos < size), pos, size)
    flat = torch.arange(n, dtype=torch.int64, device=self.device)
    coords, stride = [], n
    for s in self.shape:
        stride //= s
        coords.append(torch.remainder(torch.div(flat, stride, rounding_mode="floor"), s))
    coords = torch.stack(coords, 1)
    buf = torch.full((size + 1, nd), fill_value, dtype=torch.int64, device=self.device)
    return buf.index_put((dest,), coords)[:size]


def repeat_interleave(repeats: torch.Tensor, *, output_size: int | None = None) -> torch.Tensor | NotImplementedType:
    """The indices that repeat element j repeats[j] times (`x.repeat_interleave(r, dim)`
    selects with them): output position i belongs to the first j whose running total
    of repeats exceeds i, a search of i in the cumulative sum.  Only with `output_size`
    (the result's length is the sum of the repeats otherwise: data, not shape); indices
    clamped into range, so that an output_size eager would reject cannot read outside
    the input."""
    if output_size is None or repeats.dim() != 1 or repeats.numel() == 0:
        return NotImplemented
    totals = torch.cumsum(repeats.to(torch.int64), 0)
    pos = torch.arange(output_size, dtype=torch.int64, device=repeats.device)
    idx = searchsorted(totals, pos, right=True)
    return torch.clamp(idx, 0, repeats.numel() - 1)


_EAGER_RAISES = "runs eagerly, which raises eager's error"
DECLINED: dict[object, str] = {
    op: "searchsorted/bucketize: arguments eager rejects (side opposite to right, a 0-d sequence, an N-d "
        "sequence whose leading dims differ from the values', a sorter not int64 or not of the sequence's "
        f"shape, N-d boundaries, bool or complex values) {_EAGER_RAISES}"
    for op in (aten.searchsorted.Tensor, aten.searchsorted.Scalar, aten.bucketize.Tensor, aten.bucketize.Scalar)
}
DECLINED.update({op: f"isin: bool or complex operands (eager rejects them) {_EAGER_RAISES}"
                 for op in (aten.isin.Tensor_Tensor, aten.isin.Tensor_Scalar, aten.isin.Scalar_Tensor)})
DECLINED[aten.nonzero_static.default] = f"nonzero_static: a negative size (eager rejects it) {_EAGER_RAISES}"
DECLINED[aten.repeat_interleave.Tensor] = ("repeat_interleave with a tensor of repeats and no output_size: the "
                                           "result's length is the sum of the repeats (data, not shape)")


def table() -> dict:
    return {
        aten.searchsorted.Tensor: searchsorted,
        aten.searchsorted.Scalar: searchsorted,
        aten.bucketize.Tensor: bucketize,
        aten.bucketize.Scalar: bucketize,
        aten.isin.Tensor_Tensor: isin,
        aten.isin.Tensor_Scalar: isin,
        aten.isin.Scalar_Tensor: isin,
        aten.nonzero_static.default: nonzero_static,
        aten.repeat_interleave.Tensor: repeat_interleave,
    }
