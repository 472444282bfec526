"""`grid_sample` (issue 18/19): the 2-d forward through torch's decomposition (gathers of
the four corners, or the nearest pixel, and their weights); the 3-d forward (eight
corners: trilinear) and both backwards here, eager's formulas written with gathers
and the scatter-add form, so a spatial-transformer training step stitches end to end.

grid_sampler_{2,3}d_backward(grad, input, grid, mode, padding, align_corners, mask):
- each output position (n, h, w) maps to a source point (ix, iy): the grid coordinate
  unnormalised to pixels, then clipped (`border`) or reflected and clipped
  (`reflection`); each step's derivative (0 where the clip is active, -1 where a
  reflection flips) multiplies the grid gradient, as in eager;
- bilinear (trilinear in 3-d): the 2^k corners' weights times the output gradient are added into the
  input gradient (corners outside the image dropped); the grid gradient is the
  weights' derivatives times the corner values, summed over channels;
- nearest: the output gradient is added at the nearest pixel (half to even, as eager
  rounds); the grid gradient is zero.
- bicubic (2-d): the 4x4 taps around floor(point) - 1 with eager's cubic-convolution
  coefficients (A = -0.75); the padding mode maps each integer tap (clip or reflect), not
  the point, so the grid gradient is the coefficients' derivatives times the tap values,
  scaled only by the unnormalisation.
"""
from __future__ import annotations

from types import NotImplementedType
from typing import Sequence

import torch

aten = torch.ops.aten

_BILINEAR, _NEAREST, _BICUBIC = 0, 1, 2
_ZEROS, _BORDER, _REFLECTION = 0, 1, 2


def _clip(c, size: int):
    """Clamp to [0, size - 1]; the derivative is 0 where the clamp bites."""
    mult = ((c >= 0) & (c <= size - 1)).to(c.dtype)
    return c.clamp(0, size - 1), mult


def _reflect(c, twice_low: int, twice_high: int):
    """Reflect into [low, high] (eager's reflect_coordinates_set_grad)."""
    if twice_low == twice_high:
        return torch.zeros_like(c), torch.zeros_like(c)
    low = twice_low / 2
    span = (twice_high - twice_low) / 2
    c = c - low
    sign = torch.where(c < 0, -1.0, 1.0).to(c.dtype)
    c = c.abs()
    extra = torch.fmod(c, span)
    flips = torch.floor(c / span)
    even = torch.remainder(flips, 2) == 0
    return torch.where(even, extra + low, span - extra + low), torch.where(even, sign, -sign)


def _source(coord, size: int, padding: int, align: bool):
    """Pixel coordinate of a grid coordinate and d(pixel)/d(grid coordinate)."""
    if align:
        c, scale = (coord + 1) / 2 * (size - 1), (size - 1) / 2
    else:
        c, scale = ((coord + 1) * size - 1) / 2, size / 2
    mult = torch.full_like(c, scale)
    if padding == _BORDER:
        c, m = _clip(c, size)
        mult = mult * m
    elif padding == _REFLECTION:
        c, m1 = _reflect(c, 0, 2 * (size - 1)) if align else _reflect(c, -1, 2 * size - 1)
        c, m2 = _clip(c, size)
        mult = mult * m1 * m2
    return c, mult


def _inside(pos, sizes):
    """Whether integer positions (one tensor per spatial axis) lie inside the image."""
    ok = None
    for p, n in zip(pos, sizes):
        here = (p >= 0) & (p < n)
        ok = here if ok is None else ok & here
    return ok


def _at(img, n_idx, pos, sizes):
    """img[n, :, *pos] for integer corner positions (each (N, *out)) → (N, *out, C),
    zero where the corner lies outside the image."""
    vals = img[(n_idx, slice(None)) + tuple(p.clamp(0, n - 1) for p, n in zip(pos, sizes))]
    return torch.where(_inside(pos, sizes).unsqueeze(-1), vals, 0)


def _add_at(acc, n_idx, pos, vals, sizes):
    """acc[n, *pos, :] += vals where pos lies inside (acc is (N, *sizes, C))."""
    vals = torch.where(_inside(pos, sizes).unsqueeze(-1), vals, 0)
    return acc.index_put((n_idx,) + tuple(p.clamp(0, n - 1) for p, n in zip(pos, sizes)), vals, accumulate=True)


