"""Fractional max-pooling (`nn.FractionalMaxPool2d/3d`) as gathers and a running maximum.

The op takes its pseudo-random window starts from `random_samples` (one number in [0, 1)
per batch, channel and spatial axis; `F.fractional_max_pool2d` draws them): along an
axis of `n` inputs, `o` outputs and windows of `k`, output i < o - 1 starts at
trunc((i + u) * alpha) - trunc(u * alpha) with alpha = (n - k) / (o - 1), the last at
n - k.  Eager computes this in the input's floating type on the CPU (a half type rounding
after each operation) and in float32 for half types on CUDA (its accumulate type); it is
computed here with the same roundings, so the starts are eager's exactly (tested on the
CPU in every dtype; CUDA by `tests/test_gpu.py`).  Each window is then read by k^d gathers in eager's scan order (time,
height, width; width innermost) and reduced with eager's rule: a value replaces the
maximum when it is greater or NaN (the last NaN wins), the index being the flat
position inside the channel's plane.  The backward scatter-adds the output gradient at
those indices (windows may share a maximum).  Before this module both ran eagerly with
"no lowering rule"."""
from __future__ import annotations

import itertools
from typing import Sequence

import numpy as np
import torch

aten = torch.ops.aten

# which entry of a (batch, channel) row of random_samples drives each spatial axis, in
# the axes' order: eager's 2-d kernel reads [width, height], its 3-d one [time, height, width]
_SAMPLE_OF_AXIS = {2: (1, 0), 3: (0, 1, 2)}


def _round_half(v: float, dtype: torch.dtype) -> float:
    """A float32 number rounded to float16 or bfloat16, to nearest even (host arithmetic:
    a tensor made here would be a constant of the traced graph)."""
    if dtype == torch.float16:
        return float(np.float16(v))
    bits = int(np.array(v, dtype=np.float32).view(np.uint32))
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000   # (finite positive values only here)
    return float(np.array(bits, dtype=np.uint32).view(np.float32))


def _starts(u: torch.Tensor, n: int, o: int, k: int, half: torch.dtype | None) -> torch.Tensor:
    """Window starts along one axis: (batch, channel, o) int64 from samples (batch,
    channel) in float32 or float64; `half`: round to that type after each operation."""
    last = torch.full((*u.shape, 1), n - k, dtype=torch.int64, device=u.device)
    if o == 1:
        return last
    np_t = np.float64 if u.dtype == torch.float64 else np.float32
    alpha = float(np_t(n - k) / np_t(o - 1))   # (exact as a Python float: it scales a float32 tensor exactly)

    def rounded(t: torch.Tensor) -> torch.Tensor:
        # (a cast out of a half type rounds in our kernels as eager's stored value is rounded)
        return t if half is None else t.to(half).to(u.dtype)

    if half is not None:
        alpha = _round_half(alpha, half)
    i = torch.arange(o - 1, dtype=u.dtype, device=u.device)
    u = u.unsqueeze(-1)
    s = rounded(rounded(i + u) * alpha).to(torch.int64) - rounded(u * alpha).to(torch.int64)
    return torch.cat([s, last.expand(*u.shape[:-1], 1)], -1)


def _fractional_max_pool(x: torch.Tensor, kernel: Sequence[int], output_size: Sequence[int],
                         samples: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    nd = len(kernel)
    batched = x.dim() == nd + 2
    xb = x if batched else x.unsqueeze(0)
    nb, c = xb.shape[0], xb.shape[1]
    sizes = tuple(xb.shape[2:])
    comp = torch.float64 if x.dtype == torch.float64 else torch.float32
    half = x.dtype if x.dtype in (torch.float16, torch.bfloat16) and x.device.type == "cpu" else None
    u = samples.to(comp).reshape(-1, c, nd).expand(nb, c, nd)
    plane = [1] * nd   # element strides of the spatial axes inside one channel's plane
    for a in range(nd - 2, -1, -1):
        plane[a] = plane[a + 1] * sizes[a + 1]
    # each axis's start positions, shaped to broadcast over the output's spatial axes
    starts = []
    for a in range(nd):
        s = _starts(u[:, :, _SAMPLE_OF_AXIS[nd][a]], sizes[a], output_size[a], kernel[a], half)
        starts.append(s.reshape(nb, c, *[output_size[a] if b == a else 1 for b in range(nd)]))
    flat = xb.reshape(nb, c, -1)
    out_shape = (nb, c, *output_size)
    best = idx = None
    for offsets in itertools.product(*(range(k) for k in kernel)):   # eager's scan order
        pos = sum((starts[a] + offsets[a]) * plane[a] for a in range(nd)).expand(out_shape)
        v = flat.gather(-1, pos.reshape(nb, c, -1)).reshape(out_shape)
        if best is None:   # (eager starts at -inf: the first value replaces it unless it is -inf too)
            best, idx = v, pos
            continue
        take = (v > best) | v.isnan()
        best, idx = torch.where(take, v, best), torch.where(take, pos, idx)
    if not batched:
        best, idx = best.squeeze(0), idx.squeeze(0)
    return best, idx


def fractional_max_pool2d(x: torch.Tensor, kernel_size: Sequence[int], output_size: Sequence[int],
                          random_samples: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return _fractional_max_pool(x, kernel_size, output_size, random_samples)


def fractional_max_pool3d(x: torch.Tensor, kernel_size: Sequence[int], output_size: Sequence[int],
                          random_samples: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return _fractional_max_pool(x, kernel_size, output_size, random_samples)


def _backward(grad: torch.Tensor, x: torch.Tensor, nd: int, indices: torch.Tensor) -> torch.Tensor:
    lead = x.shape[:-nd]
    g = grad.reshape(*lead, -1)
    out = torch.zeros(*lead, x.shape[-nd:].numel(), dtype=grad.dtype, device=grad.device)
    return out.scatter_add(-1, indices.reshape(*lead, -1), g).reshape(x.shape)


def fractional_max_pool2d_backward(grad: torch.Tensor, x: torch.Tensor, kernel_size: Sequence[int],
                                   output_size: Sequence[int], indices: torch.Tensor) -> torch.Tensor:
    return _backward(grad, x, 2, indices)


def fractional_max_pool3d_backward(grad: torch.Tensor, x: torch.Tensor, kernel_size: Sequence[int],
                                   output_size: Sequence[int], indices: torch.Tensor) -> torch.Tensor:
    return _backward(grad, x, 3, indices)


def table() -> dict:
    return {
        aten.fractional_max_pool2d.default: fractional_max_pool2d,
        aten.fractional_max_pool3d.default: fractional_max_pool3d,
        aten.fractional_max_pool2d_backward.default: fractional_max_pool2d_backward,
        aten.fractional_max_pool3d_backward.default: fractional_max_pool3d_backward,
    }
