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


# Learnable fake quantisation (LSQ: `torch.ao.quantization._LearnableFakeQuantize`): the scale
# and zero point are float tensors that get gradients.  Eager's forward reads them on the
# host (`.item()`, a device synchronisation a step); here they stay on the device.
#   forward:  per tensor, zero point nearbyint(zp[0]) clamped to the range, then the fixed
#             form; per channel, zp.round().clamp(quant_min, quant_max) as integers
#   backward (float32, as eager requires): with zp the backward's zero point (per tensor
#   trunc(clamp(zp[0] + 0.5)), per channel zp.round().clamp()), inv = 1.0f / scale and
#   gf = float(grad_factor), each element in eager's order of operations:
#     q   = nearbyint(zp + x * inv)      (CPU; CUDA's kernel adds zp after rounding)
#     dx  = dy * (quant_min <= q <= quant_max)
#     in range:  dscale = dy * (xfq - x) * inv * gf, xfq = (q - zp) * scale;  dzp = 0
#     below/above: dscale = dy * (quant_min or quant_max - zp) * gf;  dzp = dy * -1 * scale * gf
#   dscale and dzp summed over all (per channel: all but the channel axis) elements.


def _learnable_grads(dy, x, scale, inv, zp, quant_min: int, quant_max: int, grad_factor: float):
    gf = float(np.float32(grad_factor))
    q = torch.round(x * inv) + zp if x.is_cuda else torch.round(zp + x * inv)
    inside = (q >= quant_min) & (q <= quant_max)
    dx = dy * inside
    xfq = (q.clamp(quant_min, quant_max) - zp) * scale
    d_in = dy * (xfq - x) * inv * gf
    d_out = torch.where(q < quant_min, dy * (quant_min - zp), dy * (quant_max - zp)) * gf
    dscale = torch.where(inside, d_in, d_out)
    dzp = torch.where(inside, torch.zeros_like(dy), dy * -1.0 * scale * gf)
    return dx, dscale, dzp


def learnable_per_tensor(x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor, quant_min: int,
                         quant_max: int, grad_factor: float = 1.0) -> torch.Tensor:
    sc = scale.reshape(-1)[0].float()
    zp = torch.round(zero_point.reshape(-1)[0].float()).clamp(quant_min, quant_max)
    return _quantize(x, sc, 1.0 / sc, zp, quant_min, quant_max)[0]


def learnable_per_tensor_backward(dy: torch.Tensor, x: torch.Tensor, scale: torch.Tensor,
                                  zero_point: torch.Tensor, quant_min: int, quant_max: int,
                                  grad_factor: float = 1.0):
    if not all(t.dtype == torch.float32 for t in (dy, x, scale, zero_point)) or x.numel() == 0:
        return NotImplemented   # (eager refuses other types; an empty x returns its inputs)
    sc = scale.reshape(-1)[0]
    zp = torch.trunc((zero_point.reshape(-1)[0] + 0.5).clamp(quant_min, quant_max))
    dx, dscale, dzp = _learnable_grads(dy, x, sc, 1.0 / sc, zp, quant_min, quant_max, grad_factor)
    return dx, dscale.sum().reshape(1), dzp.sum().reshape(1)


def learnable_per_channel(x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor, axis: int,
                          quant_min: int, quant_max: int, grad_factor: float = 1.0) -> torch.Tensor:
    zp = zero_point.round().clamp(quant_min, quant_max).to(torch.int32)
    return per_channel(x, scale, zp, axis, quant_min, quant_max)[0]


def learnable_per_channel_backward(dy: torch.Tensor, x: torch.Tensor, scale: torch.Tensor,
                                   zero_point: torch.Tensor, axis: int, quant_min: int, quant_max: int,
                                   grad_factor: float = 1.0):
    if not all(t.dtype == torch.float32 for t in (dy, x, scale, zero_point)) or x.numel() == 0:
        return NotImplemented   # (bfloat16: eager returns float32 gradients, kept eager)
    axis %= x.dim()
    shape = [x.shape[axis] if d == axis else 1 for d in range(x.dim())]
    sc = scale.reshape(shape)
    zp = zero_point.round().clamp(quant_min, quant_max).reshape(shape)
    dx, dscale, dzp = _learnable_grads(dy, x, sc, 1.0 / sc, zp, quant_min, quant_max, grad_factor)
    others = [d for d in range(x.dim()) if d != axis]
    return dx, dscale.sum(others) if others else dscale, dzp.sum(others) if others else dzp


DECLINED = {aten.fake_quantize_per_channel_affine_cachemask.default:
            "fake quantisation with floating-point zero points has no stitched form",
            aten._fake_quantize_learnable_per_tensor_affine_backward.default:
            "learnable fake quantisation's backward takes float32 alone (eager's own check)",
            aten._fake_quantize_learnable_per_channel_affine_backward.default:
            "learnable fake quantisation's backward in a type other than float32 (eager returns float32 gradients)"}


def table() -> dict:
    return {aten.fake_quantize_per_tensor_affine_cachemask.default: per_tensor,
            aten._fake_quantize_per_tensor_affine_cachemask_tensor_qparams.default: per_tensor_tensor_qparams,
            aten.fake_quantize_per_channel_affine_cachemask.default: per_channel,
            aten._fake_quantize_learnable_per_tensor_affine.default: learnable_per_tensor,
            aten._fake_quantize_learnable_per_tensor_affine_backward.default: learnable_per_tensor_backward,
            aten._fake_quantize_learnable_per_channel_affine.default: learnable_per_channel,
            aten._fake_quantize_learnable_per_channel_affine_backward.default: learnable_per_channel_backward}
