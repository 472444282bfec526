"""Our decompositions of pairwise distances (issue 18/19): `cdist` and `pdist`, forward
and backward, onto broadcasts, reductions and index ops that stitch.

- `_cdist_forward(x1, x2, p)` on eager's direct path: the difference of every pair of
  rows as a broadcast (never materialised: a reduction kernel over the feature dim
  reads both operands through index maps), reduced by the p-norm (p = 0: a count,
  1, 2, inf and general p as eager computes them).  Where eager takes its matrix-
  product path (p = 2 with more than 25 rows, or `use_mm_for_euclid_dist`), so do we:
  `_euclidean_dist`, whose matrix product is the library's and the rest stitched.
- `_cdist_backward(grad, x1, x2, p, dist)`: eager's per-p formulas, summed over the
  other operand's rows (one reduction kernel).
- `pdist(x, p)`: the full (N, N) direct distances, the upper triangle written to its
  pair position `i*N - i*(i+1)/2 + j - i - 1` with the scatter-write (other entries to
  a dropped slot); the backward spreads each pair's gradient to both rows as a
  symmetric (N, N) matrix and reuses the cdist backward.
Batch dims broadcast as in eager (the backward sums the gradient back to each operand's
own batch shape); no features or fewer than two rows give zero distances / no pairs.
"""
from __future__ import annotations

import math
from types import NotImplementedType

import torch

aten = torch.ops.aten

# eager's compute modes: None/0 = matrix product if either side has more than 25 rows,
# 1 = always the matrix product, 2 = never (p = 2 only)
_MM_ROWS = 25


def _uses_mm(x1, x2, p, compute_mode) -> bool:
    if p != 2:
        return False
    if compute_mode == 1:
        return True
    return compute_mode in (None, 0) and (x1.shape[-2] > _MM_ROWS or x2.shape[-2] > _MM_ROWS)


def _supported(x1, x2, p) -> bool:
    return x1.dim() >= 2 and x2.dim() >= 2 and x1.shape[-1] == x2.shape[-1] and p >= 0


def _broadcast(x1, x2):
    """Both operands expanded to their common batch dims (eager broadcasts them)."""
    batch = tuple(torch.broadcast_shapes(x1.shape[:-2], x2.shape[:-2]))
    return x1.expand(batch + tuple(x1.shape[-2:])), x2.expand(batch + tuple(x2.shape[-2:]))


def _direct(x1, x2, p: float):
    d = (x1.unsqueeze(-2) - x2.unsqueeze(-3)).abs()        # (*, P, R, M), a broadcast
    if p == 0:
        return (d != 0).sum(-1).to(x1.dtype)
    if p == 1:
        return d.sum(-1)
    if p == 2:
        return d.square().sum(-1).sqrt()
    if math.isinf(p):
        return d.amax(-1)
    return d.pow(p).sum(-1).pow(1.0 / p)


def cdist_forward(x1: torch.Tensor, x2: torch.Tensor, p: float,
                  compute_mode: int | None = None) -> torch.Tensor | NotImplementedType:
    if not _supported(x1, x2, p):
        return NotImplemented
    e1, e2 = _broadcast(x1, x2)
    if x1.shape[-1] == 0:   # no features: every distance is 0
        return e1.new_zeros(e1.shape[:-1] + (e2.shape[-2],))
    if _uses_mm(x1, x2, p, compute_mode):
        return aten._euclidean_dist(e1, e2)
    return _direct(e1, e2, float(p))


def _pair_grad(grad, x1, x2, p: float, dist):
    """d dist[i, j] / d x1[i] times grad[i, j], summed over j: eager's formula per p."""
    if p == 0:
        return torch.zeros_like(x1)
    diff = x1.unsqueeze(-2) - x2.unsqueeze(-3)              # (*, P, R, M)
    g = grad.unsqueeze(-1)
    dd = dist.unsqueeze(-1)
    if p == 1:
        term = g * diff.sign()
    elif p == 2:
        term = torch.where(dd == 0, 0, g * diff / dd)
    elif math.isinf(p):
        term = g * diff.sign() * (diff.abs() == dd)
    elif p < 2:
        term = torch.where((dd == 0) | ((diff == 0) & (p < 1)), 0,
                           g * diff.sign() * diff.abs().pow(p - 1) / dd.pow(p - 1))
    else:
        term = torch.where(dd == 0, 0, g * diff * diff.abs().pow(p - 2) / dd.pow(p - 1))
    return term.sum(-2)


