"""A Triton GEMM with a stitched epilogue: y = epilogue(x @ wᵀ).

    z = x @ wᵀ (+ bias)              fp32 accumulator, tiles of BM x BN, loop over K
    a = act(z)                       none | relu | gelu | gelu_tanh | silu
    a = a * mul                      (SwiGLU's silu(x W1ᵀ) * (x W3ᵀ): mul is the other product)
    y = (a + residual).to(out_dtype)

All of it happens on the accumulator tile in registers: the activation input never
goes to memory unless autograd needs it (`save_pre`: z is written as a second output
for the backward, which computes act'(z) with ordinary torch ops that our pipeline
stitches).  `stitchml::linear_epilogue` is a torch.library custom op with an autograd
formula, so AOTAutograd sees one library call in the forward graph.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Optional

import torch
import triton
import triton.language as tl

Tensor = torch.Tensor
ACTIVATIONS = ("none", "relu", "gelu", "gelu_tanh", "silu")
_ACT_CODE = {a: i for i, a in enumerate(ACTIVATIONS)}


@dataclass(frozen=True)
class TileConfig:
    """One launch configuration of the template: output tile BM x BN, K step BK,
    warps, and the software pipeline's depth (K steps in flight through shared memory)."""

    bm: int
    bn: int
    bk: int
    warps: int
    stages: int

    @property
    def name(self) -> str:
        return f"{self.bm}x{self.bn}x{self.bk}/w{self.warps}/s{self.stages}"


# The candidates `stitchml calibrate` times on the device (the fastest becomes the
# device's configuration: `Device.triton_gemm_config`); each compiles for sm_90 with
# every epilogue input and no spill (`patterns/aot.py`, unit strides specialised as the
# JIT does at a launch; bf16: 57 / 190 / 96 / 96 registers). Without a calibration the
# first. Untuned beyond that: no grouped tile order, no persistent or warp-specialised
# form.
CONFIGS = (TileConfig(64, 64, 32, 8, 3), TileConfig(128, 128, 64, 8, 3), TileConfig(64, 64, 64, 4, 4),
           TileConfig(128, 64, 64, 8, 3))
DEFAULT = CONFIGS[0]


def config_named(name: str) -> TileConfig:
    """The candidate called `name` (`TileConfig.name`); ValueError for another."""
    for c in CONFIGS:
        if c.name == name:
            return c
    raise ValueError(f"no GEMM tile configuration {name!r}: the candidates are {[c.name for c in CONFIGS]}")


def cuda_config() -> TileConfig:
    """What the template launches with on a GPU: the device calibration's fastest
    candidate, else `DEFAULT`."""
    from ..plan.devices import current_device
    name = current_device().triton_gemm_config
    try:
        return config_named(name) if name else DEFAULT
    except ValueError:   # a calibration from a version with other candidates
        return DEFAULT


