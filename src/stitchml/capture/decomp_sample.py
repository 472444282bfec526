"""`grid_sample` (issue 18/19): the forward through torch's decomposition (gathers of the
four corners, or the nearest pixel, and their weights); the backward here, eager's
formulas written with gathers and the scatter-add form, so a spatial-transformer
training step stitches end to end.

grid_sampler_2d_backward(grad, input, grid, mode, padding, align_corners, mask):
- each output position (n, h, w) maps to a source point (ix, iy): the grid coordinate
  unnormalised to pixels, then clipped (`border`) or reflected and clipped
  (`reflection`); each step's derivative (0 where the clip is active, -1 where a
  reflection flips) multiplies the grid gradient, as in eager;
- bilinear: the four corners' weights times the output gradient are added into the
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


def _at(img, n_idx, y, x, h: int, w: int):
    """img[n, :, y, x] for integer corner positions (N, Ho, Wo) → (N, Ho, Wo, C), zero
    where the corner lies outside the image, and that validity."""
    ok = (x >= 0) & (x < w) & (y >= 0) & (y < h)
    vals = img[n_idx, :, y.clamp(0, h - 1), x.clamp(0, w - 1)]
    return torch.where(ok.unsqueeze(-1), vals, 0), ok


def _add_at(acc, n_idx, y, x, ok, vals, h: int, w: int):
    """acc[n, y, x, :] += vals where ok (acc is (N, H, W, C))."""
    vals = torch.where(ok.unsqueeze(-1), vals, 0)
    return acc.index_put((n_idx, y.clamp(0, h - 1), x.clamp(0, w - 1)), vals, accumulate=True)


def grid_sampler_2d_backward(grad, inp, grid, interpolation_mode, padding_mode, align_corners, output_mask):
    if interpolation_mode not in (_BILINEAR, _NEAREST) or inp.dim() != 4 or inp.numel() == 0 or grid.numel() == 0:
        return NotImplemented
    n, ch, h, w = inp.shape
    dt = grid.dtype
    ix, gx = _source(grid[..., 0], w, padding_mode, align_corners)
    iy, gy = _source(grid[..., 1], h, padding_mode, align_corners)
    n_idx = torch.arange(n, device=inp.device).view(n, 1, 1)
    g = grad.permute(0, 2, 3, 1)                               # (N, Ho, Wo, C)
    acc = torch.zeros(n, h, w, ch, dtype=grad.dtype, device=grad.device)
    if interpolation_mode == _NEAREST:
        x, y = torch.round(ix).to(torch.int64), torch.round(iy).to(torch.int64)
        ok = (x >= 0) & (x < w) & (y >= 0) & (y < h)
        grad_input = _add_at(acc, n_idx, y, x, ok, g, h, w).permute(0, 3, 1, 2) if output_mask[0] else None
        return grad_input, torch.zeros_like(grid) if output_mask[1] else None
    x0, y0 = torch.floor(ix), torch.floor(iy)
    x0i, y0i = x0.to(torch.int64), y0.to(torch.int64)
    x1i, y1i = x0i + 1, y0i + 1
    fx, fy = ix - x0, iy - y0                                  # in [0, 1)
    corners = ((y0i, x0i, (1 - fx) * (1 - fy), -(1 - fy), -(1 - fx)),   # nw: weight, d/dix, d/diy
               (y0i, x1i, fx * (1 - fy), (1 - fy), -fx),                # ne
               (y1i, x0i, (1 - fx) * fy, -fy, (1 - fx)),                # sw
               (y1i, x1i, fx * fy, fy, fx))                             # se
    # (one scatter-add and one gather per corner: stacking the four corners into one
    # of each planned more kernels, bench/NOTES.md)
    gix = giy = 0
    for y, x, wt, dx, dy in corners:
        if output_mask[0]:
            ok = (x >= 0) & (x < w) & (y >= 0) & (y < h)
            acc = _add_at(acc, n_idx, y, x, ok, g * wt.unsqueeze(-1).to(g.dtype), h, w)
        if output_mask[1]:
            vals, _ = _at(inp, n_idx, y, x, h, w)
            sc = (vals * g).sum(-1).to(dt)                     # Σ_c value · grad
            gix, giy = gix + dx * sc, giy + dy * sc
    grad_input = acc.permute(0, 3, 1, 2) if output_mask[0] else None
    grad_grid = torch.stack([gix * gx, giy * gy], -1) if output_mask[1] else None
    return grad_input, grad_grid


DECLINED: dict[object, str] = {
    aten.grid_sampler_2d_backward.default: "grid_sample backward: bicubic interpolation has no stitched form",
}


def table() -> dict:
    return {aten.grid_sampler_2d_backward.default: grid_sampler_2d_backward}