def cdist_backward(grad: torch.Tensor, x1: torch.Tensor, x2: torch.Tensor, p: float,
                   dist: torch.Tensor) -> torch.Tensor | NotImplementedType:
    if not _supported(x1, x2, p):
        return NotImplemented
    if x1.shape[-1] == 0 or x1.numel() == 0:
        return torch.zeros_like(x1)
    e1, e2 = _broadcast(x1, x2)
    # the gradient of the expanded x1, summed over the batch dims x1 was broadcast along
    return _pair_grad(grad, e1, e2, float(p), dist).sum_to_size(x1.shape)


def euclidean_dist(x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor | NotImplementedType:
    """eager's matrix-product form: |a|^2 - 2 a.b + |b|^2 (one matrix product), clamped
    at 1e-30 before the square root as eager does."""
    if not _supported(x1, x2, 2):
        return NotImplemented
    x1, x2 = _broadcast(x1, x2)
    n1 = x1.square().sum(-1, keepdim=True)
    n2 = x2.square().sum(-1, keepdim=True)
    prod = torch.matmul(x1, x2.transpose(-1, -2))
    return (n1 - 2 * prod + n2.transpose(-1, -2)).clamp_min(1e-30).sqrt()


def _pair_positions(n: int, device):
    i = torch.arange(n, device=device).unsqueeze(1)
    j = torch.arange(n, device=device).unsqueeze(0)
    lo, hi = torch.minimum(i, j), torch.maximum(i, j)
    pos = lo * n - lo * (lo + 1) // 2 + hi - lo - 1       # pair (lo, hi), lo < hi, in pdist's order
    return i, j, pos


def pdist_forward(x: torch.Tensor, p: float = 2) -> torch.Tensor | NotImplementedType:
    if x.dim() != 2 or p < 0:
        return NotImplemented
    n = x.shape[0]
    k = n * (n - 1) // 2
    if k == 0 or x.shape[1] == 0:   # fewer than two rows: no pair; no features: distances 0
        return x.new_zeros(k)
    full = _direct(x, x, float(p))
    i, j, pos = _pair_positions(n, x.device)
    dest = torch.where(j > i, pos, k).reshape(-1)          # lower triangle and diagonal → dropped slot
    return x.new_zeros(k + 1).index_put((dest,), full.reshape(-1))[:k]


def pdist_backward(grad: torch.Tensor, x: torch.Tensor, p: float,
                   pdist: torch.Tensor) -> torch.Tensor | NotImplementedType:
    if x.dim() != 2 or p < 0:
        return NotImplemented
    if x.shape[0] < 2 or x.shape[1] == 0:
        return torch.zeros_like(x)
    n = x.shape[0]
    i, j, pos = _pair_positions(n, x.device)
    off = i != j
    safe = torch.where(off, pos, 0)
    g = torch.where(off, grad[safe], 0)                     # symmetric: each pair's gradient in both rows
    d = torch.where(off, pdist[safe], 0)
    return _pair_grad(g, x, x, float(p), d)


DECLINED: dict[object, str] = {
    op: "cdist/pdist: a negative p, or operands of fewer than 2 dims (eager rejects both), have no stitched form"
    for op in (aten._cdist_forward.default, aten._cdist_backward.default, aten._euclidean_dist.default,
               aten._pdist_forward.default, aten._pdist_backward.default)
}


def table() -> dict:
    return {
        aten._cdist_forward.default: cdist_forward,
        aten._cdist_backward.default: cdist_backward,
        aten._euclidean_dist.default: euclidean_dist,
        aten._pdist_forward.default: pdist_forward,
        aten._pdist_backward.default: pdist_backward,
    }
