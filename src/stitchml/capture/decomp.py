"""Our decomposition table: composite ops reduced to primitives the planner knows.

Built from `torch._decomp` entries (not Inductor's table), plus a few of our own where
torch's reference would emit `prims` ops we do not lower (var_mean, var, std) or hides
a pattern the planner reads (logsumexp's shift by the row maximum).
"""
from __future__ import annotations

import math
from types import NotImplementedType
from typing import Sequence

import torch
from torch._decomp import get_decompositions

from . import (decomp_amp, decomp_distance, decomp_foreach, decomp_fractional, decomp_index, decomp_quant,
               decomp_sample, decomp_search, decomp_transformer, decomp_window)

aten = torch.ops.aten

FROM_TORCH = [
    aten.grid_sampler_2d,  # corners gathered and weighted (our backward: capture/decomp_sample.py)
    aten.affine_grid_generator,  # a matrix product of the base grid and theta (its backward: autograd's)
    aten.native_layer_norm, aten.native_layer_norm_backward,
    aten._softmax, aten._softmax_backward_data, aten._log_softmax, aten._log_softmax_backward_data,
    aten.gelu, aten.gelu_backward, aten.silu, aten.silu_backward, aten.sigmoid_backward,
    aten.tanh_backward, aten.threshold_backward, aten.native_dropout_backward,
    aten.nll_loss_forward, aten.nll_loss_backward, aten.nll_loss2d_forward, aten.nll_loss2d_backward,
    aten.native_batch_norm, aten.native_batch_norm_backward, aten._native_batch_norm_legit,
    aten._native_batch_norm_legit_functional, aten._native_batch_norm_legit_no_training,
    aten.addcmul, aten.addcdiv, aten.lerp, aten.logsumexp, aten.log_sigmoid_forward,
    aten.softplus, aten.leaky_relu, aten.elu, aten.hardsigmoid, aten.hardswish, aten.mish,
    aten.rms_norm, aten._fused_rms_norm, aten.square, aten.xlogy, aten.masked_fill, aten.mse_loss,
    aten.mse_loss_backward, aten.binary_cross_entropy_with_logits, aten.huber_loss, aten.frac,
    aten.sgn, aten.hardtanh_backward, aten.leaky_relu_backward, aten.elu_backward, aten.rsub,
    aten.std_mean, aten.linalg_vector_norm, aten.tril, aten.triu, aten.baddbmm, aten.addmm,
    # issue 18: each lands on ops with a lowering rule (tests/test_coverage_ops.py)
    aten.native_group_norm, aten.native_group_norm_backward, aten._weight_norm_interface,
    aten.index_add, aten._safe_softmax,
    aten.reflection_pad1d, aten.reflection_pad2d, aten.reflection_pad3d,
    aten.reflection_pad1d_backward, aten.reflection_pad2d_backward,
    aten.replication_pad1d, aten.replication_pad2d, aten.replication_pad3d,
    aten.upsample_nearest1d, aten.upsample_nearest2d, aten.upsample_nearest3d, aten._upsample_nearest_exact2d,
    aten.upsample_bilinear2d, aten.upsample_linear1d, aten.im2col, aten.col2im,
    aten.unfold_backward,   # (unfold itself is a view of ours: lower/rules_views.py)
    # issue 19 (op_db entries that ran eagerly): element-wise and reduction compositions
    aten.logaddexp, aten.logaddexp2, aten.nansum, aten.linspace, aten.mvlgamma, aten.norm,
    aten.diagonal_copy, aten.unfold_copy, aten.squeeze_copy, aten.unbind_copy, aten._chunk_cat, aten.take,
    aten._unsafe_masked_index_put_accumulate, aten.max_unpool2d, aten.max_unpool3d,
    aten._batch_norm_with_update_functional, aten.batch_norm_backward,
    aten.glu, aten.glu_backward, aten._prelu_kernel, aten._prelu_kernel_backward, aten.dist, aten.rot90,
    aten.binary_cross_entropy, aten.binary_cross_entropy_backward, aten.logit, aten.logit_backward,
    aten.expand_copy, aten.ldexp,
    aten.heaviside, aten.deg2rad, aten.rad2deg, aten.isneginf, aten.isposinf, aten.sinc,
    aten.special_entr, aten.special_xlog1py, aten.celu, aten.threshold,
    aten.soft_margin_loss, aten.soft_margin_loss_backward,
    aten.logspace, aten.eye, aten.trace, aten.count_nonzero, aten.block_diag, aten.renorm,
    aten.addr, aten.addmv, aten.vdot, aten.dot,
    aten.pixel_shuffle, aten.pixel_unshuffle, aten.channel_shuffle,
    aten.alias_copy, aten.as_strided_copy, aten.narrow_copy, aten.permute_copy, aten.t_copy,
    aten.transpose_copy, aten.unsqueeze_copy, aten.view_copy, aten.split_with_sizes_copy, aten.unsafe_split,
    # these land on prims, lowered in lower/rules_special.py
    aten.copysign, aten.round.decimals, aten.frexp, aten.i0, aten.special_i0e, aten.special_i1, aten.special_i1e,
    aten.special_erfcx, aten.special_log_ndtr, aten.special_spherical_bessel_j0,
    # adaptive max pooling: torch's decomposition covers global and evenly tiled windows
    # (max_pool_with_indices, amax/argmax); its backward is ours (capture/decomp_window.py)
    aten.adaptive_max_pool2d, aten.adaptive_max_pool3d,
    # losses and backwards op_db still ran eagerly (this session)
    aten.smooth_l1_loss, aten.smooth_l1_loss_backward, aten.huber_loss_backward, aten.log_sigmoid_backward,
    aten.reflection_pad3d_backward,
]