def _sources(inp, grid, padding_mode, align_corners):
    """Per spatial axis (depth, height, width order) the pixel coordinate and its
    derivative; the grid's last dim lists them the other way round (x = width first)."""
    sizes = tuple(inp.shape[2:])
    k = len(sizes)
    coords, mults = [], []
    for axis in range(k):
        c, m = _source(grid[..., k - 1 - axis], sizes[axis], padding_mode, align_corners)
        coords.append(c)
        mults.append(m)
    return sizes, coords, mults


def _product(factors):
    out = factors[0]
    for f in factors[1:]:
        out = out * f
    return out


def _corners(coords):
    """The 2^k corners around each point: (integer positions, weight, d weight / d coord
    per axis) — a corner's weight is the product of f or 1 - f along every axis."""
    lows = [torch.floor(c) for c in coords]
    fracs = [c - lo for c, lo in zip(coords, lows)]
    lows = [lo.to(torch.int64) for lo in lows]
    k = len(coords)
    out = []
    for bits in range(1 << k):
        up = [(bits >> (k - 1 - a)) & 1 for a in range(k)]
        factors = [f if u else 1 - f for f, u in zip(fracs, up)]
        derivs = []
        for a in range(k):
            others = [f for b, f in enumerate(factors) if b != a]
            sign = 1.0 if up[a] else -1.0
            derivs.append(sign * _product(others) if others else torch.full_like(fracs[a], sign))
        out.append(([lo + u for lo, u in zip(lows, up)], _product(factors), derivs))
    return out


_CUBIC_A = -0.75


def _cubic_weights(t):
    """eager's cubic-convolution coefficients of the four taps at offsets -1, 0, 1, 2
    from floor(point), for the fraction t, and their derivatives d/dt."""
    a = _CUBIC_A

    def near(x):        # |x| <= 1
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def near_d(x):
        return (3 * (a + 2) * x - 2 * (a + 3)) * x

    def far(x):         # 1 < |x| < 2
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    def far_d(x):
        return (3 * a * x - 10 * a) * x + 8 * a

    weights = [far(t + 1), near(t), near(1 - t), far(2 - t)]
    derivs = [far_d(t + 1), near_d(t), -near_d(1 - t), -far_d(2 - t)]
    return weights, derivs


def _tap(c, size: int, padding: int, align: bool):
    """An integer tap position under the padding mode (eager's compute_coordinates)."""
    if padding == _BORDER:
        c = c.clamp(0, size - 1)
    elif padding == _REFLECTION:
        c = _reflect(c, 0, 2 * (size - 1))[0] if align else _reflect(c, -1, 2 * size - 1)[0]
        c = c.clamp(0, size - 1)
    return c.to(torch.int64)


def _bicubic_backward(g, inp, grid, padding_mode, align_corners, output_mask, n_idx):
    sizes = tuple(inp.shape[2:])
    points, scales = [], []
    for axis in range(2):                     # height, width; the grid lists x (width) first
        p, m = _source(grid[..., 1 - axis], sizes[axis], _ZEROS, align_corners)
        points.append(p)
        scales.append(m)
    lows = [torch.floor(p) for p in points]
    coef = [_cubic_weights(p - lo) for p, lo in zip(points, lows)]
    acc = torch.zeros((inp.shape[0],) + sizes + (inp.shape[1],), dtype=g.dtype, device=g.device)
    d_h = d_w = 0
    for i in range(4):                        # height taps
        row = _tap(lows[0] + (i - 1), sizes[0], padding_mode, align_corners)
        for j in range(4):                    # width taps
            col = _tap(lows[1] + (j - 1), sizes[1], padding_mode, align_corners)
            pos = [row, col]
            if output_mask[0]:
                w = (coef[0][0][i] * coef[1][0][j]).unsqueeze(-1).to(g.dtype)
                acc = _add_at(acc, n_idx, pos, g * w, sizes)
            if output_mask[1]:
                sc = (_at(inp, n_idx, pos, sizes) * g).sum(-1).to(grid.dtype)
                d_h = d_h + coef[0][1][i] * coef[1][0][j] * sc
                d_w = d_w + coef[0][0][i] * coef[1][1][j] * sc
    grad_input = acc.movedim(-1, 1) if output_mask[0] else None
    grad_grid = torch.stack([d_w * scales[1], d_h * scales[0]], -1) if output_mask[1] else None
    return grad_input, grad_grid


