"""Fake quantisation (quantisation-aware training: `torch.ao.quantization.FakeQuantize`,
`torch.fake_quantize_per_tensor_affine`, `..._per_channel_affine`) as point-wise ops.
Each ran eagerly with "no lowering rule".

Eager's kernels (per tensor and per channel alike), in float32 for float32 and half
inputs (a half value times the float inverse scale is a float product):
    inv = 1.0f / scale               (scale rounded to float first)
    q = zero_point + nearbyint(x * inv)          (round half to even)
    out = (clamp(q, quant_min, quant_max) - zero_point) * scale
    mask = quant_min <= q <= quant_max           (the gradient passes where true)
The backward (grad * mask) is torch's own.  The tensor-qparams form (FakeQuantize's) reads
the scale, zero point and an on/off flag from tensors; off, the output is the input and
the mask all true."""
from __future__ import annotations

import numpy as np
import torch

aten = torch.ops.aten

_HALF = (torch.float16, torch.bfloat16)


def _quantize(x: torch.Tensor, scale, inv, zero_point, quant_min: int, quant_max: int
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """`scale`, `inv`, `zero_point`: floats, or float32 tensors broadcast against x."""
    comp = x.float() if x.dtype in _HALF else x
    q = torch.round(comp * inv) + zero_point
    out = (q.clamp(quant_min, quant_max) - zero_point) * scale
    return out.to(x.dtype), (q >= quant_min) & (q <= quant_max)


def per_tensor(x: torch.Tensor, scale: float, zero_point: int, quant_min: int, quant_max: int
               ) -> tuple[torch.Tensor, torch.Tensor]:
    sc = np.float32(scale)
    # (float32 numbers, exact as the Python floats that scale the float32 tensors)
    return _quantize(x, float(sc), float(np.float32(1.0) / sc), zero_point, quant_min, quant_max)


def per_tensor_tensor_qparams(x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor,
                              enabled: torch.Tensor, quant_min: int, quant_max: int
                              ) -> tuple[torch.Tensor, torch.Tensor]:
    sc = scale.reshape(()).float()
    zp = zero_point.reshape(()).to(torch.int64).float()   # (eager: zero_point.item().toInt())
    out, mask = _quantize(x, sc, 1.0 / sc, zp, quant_min, quant_max)
    on = enabled.reshape(()) != 0
    return torch.where(on, out, x), mask | ~on


def per_channel(x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor, axis: int, quant_min: int,
                quant_max: int) -> tuple[torch.Tensor, torch.Tensor]:
    if zero_point.is_floating_point():   # (another rounding rule in eager's kernel: not taken over)
        return NotImplemented
    axis %= x.dim()
    shape = [x.shape[axis] if d == axis else 1 for d in range(x.dim())]
    sc = scale.float().reshape(shape)
    return _quantize(x, sc, 1.0 / sc, zero_point.reshape(shape).float(), quant_min, quant_max)


DECLINED = {aten.fake_quantize_per_channel_affine_cachemask.default:
            "fake quantisation with floating-point zero points has no stitched form"}


def table() -> dict:
    return {aten.fake_quantize_per_tensor_affine_cachemask.default: per_tensor,
            aten._fake_quantize_per_tensor_affine_cachemask_tensor_qparams.default: per_tensor_tensor_qparams,
            aten.fake_quantize_per_channel_affine_cachemask.default: per_channel}