_HALF = (torch.float16, torch.bfloat16)


def _dims(x: torch.Tensor, dim) -> list[int]:
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return list(range(x.dim()))
    if isinstance(dim, int):
        dim = [dim]
    return [d % max(x.dim(), 1) for d in dim]


def var_mean(x: torch.Tensor, dim: int | Sequence[int] | None = None, *, correction: float | None = None,
             keepdim: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The corrected two-pass algorithm (Chan, Golub & LeVeque): a first mean, then one
    pass over the deviations d from it that sums d and d².  sum(d) / n refines the
    mean (a row of equal values gets exactly that value as its mean, as eager's
    Welford reduction does: layer norm of a constant row is exactly its bias) and
    var = (sum(d²) - sum(d)² / n) / (n - correction).  Both passes share the
    reduction axes, so they stitch into one kernel."""
    dims = _dims(x, dim)
    n = 1
    for d in dims:
        n *= x.shape[d]
    corr = 1 if correction is None else correction
    xc = x.float() if x.dtype in _HALF else x
    first = torch.sum(xc, dims, keepdim=True) / n
    dev = xc - first
    shift = torch.sum(dev, dims, keepdim=True)
    mean = first + shift / n
    ss = torch.sum(dev * dev, dims, keepdim=True) - shift * shift / n
    var = torch.clamp_min(ss, 0) / max(n - corr, 0)
    if not keepdim:
        mean = torch.squeeze(mean, dims)
        var = torch.squeeze(var, dims)
    return var.to(x.dtype), mean.to(x.dtype)


def var(x: torch.Tensor, dim: int | Sequence[int] | None = None, *, correction: float | None = None,
        keepdim: bool = False) -> torch.Tensor:
    return var_mean(x, dim, correction=correction, keepdim=keepdim)[0]


def std(x: torch.Tensor, dim: int | Sequence[int] | None = None, *, correction: float | None = None,
        keepdim: bool = False) -> torch.Tensor:
    return torch.sqrt(var_mean(x, dim, correction=correction, keepdim=keepdim)[0])


def logsumexp(x: torch.Tensor, dim: int | Sequence[int], keepdim: bool = False) -> torch.Tensor:
    """m + log(sum(exp(x - m))) with m = amax(x) itself, not torch's
    where(|m| == inf, 0, m): the planner sees `sum(exp(x - m))` as the online partner of
    `m` (`plan/row_loops.py`), so a looped row is read once.  Rows whose maximum is
    ±inf are fixed up on the row values only: -inf everywhere gives -inf (the sum is
    NaN there and discarded), +inf gives +inf, a NaN maximum gives NaN, as eager.
    Half inputs are summed in float32 and rounded once."""
    if not x.dtype.is_floating_point or x.numel() == 0:
        from torch._decomp import decomposition_table as torch_table
        return torch_table[aten.logsumexp.default](x, dim, keepdim)
    dims = _dims(x, dim)
    xc = x.float() if x.dtype in _HALF else x
    m = torch.amax(xc, dims, keepdim=True)
    s = torch.sum(torch.exp(xc - m), dims, keepdim=keepdim)
    row_m = m if keepdim else torch.squeeze(m, dims)
    out = torch.where(torch.isinf(row_m), row_m, row_m + torch.log(s))
    return out.to(x.dtype)


def _batch_stats(x, weight, bias, eps: float):
    """Batch norm's training statistics and output: the mean as a shift s plus a small
    correction, the output from x - s minus that correction (never x - mean: with few
    values per channel on a large offset, the rounded mean's error would be scaled up by
    the inverse std).  Two forms, both reading x twice (statistics, output):
    - chunk statistics (`_chunk_stats`, knob `bn_chunk_stats`): each chunk of rows its
      mean and the sums of deviations from it in one kernel, the chunks merged by
      Chan's formula in a second; no shift to choose, three launches in all;
    - otherwise sums of the deviations d = x - s from the mean s of the batch's leading
      samples (`_shift_sample`) in one pass over x for both sums (five launches: the
      sample's column partials and their combine too).
    Returns the output (x's dtype), the mean, rstd and the biased variance (per channel,
    float32 for half inputs) and the count per channel."""
    dims = [0] + list(range(2, x.dim()))
    n = x.numel() // x.shape[1]
    xc = x.float() if x.dtype in _HALF else x
    chunked = _chunk_stats(xc)
    if chunked is not None:
        first, shift, var = chunked
        dev = xc - first
    else:
        sample = _shift_sample(xc)
        first = torch.sum(sample, dims, keepdim=True) / (sample.numel() // x.shape[1])
        dev = xc - first
        shift = torch.sum(dev, dims, keepdim=True) / n
        var = torch.clamp_min(torch.sum(dev * dev, dims, keepdim=True) / n - shift * shift, 0)
    rstd = torch.rsqrt(var + eps)
    out = (dev - shift) * rstd
    shape = [1, -1] + [1] * (x.dim() - 2)
    if weight is not None:
        out = out * weight.reshape(shape)
    if bias is not None:
        out = out + bias.reshape(shape)
    return (out.to(x.dtype), torch.squeeze(first + shift, dims), torch.squeeze(rstd, dims),
            torch.squeeze(var, dims), n)


def batch_norm_functional(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                          running_mean: torch.Tensor, running_var: torch.Tensor, training: bool, momentum: float,
                          eps: float) -> tuple[torch.Tensor, ...]:
    """`_native_batch_norm_legit_functional` in training: `_batch_stats`, and the running
    statistics updated with the unbiased variance.  Eval mode is torch's decomposition."""
    if not training:
        from torch._decomp import decomposition_table as torch_table
        return torch_table[aten._native_batch_norm_legit_functional.default](
            x, weight, bias, running_mean, running_var, training, momentum, eps)
    out, mean, rstd, var, n = _batch_stats(x, weight, bias, eps)
    new_mean = momentum * mean + (1 - momentum) * running_mean
    new_var = momentum * (var * (n / max(n - 1, 1))) + (1 - momentum) * running_var
    return out, mean, rstd, new_mean.to(running_mean.dtype), new_var.to(running_var.dtype)


def batch_norm_no_stats(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, training: bool,
                        momentum: float, eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`_native_batch_norm_legit.no_stats` (batch norm without running statistics, always
    the batch's): `_batch_stats`."""
    out, mean, rstd, _, _ = _batch_stats(x, weight, bias, eps)
    return out, mean, rstd


CHUNK_MIN, CHUNK_MAX, CHUNKS_MAX = 16, 2048, 1024


def _chunking(rows: int) -> int | None:
    """Rows a chunk of `_chunk_stats` over `rows` rows: the smallest divisor of `rows` of
    at least CHUNK_MIN (all of them where fewer) that leaves at most CHUNKS_MAX chunks,
    the chunks' merge holding each channel's chunks on chip; None where no divisor up to
    CHUNK_MAX does (a prime row count, say)."""
    if rows <= CHUNK_MIN:
        return rows
    for ch in range(max(CHUNK_MIN, -(-rows // CHUNKS_MAX)), min(rows, CHUNK_MAX) + 1):
        if rows % ch == 0:
            return ch
    return None


def _chunk_stats(xc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """Batch-norm statistics from chunks of rows (knob `bn_chunk_stats`), where x keeps its
    channels innermost in memory (a channels-last image batch, an [N, C] batch) and its
    sizes are static: x viewed as [K chunks, CH rows, C]; per chunk k its mean m_k and the
    sums of x - m_k and of its square (lin_k, M2_k: the chunk on chip, so one read of x
    for all three, `plan/grouping.py`'s regional fusion), written as [K, C]; then one
    kernel merges them, a channel block a program (`Grouper._column_reduce`: two
    dependent sums over few rows are row reductions read in tall tiles), with the shift
    s = m_0 and
    e_k = m_k - s, the mean's correction c = Σ_k (CH e_k + lin_k) / R and, with
    f_k = e_k - c, the variance Σ_k (M2_k + f_k (2 lin_k + CH f_k)) / R (Chan's
    combination, exact for rounded m_k through the lin_k term, as `plan/split.py`'s
    chunks: no cancellation between large sums, whatever the data).  Returns the mean as
    a head s + c rounded and its rounding's tail (the output is (x - head) - tail), and
    the variance, each [1, C, 1, ...], or None where the form does not apply (the knob
    off, another layout, symbolic sizes, no chunking)."""
    from .. import config
    if not config.get("bn_chunk_stats") or xc.dim() not in (2, 4):
        return None
    sizes = list(xc.shape)
    if any(isinstance(s, torch.SymInt) for s in sizes):
        return None
    c = sizes[1]
    if xc.dim() == 4:
        if not xc.is_contiguous(memory_format=torch.channels_last):
            return None
        flat = xc.permute(0, 2, 3, 1)
    else:
        if not xc.is_contiguous():
            return None
        flat = xc
    rows = flat.numel() // max(c, 1)
    ch = _chunking(rows) if c and rows else None
    if ch is None or rows // ch < 2:   # (one chunk: the shifted sums' plan is as good)
        return None
    k = rows // ch
    chunks = flat.reshape(k, ch, c)
    m = torch.sum(chunks, 1) / ch                                     # [K, C]
    d = chunks - m[:, None, :]
    lin = torch.sum(d, 1)
    m2 = torch.sum(d * d, 1)
    first = m[:1]                                                     # [1, C]: the shift m_0
    e = m - first
    # (two dependent sums over the K chunks: one row kernel a channel block, the chunks'
    # statistics read transposed in tall tiles, `Grouper._column_reduce`)
    corr = torch.sum(e * ch + lin, 0, keepdim=True) / rows
    f = e - corr
    var = torch.clamp_min(torch.sum(m2 + f * (2 * lin + f * ch), 0, keepdim=True) / rows, 0)
    # the mean as a rounded head and the rounding's tail (exact where |m_0| >= |c|), both
    # computed by the merge's kernel: the normalising kernel reads only the merge's
    # per-channel outputs, none of the chunk kernel's
    hi = first + corr
    lo = corr - (hi - first)
    shape = [1, c] + [1] * (xc.dim() - 2)
    return hi.reshape(shape), lo.reshape(shape), var.reshape(shape)


def _shift_sample(x: torch.Tensor) -> torch.Tensor:
    """The leading ceil(N / k) samples of a batch-norm input (k: knob `bn_shift_sample`),
    whose per-channel mean is the shift of the variance's sums.  Why that is safe: with
    d = x - s, var = mean(d²) - mean(d)², and the rounding error of that difference
    grows with 1 + z², z = (s - mean) / std.  A part of fraction f of the data whose mean
    is Δ from the whole's contributes at least f·Δ²/(1 - f) to the variance (the law of
    total variance), so z² ≤ (1 - f) / f < k: at most log2(k) bits lost in the worst case
    (a first sample unlike the rest), about one bit for ordinary batches.  The whole
    batch (the two-pass algorithm, a full extra read) where the sample would be all of
    it, or the batch size is symbolic (no guard on a dynamic size)."""
    from .. import config
    k, nb = int(config.get("bn_shift_sample")), x.shape[0]
    if k <= 1 or isinstance(nb, torch.SymInt) or nb <= 1:
        return x
    return x[:-(-nb // k)]


def index_put_masked(x: torch.Tensor, indices: Sequence[torch.Tensor | None], values: torch.Tensor,
                     accumulate: bool = False) -> torch.Tensor | NotImplementedType:
    """`x[..., mask, ...] = v` / `+= v` with one boolean mask over some of x's dims (after
    `p` full slices) and values that do not vary along the masked positions (one value,
    or one slice broadcast to every selected position): `masked_write`, a where, under
    the rewrite's own checks (`masked_setitem.refusal`).  torch would turn the mask into
    `nonzero` indices, a data-dependent shape that AOTAutograd cannot trace (the graph
    broke there).  Values given per selected position depend on how many the mask
    selects: the op itself."""
    live = [(p, t) for p, t in enumerate(indices) if t is not None]
    if len(live) != 1 or live[0][1].dtype not in (torch.bool, torch.uint8):
        return NotImplemented
    p, mask = live[0]
    from ..patterns.masked_setitem import masked_write, refusal   # (the Dynamo-level rewrite's own form)
    if len(indices) != p + 1 or refusal(x, mask, p, values, accumulate) is not None:
        return NotImplemented   # (index_put's own rule, or its own error)
    return masked_write(x, mask.to(torch.bool), values, p, accumulate, inplace=False)


def put(x: torch.Tensor, index: torch.Tensor, source: torch.Tensor, accumulate: bool = False) -> torch.Tensor:
    """`put`: x's flat elements at `index` (negative from the end) set to (or, with
    accumulate, added) source's: an index_put of the flattened tensor."""
    flat = aten.index_put(x.reshape(-1), [index.reshape(-1)], source.reshape(-1), accumulate)
    return flat.reshape(x.shape)


def addbmm(x: torch.Tensor, batch1: torch.Tensor, batch2: torch.Tensor, *, beta: float = 1,
           alpha: float = 1) -> torch.Tensor:
    """beta·x + alpha·Σ_b batch1[b] @ batch2[b] as ONE matrix product over the joined
    (batch, inner) axis: (n, B·m) @ (B·m, p) — the library's GEMM, the scaling stitched."""
    b, n, m = batch1.shape
    p = batch2.shape[-1]
    if not (x.is_floating_point() or x.is_complex()):
        # integer tensors: eager converts beta and alpha to the integer type first
        # (truncated: beta=0.6 is 0), and the result keeps the type (op_db, int64: a
        # float32 result otherwise)
        beta, alpha = int(beta), int(alpha)
    prod_ = torch.mm(batch1.permute(1, 0, 2).reshape(n, b * m), batch2.reshape(b * m, p))
    if alpha != 1:
        prod_ = prod_ * alpha
    if beta == 0:  # eager ignores x then (NaN in x does not propagate)
        return prod_.to(x.dtype).expand(torch.broadcast_shapes(x.shape, prod_.shape)).clone()
    return (x * beta if beta != 1 else x) + prod_


def angle(x: torch.Tensor) -> torch.Tensor | NotImplementedType:
    """Real inputs: pi for negative values, 0 otherwise, NaN kept (-0.0 gives 0, as
    eager); integers give the default float type.  Complex inputs: the op itself."""
    if x.is_complex():
        return NotImplemented
    xf = x if x.is_floating_point() else x.to(torch.get_default_dtype())
    zero = torch.zeros((), dtype=xf.dtype, device=x.device)
    pi = torch.full((), math.pi, dtype=xf.dtype, device=x.device)
    return torch.where(torch.isnan(xf), xf, torch.where(xf < 0, pi, zero))


def efficient_zero_tensor(size: Sequence[int], *, dtype: torch.dtype | None = None, layout: torch.layout | None = None,
                          device: torch.device | None = None, pin_memory: bool | None = None) -> torch.Tensor:
    """Autograd's placeholder zero gradient (sgn's backward): plain zeros."""
    return torch.zeros(size, dtype=dtype, device=device)


def embedding_renorm(weight: torch.Tensor, indices: torch.Tensor, max_norm: float, norm_type: float) -> torch.Tensor:
    """The rows of `weight` that `indices` name, scaled to norm max_norm where theirs is
    larger (eager: max_norm / (norm + 1e-7)); an index_put of the scaled rows (duplicate
    indices write the same row value, so the write order does not matter)."""
    idx = indices.reshape(-1)
    rows = weight[idx]
    norm = torch.linalg.vector_norm(rows.float() if rows.dtype in _HALF else rows, norm_type, dim=1,
                                    keepdim=True)
    scale = torch.where(norm > max_norm, max_norm / (norm + 1e-7), torch.ones((), dtype=norm.dtype,
                                                                               device=norm.device))
    return aten.index_put(weight, [idx], (rows * scale).to(weight.dtype))


def _own() -> dict:
    table = {}
    table[aten.addbmm.default] = addbmm
    table[aten.angle.default] = angle
    table[aten._efficientzerotensor.default] = efficient_zero_tensor
    table[aten.embedding_renorm.default] = embedding_renorm
    table[aten.index_put.default] = index_put_masked
    table[aten.put.default] = put
    for packet, fn in ((aten.var_mean, var_mean), (aten.var, var), (aten.std, std)):
        table[packet.correction] = fn
    table[aten._native_batch_norm_legit_functional.default] = batch_norm_functional
    table[aten._native_batch_norm_legit.no_stats] = batch_norm_no_stats
    table[aten.logsumexp.default] = logsumexp
    return table


def decomposition_table() -> dict:
    """The table handed to AOTAutograd."""
    packets = [p for p in FROM_TORCH if p not in (aten.addmm, aten.baddbmm)]  # keep GEMMs whole
    table = get_decompositions(packets)
    table.update(_own())
    table.update(decomp_window.table())  # pooling, strided slice_backward, a few backwards
    table.update(decomp_index.table())   # masked_scatter, embedding_bag (data-dependent index ops)
    table.update(decomp_distance.table())  # cdist, pdist
    table.update(decomp_sample.table())    # grid_sample's backward (its forward is torch's)
    table.update(decomp_search.table())    # searchsorted/bucketize, isin, nonzero_static
    table.update(decomp_foreach.table())   # _foreach_* (optimizers, clipping): one op per list element
    table.update(decomp_transformer.table())   # nn.TransformerEncoderLayer's inference fast path
    table.update(decomp_fractional.table())    # fractional max-pooling (+backward)
    table.update(decomp_amp.table())           # the gradient scaler's unscale and scale update
    table.update(decomp_quant.table())         # fake quantisation (quantisation-aware training)
    for op in (aten.native_batch_norm.default, aten._native_batch_norm_legit.default,
               aten._native_batch_norm_legit.no_stats, aten._native_batch_norm_legit_no_training.default,
               aten._native_batch_norm_legit_functional.default):
        if op in table:
            table[op] = _stats_in_eager_dtype(table[op])
    return table


def declined_reason(target: object) -> str | None:
    """Why one of our decompositions declined `target`'s case (the op then runs eagerly),
    or None: each module's `DECLINED` table."""
    for module in (decomp_index, decomp_distance, decomp_quant, decomp_sample, decomp_search, decomp_window):
        if target in module.DECLINED:
            return module.DECLINED[target]
    return None


def _stats_in_eager_dtype(decomp):
    """torch's batch-norm decompositions return the saved mean and inverse std in the
    computation dtype (float32 for half inputs); eager on the CPU returns them in the
    input's dtype (on CUDA in float32).  Cast them so that a graph returning them gives
    eager's dtypes (op_db's native_batch_norm in bfloat16); a training graph's backward
    reads the float32 values all the same (`norm_stats.keep_precise`)."""
    def wrapped(x, *args, **kwargs):
        out = decomp(x, *args, **kwargs)
        if out is NotImplemented or x.dtype not in _HALF or x.device.type != "cpu":
            return out
        return (out[0], out[1].to(x.dtype), out[2].to(x.dtype)) + tuple(out[3:])
    return wrapped