def _batch_index(inp, grid):
    n = inp.shape[0]
    return torch.arange(n, device=inp.device).view((n,) + (1,) * (grid.dim() - 2))


def grid_sampler_3d(inp: torch.Tensor, grid: torch.Tensor, interpolation_mode: int, padding_mode: int,
                    align_corners: bool) -> torch.Tensor | NotImplementedType:
    """Volumetric grid_sample (torch has no decomposition): the eight corners gathered
    and weighted (trilinear), or the nearest voxel."""
    if interpolation_mode not in (_BILINEAR, _NEAREST) or inp.dim() != 5 or inp.numel() == 0:
        return NotImplemented
    sizes, coords, _ = _sources(inp, grid, padding_mode, align_corners)
    n_idx = _batch_index(inp, grid)
    if interpolation_mode == _NEAREST:
        out = _at(inp, n_idx, [torch.round(c).to(torch.int64) for c in coords], sizes)
    else:
        out = None
        for pos, weight, _ in _corners(coords):
            term = _at(inp, n_idx, pos, sizes) * weight.unsqueeze(-1).to(inp.dtype)
            out = term if out is None else out + term
    return out.movedim(-1, 1)


def grid_sampler_backward(grad: torch.Tensor, inp: torch.Tensor, grid: torch.Tensor, interpolation_mode: int,
                          padding_mode: int, align_corners: bool, output_mask: Sequence[bool]
                          ) -> tuple[torch.Tensor | None, torch.Tensor | None] | NotImplementedType:
    """grid_sampler_2d_backward and grid_sampler_3d_backward."""
    if (interpolation_mode not in (_BILINEAR, _NEAREST, _BICUBIC) or inp.dim() not in (4, 5)
            or inp.numel() == 0 or grid.numel() == 0):
        return NotImplemented
    n_idx = _batch_index(inp, grid)
    g = grad.movedim(1, -1)                                   # (N, *out, C)
    if interpolation_mode == _BICUBIC:
        if inp.dim() != 4:
            return NotImplemented
        return _bicubic_backward(g, inp, grid, padding_mode, align_corners, output_mask, n_idx)
    sizes, coords, mults = _sources(inp, grid, padding_mode, align_corners)
    acc = torch.zeros((inp.shape[0],) + sizes + (inp.shape[1],), dtype=grad.dtype, device=grad.device)
    if interpolation_mode == _NEAREST:
        pos = [torch.round(c).to(torch.int64) for c in coords]
        grad_input = _add_at(acc, n_idx, pos, g, sizes).movedim(-1, 1) if output_mask[0] else None
        return grad_input, torch.zeros_like(grid) if output_mask[1] else None
    # (one scatter-add and one gather per corner: stacking the corners into one of each
    # planned more kernels, bench/NOTES.md)
    dgrid = [0] * len(sizes)
    for pos, weight, derivs in _corners(coords):
        if output_mask[0]:
            acc = _add_at(acc, n_idx, pos, g * weight.unsqueeze(-1).to(g.dtype), sizes)
        if output_mask[1]:
            sc = (_at(inp, n_idx, pos, sizes) * g).sum(-1).to(grid.dtype)   # Σ_c value · grad
            dgrid = [acc_d + d * sc for acc_d, d in zip(dgrid, derivs)]
    grad_input = acc.movedim(-1, 1) if output_mask[0] else None
    grad_grid = None
    if output_mask[1]:  # the grid's last dim: x (width) first
        grad_grid = torch.stack([dgrid[a] * mults[a] for a in reversed(range(len(sizes)))], -1)
    return grad_input, grad_grid


DECLINED: dict[object, str] = {
    aten.grid_sampler_2d_backward.default: "grid_sample backward of an empty input or grid has no stitched form",
    aten.grid_sampler_3d.default: "grid_sample 3-d of an empty input has no stitched form",
    aten.grid_sampler_3d_backward.default: "grid_sample 3-d of an empty input has no stitched form",
}


def table() -> dict:
    return {aten.grid_sampler_2d_backward.default: grid_sampler_backward,
            aten.grid_sampler_3d.default: grid_sampler_3d,
            aten.grid_sampler_3d_backward.default: grid_sampler_backward}