@triton.jit
def _gemm_epilogue_kernel(x_ptr, w_ptr, b_ptr, r_ptr, m_ptr, y_ptr, z_ptr, M, N, K,
                          sxm, sxk, swn, swk, srm, srn, smm, smn,
                          ACT: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, HAS_MUL: tl.constexpr,
                          SAVE_PRE: tl.constexpr, UPCAST: tl.constexpr,
                          BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    mm_ = rm < M
    nn_ = rn < N
    acc = tl.zeros([BM, BN], tl.float32)
    for k0 in range(0, K, BK):
        kk = k0 + rk
        a = tl.load(x_ptr + rm[:, None].to(tl.int64) * sxm + kk[None, :] * sxk,
                    mask=mm_[:, None] & (kk[None, :] < K), other=0.0)
        b = tl.load(w_ptr + rn[None, :].to(tl.int64) * swn + kk[:, None] * swk,
                    mask=nn_[None, :] & (kk[:, None] < K), other=0.0)
        if UPCAST:  # the interpreter's dot is wrong for bf16: multiply in fp32 there
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc += tl.dot(a, b, out_dtype=tl.float32)
    if HAS_BIAS:
        acc += tl.load(b_ptr + rn, mask=nn_, other=0.0).to(tl.float32)[None, :]
    mask = mm_[:, None] & nn_[None, :]
    if SAVE_PRE:
        tl.store(z_ptr + rm[:, None].to(tl.int64) * N + rn[None, :], acc.to(z_ptr.dtype.element_ty), mask=mask)
    out = acc
    if ACT == 1:
        out = tl.maximum(out, 0.0)
    elif ACT == 2:
        out = 0.5 * out * (1.0 + tl.erf(out * 0.7071067811865476))
    elif ACT == 3:
        inner = 0.7978845608028654 * (out + 0.044715 * out * out * out)
        out = 0.5 * out * (2.0 - 2.0 / (tl.exp(2.0 * inner) + 1.0))   # 1 + tanh(inner), overflow-safe
    elif ACT == 4:
        out = out / (1.0 + tl.exp(-out))
    if HAS_MUL:
        out = out * tl.load(m_ptr + rm[:, None].to(tl.int64) * smm + rn[None, :] * smn, mask=mask,
                            other=0.0).to(tl.float32)
    if HAS_RES:
        out = out + tl.load(r_ptr + rm[:, None].to(tl.int64) * srm + rn[None, :] * srn, mask=mask,
                            other=0.0).to(tl.float32)
    tl.store(y_ptr + rm[:, None].to(tl.int64) * N + rn[None, :], out.to(y_ptr.dtype.element_ty), mask=mask)


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0") and \
        type(tl.sigmoid).__name__ == "InterpretedFunction"


def activation(z: Tensor, act: str) -> Tensor:
    if act == "relu":
        return torch.relu(z)
    if act == "gelu":
        return torch.nn.functional.gelu(z)
    if act == "gelu_tanh":
        return torch.nn.functional.gelu(z, approximate="tanh")
    if act == "silu":
        return torch.nn.functional.silu(z)
    return z


def activation_grad(z: Tensor, act: str) -> Tensor:
    """d act / d z, in torch ops (the backward graph stitches them)."""
    if act == "relu":
        return (z > 0).to(z.dtype)
    if act == "gelu":
        return 0.5 * (1 + torch.erf(z * (1 / math.sqrt(2)))) + z * torch.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)
    if act == "gelu_tanh":
        c = math.sqrt(2 / math.pi)
        t = torch.tanh(c * (z + 0.044715 * z ** 3))
        return 0.5 * (1 + t) + 0.5 * z * (1 - t * t) * c * (1 + 3 * 0.044715 * z * z)
    if act == "silu":
        s = torch.sigmoid(z)
        return s * (1 + z * (1 - s))
    return torch.ones_like(z)


def _reference(x, w, bias, residual, mul, act, out_dtype, save_pre):
    """The same math in torch (CPU without the interpreter), fp32 throughout."""
    z = x.float() @ w.float().t()
    if bias is not None:
        z = z + bias.float()
    out = activation(z, act)
    if mul is not None:
        out = out * mul.float()
    if residual is not None:
        out = out + residual.float()
    return out.to(out_dtype), (z.to(x.dtype) if save_pre else x.new_empty((0,)))


_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@torch.library.custom_op("stitchml::linear_epilogue", mutates_args=())
def linear_epilogue(x: Tensor, w: Tensor, bias: Optional[Tensor], residual: Optional[Tensor], mul: Optional[Tensor],
                    act: str, out_dtype: str, save_pre: bool) -> tuple[Tensor, Tensor]:
    """(y [M, N] in out_dtype, z = x @ wᵀ + bias [M, N] in x's dtype when save_pre else [0])."""
    dtype = _DTYPES[out_dtype]
    if not x.is_cuda and not _interpreting():
        return _reference(x, w, bias, residual, mul, act, dtype, save_pre)
    return _launch(x, w, bias, residual, mul, act, dtype, save_pre,
                   cuda_config() if x.is_cuda else TileConfig(16, 16, 16, 4, 1))


