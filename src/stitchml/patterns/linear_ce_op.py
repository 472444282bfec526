"""The fused op behind the chunked linear + cross-entropy rewrite.

`stitchml::linear_cross_entropy(h, w, bias, target, ...)` computes
cross_entropy(softcap(h @ wᵀ + bias), target) without ever holding the logits of
all tokens: tokens go in chunks, and per chunk

    mm (library)  →  one Triton kernel  →  mm for grad_h, mm-accumulate grad_W

The Triton kernel makes one program per token row: an online log-sum-exp pass over
the row (max, sum of exponentials, sum of logits for label smoothing, the target's
logit), the row's loss, then a second sweep that overwrites the chunk's logits with
d loss / d logits.  So the only [tokens, vocab] memory is one chunk's buffer.

Because the gradients are computed in the forward pass, the op returns them as extra
outputs; its autograd formula only scales them by the incoming gradient.  This is
the trade: grad_h and grad_W stay alive between forward and backward (the size of h
and W), instead of the logits (tokens × vocab, usually far larger).
"""
from __future__ import annotations

import os
from typing import Optional

import torch
import triton
import triton.language as tl

from ..codegen.triton_fast import _exp_ftz

Tensor = torch.Tensor
REDUCTIONS = ("mean", "sum")


@triton.jit
def _ce_rows_kernel(z_ptr, z_stride, tgt_ptr, loss_ptr, lse_ptr, count_ptr, V, ignore_index, smooth, softcap,
                    HAS_SOFTCAP: tl.constexpr, WRITE_GRAD: tl.constexpr, HAS_LSE: tl.constexpr,
                    BLOCK: tl.constexpr, HAS_SMOOTH: tl.constexpr = True):
    """One program per row of the chunk's logits z (row stride z_stride, V columns).
    Writes the row's loss and log-sum-exp (fp32), or with HAS_LSE reads the latter
    (the backward's second pass); with WRITE_GRAD, overwrites z with d loss/d z
    (divided by count_ptr's value: the token count for a mean, over the incoming grad).

    Both passes walk the row's whole column blocks unmasked and its last, partial block
    apart: a mask `cols < V` with V not a multiple of 16 (GPT-2's 50257 words, BERT's
    30522) is no wider than one element, so Triton could not vectorise a single load or
    store of the row (sm_90, Triton 3.6: 8 two-byte loads a thread an iteration for
    GPT-2's bfloat16 logits; the H200 ran the kernel at 45 % of copy bandwidth, 2026-11-28)."""
    row = tl.program_id(0)
    base = z_ptr + row.to(tl.int64) * z_stride
    t = tl.load(tgt_ptr + row).to(tl.int32)
    cols0 = tl.arange(0, BLOCK)
    valid = t != ignore_index
    whole = V - V % BLOCK   # columns in whole blocks
    if HAS_LSE:
        lse = tl.load(lse_ptr + row)
    else:
        lse = _row_loss(base, t, valid, loss_ptr + row, lse_ptr + row, V, whole, smooth, softcap, cols0,
                        HAS_SOFTCAP, BLOCK, HAS_SMOOTH)
    if WRITE_GRAD:
        scale = tl.where(valid, 1.0 / tl.load(count_ptr), 0.0)
        for start in range(0, whole, BLOCK):
            cols = start + cols0
            z = tl.load(base + cols).to(tl.float32)
            d = _grad(z, cols, t, lse, scale, V, smooth, softcap, HAS_SOFTCAP)
            tl.store(base + cols, d.to(z_ptr.dtype.element_ty))
        if whole < V:
            cols = whole + cols0
            mask = cols < V
            z = tl.load(base + cols, mask=mask, other=0.0).to(tl.float32)
            d = _grad(z, cols, t, lse, scale, V, smooth, softcap, HAS_SOFTCAP)
            tl.store(base + cols, d.to(z_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _grad(z, cols, t, lse, scale, V, smooth, softcap, HAS_SOFTCAP: tl.constexpr):
    """d loss / d z of one block of a row (z the raw logits, in float32)."""
    if HAS_SOFTCAP:
        th = _tanh(z / softcap)
        z = softcap * th
    d = tl.exp(z - lse) - tl.where(cols == t, 1.0 - smooth, 0.0) - smooth / V
    d = d * scale
    if HAS_SOFTCAP:
        d = d * (1.0 - th * th)
    return d


@triton.jit
def _online(zm, m_lane, s_lane):
    """One block into the per-lane online log-sum-exp: one exp a value, exp(-|z - m|),
    the new term (z <= m) or the rescale of the lane's sum to a new maximum z (s * e + 1);
    ex2.approx.ftz (codegen/triton_fast.py)."""
    d = zm - m_lane
    e = _exp_ftz(-tl.abs(d))
    s_lane = tl.where(d > 0, s_lane * e + 1.0, s_lane + e)
    return tl.maximum(m_lane, zm), s_lane


@triton.jit
def _row_loss(base, t, valid, loss_out, lse_out, V, whole, smooth, softcap, cols0, HAS_SOFTCAP: tl.constexpr,
              BLOCK: tl.constexpr, HAS_SMOOTH: tl.constexpr):
    """Online log-sum-exp pass over one row (its `whole` columns in unmasked blocks, then
    the rest): stores the loss and lse, returns lse."""
    # per-lane online log-sum-exp, lanes combined once at the end; lanes start at a
    # finite floor, and a column past the row's end is -inf: d = -inf, e = 0, it adds
    # nothing without a test (from -inf, -inf - -inf would be NaN)
    floor = -3.0e38
    m_lane = tl.full([BLOCK], floor, tl.float32)
    s_lane = tl.zeros([BLOCK], tl.float32)
    zsum = tl.zeros([BLOCK], tl.float32)
    for start in range(0, whole, BLOCK):
        z = tl.load(base + start + cols0).to(tl.float32)
        if HAS_SOFTCAP:
            z = softcap * _tanh(z / softcap)
        m_lane, s_lane = _online(z, m_lane, s_lane)
        if HAS_SMOOTH:
            zsum += z
    if whole < V:
        cols = whole + cols0
        mask = cols < V
        z = tl.load(base + cols, mask=mask, other=0.0).to(tl.float32)
        if HAS_SOFTCAP:
            z = softcap * _tanh(z / softcap)
        m_lane, s_lane = _online(tl.where(mask, z, -float("inf")), m_lane, s_lane)
        if HAS_SMOOTH:
            zsum += tl.where(mask, z, 0.0)
    m = tl.max(m_lane, 0)
    lse = m + tl.log(tl.sum(s_lane * _exp_ftz(m_lane - m), 0))
    # the target's logit: one load, not a compare per column (an ignored or out-of-range
    # target reads nothing: 0, as the compare gave)
    zt = tl.load(base + t, mask=valid & (t >= 0) & (t < V), other=0.0).to(tl.float32)
    if HAS_SOFTCAP:
        zt = softcap * _tanh(zt / softcap)
    loss = lse - (1.0 - smooth) * zt
    if HAS_SMOOTH:
        loss -= smooth / V * tl.sum(zsum, 0)
    tl.store(loss_out, tl.where(valid, loss, 0.0))
    tl.store(lse_out, lse)
    return lse


@triton.jit
def _tanh(x):
    # 1 - 2/(e^{2x}+1): exact at ±inf, no overflow (e^{2x} = inf gives 1)
    return 1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0)


def _triton_usable(t: Tensor) -> bool:
    if t.is_cuda:
        return True
    # CPU tensors run only under the Triton interpreter (set before triton is imported)
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0") and \
        type(tl.sigmoid).__name__ == "InterpretedFunction"


def _ce_rows_torch(z: Tensor, tgt: Tensor, count: Tensor, ignore_index: int, smooth: float,
                   softcap: float, write_grad: bool, lse_out: Tensor, lse_in: Tensor | None) -> Tensor:
    """The kernel's math in torch, for CPU tensors without the interpreter (a chunk's
    fp32 copy is the only extra memory)."""
    V = z.shape[1]
    zf = z.float()
    if softcap > 0:
        th = torch.tanh(zf / softcap)
        zf = softcap * th
    valid = tgt != ignore_index
    safe = torch.where(valid, tgt, 0)
    if lse_in is None:
        lse = torch.logsumexp(zf, 1)
        zt = zf.gather(1, safe[:, None])[:, 0]
        loss = torch.where(valid, lse - (1 - smooth) * zt - smooth / V * zf.sum(1), 0.0)
        lse_out.copy_(lse)
    else:
        lse, loss = lse_in, lse_out
    if write_grad:
        d = torch.exp(zf - lse[:, None]) - smooth / V
        d.scatter_add_(1, safe[:, None], torch.full_like(d[:, :1], -(1 - smooth)))
        d *= torch.where(valid, 1.0 / count, 0.0)[:, None]
        if softcap > 0:
            d *= 1 - th * th
        z.copy_(d)
    return loss


def launch_block(v: int) -> int:
    """Columns per loop iteration of the row kernel."""
    return min(triton.next_power_of_2(v), 2048)


def launch_warps(block: int) -> int:
    # sm_90, compiled ahead of time (patterns/aot.py): 1024-2048 columns at 8 warps is
    # <= 64 registers and no stack; 4 warps spill from 1024 columns (fp32)
    return 8 if block >= 1024 else 4


def ce_rows(z: Tensor, tgt: Tensor, count: Tensor, ignore_index: int, smooth: float, softcap: float,
            write_grad: bool, block: int | None = None, lse_out: Tensor | None = None,
            lse_in: Tensor | None = None) -> Tensor:
    """Row losses (fp32) of logits z [n, V] (their log-sum-exp into lse_out); with
    write_grad, z becomes d loss / d z divided by count.  Given lse_in, the loss pass
    is skipped (the returned tensor is then meaningless).  `block`: columns per loop
    iteration (default: the row, up to 2048)."""
    n, V = z.shape
    loss = torch.empty(n, dtype=torch.float32, device=z.device)
    lse_out = lse_out if lse_out is not None else torch.empty_like(loss)
    # the kernel reads a row's target and log-sum-exp at the row's index: a strided
    # target (a user's `labels[::2]`; op_db's non-contiguous samples) is made dense first
    tgt = tgt.contiguous()
    assert lse_out.is_contiguous() and (lse_in is None or lse_in.is_contiguous()) and z.stride(1) == 1
    if not _triton_usable(z):
        return _ce_rows_torch(z, tgt, count, ignore_index, smooth, softcap, write_grad, lse_out, lse_in)
    block = block or launch_block(V)
    _ce_rows_kernel[(n,)](z, z.stride(0), tgt, loss, lse_in if lse_in is not None else lse_out, count, V,
                          ignore_index, float(smooth), float(softcap), HAS_SOFTCAP=softcap > 0,
                          WRITE_GRAD=write_grad, HAS_LSE=lse_in is not None, BLOCK=block, HAS_SMOOTH=smooth > 0,
                          num_warps=launch_warps(block))
    return loss


_WIDE_SLICE = 8192   # vocabulary rows per fp32 grad_W update
# Auto chunk (knob linear_ce_chunk = 0): measured on an H200 (bench/NOTES.md, 2026-11-25),
# BERT-base's 2048 tokens in 32 chunks of 64 spent 5.0 ms per step in this op against
# 0.5 ms for Inductor's one-shot logits.  A chunk of c tokens re-reads W in three GEMMs:
# their intensity is ~c flops per byte of W (bf16), so c >= 256 keeps them above an H200's
# ridge (~200) and the row kernel (one program per token) over its 132 SMs.  The buffer
# is bounded in bytes: LLaMA-3's 128256 words at 512 tokens is 131 MB (bf16) instead of
# 1 GB of logits and their 2 GB float32 copy; BERT's 30522 words fit in one chunk.
MIN_AUTO_CHUNK = 256
AUTO_CHUNK_BYTES = 128 << 20
# The vocabulary is padded to a multiple of this many words for all three products: with
# an odd vocabulary (BERT 30522, GPT-2 50257) it is a leading dimension, a K or an M that
# is not a multiple of 16 bytes, and cuBLAS then falls back to slow align-1/align-2
# kernels (3.3 ms instead of ~0.4 ms for GPT-2's head on an H200).
LD_PAD = 64


def auto_chunk(n: int, v: int, itemsize: int = 2) -> int:
    """Tokens per chunk when the knob says 0: a power of two, at most n, the chunk's
    logits (row stride padded) within AUTO_CHUNK_BYTES but at least MIN_AUTO_CHUNK
    tokens.  BERT-base (2048 tokens, v 30522, bf16): 2048, one chunk; LLaMA-3 at 4x1024
    tokens (v 128256): 512 tokens, 131 MB."""
    rows = max(MIN_AUTO_CHUNK, AUTO_CHUNK_BYTES // max(padded_ld(v) * itemsize, 1))
    return max(1, min(n, 1 << (rows.bit_length() - 1)))


def padded_ld(v: int) -> int:
    """The padded vocabulary (the chunk buffer's row stride): v rounded up to LD_PAD."""
    return -(-v // LD_PAD) * LD_PAD


def _empty(like: Tensor) -> Tensor:
    return like.new_empty((0,))


def _count(target: Tensor, ignore_index: int, reduction: str) -> Tensor:
    """The loss's divisor on the device (no host sync): non-ignored tokens, or 1."""
    if reduction == "mean":
        return (target != ignore_index).sum(dtype=torch.float32).reshape(1)
    return torch.ones(1, dtype=torch.float32, device=target.device)


def _chunks(h: Tensor, w: Tensor, bias: Optional[Tensor], target: Tensor, count: Tensor, ignore_index: int,
            smooth: float, softcap: float, chunk: int, need_grad_h: bool, need_grad_w: bool, fp32_grad_w: bool,
            lse_in: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The chunk loop: mm → row kernel → gradient products.  Returns (row losses,
    row lse, grad_h or [0], grad_w or [0], grad_b or [0]), gradients divided by count.

    grad_W is summed over chunks in place, in W's dtype (for bf16/fp16 one rounding
    per chunk, where eager's single product rounds once), unless `fp32_grad_w`: then
    in an fp32 buffer (2x W's size, plus the final cast)."""
    n, d = h.shape
    v = w.shape[0]
    write_grad = need_grad_h or need_grad_w
    chunk = chunk if chunk > 0 else auto_chunk(n, v, h.element_size())
    # Every product runs over vp = v rounded up to LD_PAD words: W gets zero rows (and the
    # bias zeros), so the chunk's extra logit columns are 0 and add nothing to grad_h,
    # and grad_W's extra rows are cut off.  cuBLAS picked align-2 kernels whenever the
    # vocabulary was a product's K or M (BERT's 30522: 0.9 ms per step on an H200, where
    # aligned kernels take ~0.15 ms); the copy of W costs one pass over it per call.
    vp = padded_ld(v)
    wp = w if vp == v else torch.nn.functional.pad(w, (0, 0, 0, vp - v))
    bp = bias if bias is None or vp == v else torch.nn.functional.pad(bias, (0, vp - v))
    zfull = torch.empty(min(chunk, max(n, 1)), vp, dtype=h.dtype, device=h.device)
    losses = torch.empty(n, dtype=torch.float32, device=h.device)
    lse = lse_in if lse_in is not None else torch.empty(n, dtype=torch.float32, device=h.device)
    gh = torch.empty_like(h) if need_grad_h else _empty(h)
    wide = fp32_grad_w and w.dtype != torch.float32
    gw = torch.zeros(vp, d, dtype=torch.float32 if wide else w.dtype, device=w.device) if need_grad_w else _empty(w)
    gb = torch.zeros(vp, dtype=torch.float32, device=w.device) if (bias is not None and need_grad_w) else None
    wt = wp.t()
    for start in range(0, n, chunk):
        stop = min(n, start + chunk)
        hc, zc = h[start:stop], zfull[: stop - start]
        if bp is None:
            torch.mm(hc, wt, out=zc)
        else:
            torch.addmm(bp, hc, wt, out=zc)
        # the row kernel reads and overwrites the v real columns (the rest stay 0)
        rows = ce_rows(zc[:, :v], target[start:stop], count, ignore_index, smooth, softcap, write_grad,
                       lse_out=lse[start:stop], lse_in=None if lse_in is None else lse_in[start:stop])
        if lse_in is None:
            losses[start:stop] = rows
        if need_grad_h:
            torch.mm(zc, wp, out=gh[start:stop])
        if need_grad_w:
            if wide:  # vocabulary slices keep the half-precision temporary small
                for v0 in range(0, vp, _WIDE_SLICE):
                    gw[v0:v0 + _WIDE_SLICE] += torch.mm(zc[:, v0:v0 + _WIDE_SLICE].t(), hc)
            else:
                gw.addmm_(zc.t(), hc)
            if gb is not None:
                gb += zc.sum(0, dtype=torch.float32)
    if need_grad_w:
        gw = gw[:v].to(w.dtype) if wide else (gw if vp == v else gw[:v].clone())
    # (a custom op's output is better not a view of a larger buffer: copy when no cast does)
    gb = (gb[:v].clone() if bias.dtype == gb.dtype else gb[:v].to(bias.dtype)) if gb is not None else _empty(h)
    return losses, lse, gh, gw, gb


# --- grads in the forward pass (default): one pass, gradients kept until backward ---

@torch.library.custom_op("stitchml::linear_cross_entropy", mutates_args=())
def linear_cross_entropy(h: Tensor, w: Tensor, bias: Optional[Tensor], target: Tensor, ignore_index: int,
                         label_smoothing: float, softcap: float, reduction: str, chunk: int,
                         need_grad_h: bool, need_grad_w: bool, fp32_grad_w: bool
                         ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(loss fp32 [], grad_h [N, D] or [0], grad_w [V, D] or [0], grad_bias [V] or [0]).
    The gradients are those of the loss itself (incoming gradient 1)."""
    target = target.reshape(-1)
    count = _count(target, ignore_index, reduction)
    losses, _, gh, gw, gb = _chunks(h, w, bias, target, count, ignore_index, label_smoothing, softcap, chunk,
                                    need_grad_h, need_grad_w, fp32_grad_w)
    loss = losses.sum() / count[0] if reduction == "mean" else losses.sum()
    return loss, gh, gw, gb


@linear_cross_entropy.register_fake
def _(h, w, bias, target, ignore_index, label_smoothing, softcap, reduction, chunk, need_grad_h, need_grad_w,
      fp32_grad_w):
    loss = h.new_empty((), dtype=torch.float32)
    gh = h.new_empty(h.shape) if need_grad_h else h.new_empty((0,))
    gw = w.new_empty(w.shape) if need_grad_w else w.new_empty((0,))
    gb = bias.new_empty(bias.shape) if (bias is not None and need_grad_w) else h.new_empty((0,))
    return loss, gh, gw, gb


def _setup_context(ctx, inputs, output) -> None:
    h, w, bias = inputs[0], inputs[1], inputs[2]
    _, gh, gw, gb = output
    ctx.save_for_backward(gh, gw, gb)
    ctx.flags = (inputs[9], inputs[10], bias is not None and inputs[10])
    ctx.mark_non_differentiable(gh, gw, gb)


def _backward(ctx, g_loss, *_unused):
    gh, gw, gb = ctx.saved_tensors
    need_h, need_w, need_b = ctx.flags
    return (gh * g_loss if need_h else None, gw * g_loss if need_w else None,
            gb * g_loss if need_b else None) + (None,) * 9


linear_cross_entropy.register_autograd(_backward, setup_context=_setup_context)


# --- grads in the backward pass (knob linear_ce_grads_in_forward=0): the forward keeps
# one float per token (lse); the backward recomputes each chunk's logits, already
# scaled by the incoming gradient, so grad_W is written once and nothing of the size
# of h or W lives from forward to backward.  One more logits product than above. ---

@torch.library.custom_op("stitchml::linear_ce_loss", mutates_args=())
def linear_ce_loss(h: Tensor, w: Tensor, bias: Optional[Tensor], target: Tensor, ignore_index: int,
                   label_smoothing: float, softcap: float, reduction: str, chunk: int, fp32_grad_w: bool
                   ) -> tuple[Tensor, Tensor]:
    """(loss fp32 [], lse fp32 [N]); fp32_grad_w is for the backward."""
    target = target.reshape(-1)
    count = _count(target, ignore_index, reduction)
    losses, lse, _, _, _ = _chunks(h, w, bias, target, count, ignore_index, label_smoothing, softcap, chunk,
                                   False, False, False)
    return (losses.sum() / count[0] if reduction == "mean" else losses.sum()), lse


@linear_ce_loss.register_fake
def _(h, w, bias, target, ignore_index, label_smoothing, softcap, reduction, chunk, fp32_grad_w):
    return h.new_empty((), dtype=torch.float32), h.new_empty((h.shape[0],), dtype=torch.float32)


@torch.library.custom_op("stitchml::linear_ce_grads", mutates_args=())
def linear_ce_grads(h: Tensor, w: Tensor, bias: Optional[Tensor], target: Tensor, lse: Tensor, grad: Tensor,
                    ignore_index: int, label_smoothing: float, softcap: float, reduction: str, chunk: int,
                    need_grad_h: bool, need_grad_w: bool, fp32_grad_w: bool) -> tuple[Tensor, Tensor, Tensor]:
    """(grad_h or [0], grad_w or [0], grad_bias or [0]) of grad * loss."""
    target = target.reshape(-1)
    count = _count(target, ignore_index, reduction) / grad.float().reshape(1)
    _, _, gh, gw, gb = _chunks(h, w, bias, target, count, ignore_index, label_smoothing, softcap, chunk,
                               need_grad_h, need_grad_w, fp32_grad_w, lse_in=lse)
    return gh, gw, gb


@linear_ce_grads.register_fake
def _(h, w, bias, target, lse, grad, ignore_index, label_smoothing, softcap, reduction, chunk, need_grad_h,
      need_grad_w, fp32_grad_w):
    gh = h.new_empty(h.shape) if need_grad_h else h.new_empty((0,))
    gw = w.new_empty(w.shape) if need_grad_w else w.new_empty((0,))
    gb = bias.new_empty(bias.shape) if (bias is not None and need_grad_w) else h.new_empty((0,))
    return gh, gw, gb


def _setup_loss(ctx, inputs, output) -> None:
    h, w, bias, target = inputs[:4]
    ctx.opts, ctx.fp32_grad_w = inputs[4:9], inputs[9]
    ctx.has_bias = bias is not None
    ctx.save_for_backward(h, w, bias, target, output[1])
    ctx.mark_non_differentiable(output[1])


def _backward_loss(ctx, g_loss, _g_lse):
    h, w, bias, target, lse = ctx.saved_tensors
    need_h = ctx.needs_input_grad[0]
    need_w = ctx.needs_input_grad[1] or (ctx.has_bias and ctx.needs_input_grad[2])
    gh, gw, gb = torch.ops.stitchml.linear_ce_grads(h, w, bias, target, lse, g_loss, *ctx.opts, need_h, need_w,
                                                    ctx.fp32_grad_w)
    return (gh if need_h else None, gw if need_w else None, gb if (ctx.has_bias and need_w) else None) + (None,) * 7


linear_ce_loss.register_autograd(_backward_loss, setup_context=_setup_loss)


def fused_linear_cross_entropy(h: Tensor, w: Tensor, bias: Optional[Tensor], target: Tensor, *,
                               ignore_index: int = -100, label_smoothing: float = 0.0, softcap: float = 0.0,
                               reduction: str = "mean", chunk: int = 0, out_dtype: torch.dtype | None = None,
                               fp32_grad_w: bool = False, grads_in_forward: bool = True) -> Tensor:
    """What the rewrite inserts: h [..., D] and target [...] are flattened to tokens;
    the loss comes back in out_dtype (the dtype eager's loss would have)."""
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction {reduction!r} is not supported (mean, sum)")
    h2 = h.reshape(-1, h.shape[-1])
    opts = (int(ignore_index), float(label_smoothing), float(softcap), reduction, int(chunk))
    if not grads_in_forward:
        loss = torch.ops.stitchml.linear_ce_loss(h2, w, bias, target.reshape(-1), *opts, bool(fp32_grad_w))[0]
        return loss.to(out_dtype or h.dtype)
    need = torch.is_grad_enabled()
    need_w = need and (w.requires_grad or (bias is not None and bias.requires_grad))
    loss = torch.ops.stitchml.linear_cross_entropy(h2, w, bias, target.reshape(-1), *opts,
                                                   need and h.requires_grad, need_w, bool(fp32_grad_w))[0]
    return loss.to(out_dtype or h.dtype)


def peak_logits_elements(n: int, d: int, v: int, chunk: int) -> int:
    """Largest [tokens, vocab] buffer the op allocates (for explain and tests)."""
    c = chunk if chunk > 0 else auto_chunk(n, v)
    return min(c, n) * padded_ld(v)


OPS = (linear_cross_entropy, linear_ce_loss, linear_ce_grads)  # library calls for the lowering

__all__ = ["linear_cross_entropy", "linear_ce_loss", "linear_ce_grads", "fused_linear_cross_entropy", "ce_rows",
           "auto_chunk", "peak_logits_elements", "OPS"]
