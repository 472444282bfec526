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
Bicubic stays eager with its reason (`DECLINED`).
"""
from __future__ import annotations

import torch

aten = torch.ops.aten

_BILINEAR, _NEAREST = 0, 1
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


def _batch_index(inp, grid):
    n = inp.shape[0]
    return torch.arange(n, device=inp.device).view((n,) + (1,) * (grid.dim() - 2))


def grid_sampler_3d(inp, grid, interpolation_mode, padding_mode, align_corners):
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


def grid_sampler_backward(grad, inp, grid, interpolation_mode, padding_mode, align_corners, output_mask):
    """grid_sampler_2d_backward and grid_sampler_3d_backward."""
    if (interpolation_mode not in (_BILINEAR, _NEAREST) or inp.dim() not in (4, 5) or inp.numel() == 0
            or grid.numel() == 0):
        return NotImplemented
    sizes, coords, mults = _sources(inp, grid, padding_mode, align_corners)
    n_idx = _batch_index(inp, grid)
    g = grad.movedim(1, -1)                                   # (N, *out, C)
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
    aten.grid_sampler_2d_backward.default: "grid_sample backward: bicubic interpolation has no stitched form",
    aten.grid_sampler_3d.default: "grid_sample 3-d of an empty input has no stitched form",
    aten.grid_sampler_3d_backward.default: "grid_sample 3-d of an empty input has no stitched form",
}


def table() -> dict:
    return {aten.grid_sampler_2d_backward.default: grid_sampler_backward,
            aten.grid_sampler_3d.default: grid_sampler_3d,
            aten.grid_sampler_3d_backward.default: grid_sampler_backward}