def _launch(x, w, bias, residual, mul, act: str, dtype: torch.dtype, save_pre: bool, tile: TileConfig):
    """The template on `tile` (calibrate times each candidate through this)."""
    m, k = x.shape
    n = w.shape[0]
    y = torch.empty(m, n, dtype=dtype, device=x.device)
    z = torch.empty(m, n, dtype=x.dtype, device=x.device) if save_pre else x.new_empty((0,))
    r = residual if residual is not None else y
    mu = mul if mul is not None else y
    grid = (triton.cdiv(m, tile.bm), triton.cdiv(n, tile.bn))
    _gemm_epilogue_kernel[grid](
        x, w, bias if bias is not None else y, r, mu, y, z if save_pre else y, m, n, k,
        x.stride(0), x.stride(1), w.stride(0), w.stride(1), r.stride(0), r.stride(1), mu.stride(0), mu.stride(1),
        ACT=_ACT_CODE[act], HAS_BIAS=bias is not None, HAS_RES=residual is not None, HAS_MUL=mul is not None,
        SAVE_PRE=save_pre, UPCAST=not x.is_cuda and x.dtype == torch.bfloat16, BM=tile.bm, BN=tile.bn, BK=tile.bk,
        num_warps=tile.warps, num_stages=tile.stages)
    return y, z


@linear_epilogue.register_fake
def _(x, w, bias, residual, mul, act, out_dtype, save_pre):
    y = x.new_empty((x.shape[0], w.shape[0]), dtype=_DTYPES[out_dtype])
    z = x.new_empty((x.shape[0], w.shape[0])) if save_pre else x.new_empty((0,))
    return y, z


def _setup_context(ctx, inputs, output) -> None:
    x, w, bias, residual, mul, act, _, save_pre = inputs
    z = output[1]
    ctx.act, ctx.has_bias, ctx.has_res, ctx.has_mul = act, bias is not None, residual is not None, mul is not None
    ctx.save_for_backward(x, w, z, mul if mul is not None else None)
    ctx.mark_non_differentiable(z)


def _backward(ctx, grad_y, _grad_z):
    x, w, z, mul = ctx.saved_tensors  # z was saved: save_pre is set whenever an input needs grad
    g = grad_y.float()
    grad_mul = (g * activation(z.float(), ctx.act)).to(mul.dtype) if ctx.has_mul else None
    if ctx.has_mul:
        g = g * mul.float()
    gz = (g * activation_grad(z.float(), ctx.act)).to(x.dtype)
    grad_x = gz @ w
    grad_w = gz.t() @ x
    grad_b = gz.float().sum(0).to(w.dtype) if ctx.has_bias else None
    grad_res = grad_y if ctx.has_res else None
    return grad_x, grad_w, grad_b, grad_res, grad_mul, None, None, None


linear_epilogue.register_autograd(_backward, setup_context=_setup_context)


def fused_linear(x: Tensor, w: Tensor, bias: Optional[Tensor] = None, *, act: str = "none",
                 residual: Optional[Tensor] = None, mul: Optional[Tensor] = None,
                 out_dtype: torch.dtype | None = None) -> Tensor:
    """What the rewrite inserts: x [..., K] @ wᵀ [K, N] with the epilogue, shaped [..., N]."""
    lead = x.shape[:-1]
    n = w.shape[0]
    x2 = x.reshape(-1, x.shape[-1])
    flat = (lambda t: None if t is None else t.reshape(-1, n))
    need = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, w, bias, mul, residual))
    dtype = str(out_dtype or x.dtype).replace("torch.", "")
    y, _ = torch.ops.stitchml.linear_epilogue(x2, w, bias, flat(residual), flat(mul), act, dtype, need)
    return y.reshape(*lead, n)
