"""Our decompositions of window ops (issue 18): each reduces to strided slices,
zero-interleaving pads, element-wise ops and reductions, which all stitch; no atomics.

- pooling (avg_pool2d, max_pool2d_with_indices and their backwards; 1-d as (1, k)
  windows, 3-d as a 2-d window then a 1-d one over depth): a k x k window is
  k*k strided slices of the padded input, combined element-wise; a max-pool's indices
  are integer arithmetic of each maximum's window offset, kept in one byte.  The backward sums,
  per residue class of the padded position modulo the stride, the shifted shares of the
  window offsets that land there, then interleaves the classes (`_unpool`): a gather
  form, deterministic, no scatter.
- strided `slice_backward` (torch has no rule for step > 1 that we lower): the gradient
  with step-1 zeros interleaved, then placed with a step-1 slice_backward.
- `_weight_norm_interface_backward`, `upsample_nearest2d_backward` (index_put with
  accumulate: the scatter-add form), replication padding's backward (slices and edge
  sums per axis), adaptive pooling over windows that do not tile evenly (a gather of
  clamped window indices per axis, reduced; its backward the same gather transposed).
Any case a decomposition does not cover returns NotImplemented: the op stays whole and
runs eagerly with its reason.
"""
from __future__ import annotations

import math
from types import NotImplementedType, SimpleNamespace
from typing import Sequence

import torch
from torch._prims_common import invert_perm

aten = torch.ops.aten

def _pair(v, default=None) -> tuple[int, int]:
    if v is None or (isinstance(v, (list, tuple)) and len(v) == 0):
        v = default
    if isinstance(v, int):
        return (v, v)
    return (v[0], v[0]) if len(v) == 1 else (v[0], v[1])


def _out_size(n: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> int:
    span = d * (k - 1) + 1
    num = n + 2 * p - span
    out = (-(-num // s) if ceil_mode else num // s) + 1
    if ceil_mode and (out - 1) * s >= n + p:  # the last window must start inside input or left padding
        out -= 1
    return out


def _padded(x: torch.Tensor, ph: int, pw: int, need_h: int, need_w: int, value: float) -> torch.Tensor:
    """x padded by ph/pw before and up to need_h/need_w in all (negative: crop)."""
    h, w = x.shape[-2], x.shape[-1]
    return aten.constant_pad_nd(x, [pw, need_w - w - pw, ph, need_h - h - ph], value)


def _window(xp: torch.Tensor, i: int, j: int, oh: int, ow: int, sh: int, sw: int) -> torch.Tensor:
    return xp[..., i: i + (oh - 1) * sh + 1: sh, j: j + (ow - 1) * sw + 1: sw]


# Windows of more elements than this are reduced over a window axis instead of unrolled
# (`_window_views`): code generation emits an unrolled window's every offset, and Triton 3.6
# compiled timm cspnext's 13x13 stride-1 max pool (2489 lines) for 160 s into a kernel
# spilling 15 KB a thread, its 9x9 one (963 lines) in 0.6 s without spills
# (bench/NOTES.md, forty-fourth session).  A reduced window is one tile load per row of
# windows, whatever its size.
UNROLL_MAX_WINDOW = 25


def _window_views(xp: torch.Tensor, kh: int, kw: int, oh: int, ow: int, sh: int, sw: int, dh: int = 1,
                  dw: int = 1) -> torch.Tensor:
    """(..., oh, ow, kh, kw): every window of the padded `xp` as one overlapping strided
    view of its storage.  (`as_strided` of the dense `xp`, which lowers to a re-index;
    `unfold` twice would be an as_strided of an overlapping view, which runs eagerly.)"""
    st = xp.stride()
    r, c = st[-2], st[-1]
    return xp.as_strided((*xp.shape[:-2], oh, ow, kh, kw), (*st[:-2], r * sh, c * sw, r * dh, c * dw),
                         xp.storage_offset())


def _axis_lags(k: int, s: int, d: int) -> list[list[int]]:
    """Per residue t of a padded position R = q*s + t: the lags of the windows whose
    element lands there, R = (q - lag)*s + i*d for a window offset i."""
    return [[(i * d - t) // s for i in range(k) if (i * d - t) % s == 0] for t in range(s)]


def _unpool(term, grad: torch.Tensor, kh, kw, sh, sw, ph, pw, dh, dw, h, w) -> torch.Tensor:
    """The adjoint of a strided window read, as an (..., h, w) tensor: the sum over window
    offsets (i, j) of each window's share placed at its (i, j) element.

    By residue class: a padded position R = q*s + t only receives the offsets i of one
    residue (`_axis_lags`), each from window q - lag.  A class is computed on the (Q,
    Q') grid of q's as the sum of its offsets' `term(shift, pos)`: `shift(t, value)` reads
    an (..., oh, ow) source `t` at window q - lag (`value` outside it: a pad of the
    source, which a reader loads under a mask) and `pos` is each element's flat input
    position.  Every class element sums only its own terms (a 3x3 stride-2 window:
    classes of 4, 2, 2 and 1), one kernel computes the classes from the sources and the
    next interleaves them (stacked, viewed as the padded grid) and crops the padding.
    (Placing each offset's share with zeros interleaved and summing the nine placements
    made every output element compute all nine: ResNet-50's stem max-pool backward was 21
    kernels, 515 us predicted on an H200, and with the placements computed by their
    reader, ~7700 sm_90 instructions a thread: bench/NOTES.md, thirty-sixth session.)"""
    qh, qw = -(-(h + ph) // sh), -(-(w + pw) // sw)
    oh, ow = grad.shape[-2], grad.shape[-1]
    rows = []
    for th, lags_h in enumerate(_axis_lags(kh, sh, dh)):
        cols = []
        for tw, lags_w in enumerate(_axis_lags(kw, sw, dw)):
            r = torch.arange(qh, device=grad.device) * sh + (th - ph)
            c = torch.arange(qw, device=grad.device) * sw + (tw - pw)
            pos = r.unsqueeze(1) * w + c.unsqueeze(0)
            acc = None
            hs, ws = [lag for lag in lags_h if lag < qh], [lag for lag in lags_w if lag < qw]
            if (len(hs) * len(ws) > UNROLL_MAX_WINDOW and hs == list(range(len(hs)))
                    and ws == list(range(len(ws)))):
                # the class's lags 0..L-1 on both axes: one reduction over (L_h, L_w) windows
                # of the sources padded by L-1 in front (window element m is lag L-1-m)
                lh, lw = len(hs), len(ws)

                def wshift(t: torch.Tensor, value) -> torch.Tensor:
                    tp = aten.constant_pad_nd(t, [lw - 1, qw - ow, lh - 1, qh - oh], value)
                    return _window_views(tp, lh, lw, qh, qw, 1, 1)       # (..., qh, qw, lh, lw)
                acc = term(wshift, pos.unsqueeze(-1).unsqueeze(-1)).sum((-2, -1))
                hs = ws = []   # (done: no unrolled terms)
            for lag_h in lags_h:
                for lag_w in lags_w:
                    if lag_h not in hs or lag_w not in ws:
                        continue   # (no window of the grid lags that far; or reduced above)

                    def shift(t: torch.Tensor, value, lag_h=lag_h, lag_w=lag_w) -> torch.Tensor:
                        return aten.constant_pad_nd(t, [lag_w, qw - ow - lag_w, lag_h, qh - oh - lag_h], value)
                    part = term(shift, pos)
                    acc = part if acc is None else acc + part
            if acc is None:   # a residue no window reaches (stride beyond the window)
                acc = grad.new_zeros(tuple(grad.shape[:-2]) + (qh, qw))
            cols.append(acc)
        rows.append(torch.stack(cols, dim=-1).flatten(-2))         # (..., qh, qw * sw)
    full = torch.stack(rows, dim=-2).flatten(-3, -2)               # (..., qh * sh, qw * sw)
    return full[..., ph: ph + h, pw: pw + w]


def slice_backward(grad: torch.Tensor, input_sizes: Sequence[int], dim: int, start: int | None, end: int | None,
                   step: int) -> torch.Tensor | NotImplementedType:
    if step == 1:
        return NotImplemented
    dim %= len(input_sizes)
    n = input_sizes[dim]
    start = 0 if start is None else (start + n if start < 0 else start)
    start = min(max(start, 0), n)
    m = grad.shape[dim]
    if m == 0:
        return grad.new_zeros(input_sizes)
    # interleave step-1 zeros after each element: (.., m, step) -> (.., m * step)
    zshape = list(grad.shape[:dim + 1]) + [step - 1] + list(grad.shape[dim + 1:])
    g = torch.cat([grad.unsqueeze(dim + 1), grad.new_zeros(zshape)], dim + 1).flatten(dim, dim + 1)
    keep = min(m * step, n - start)
    g = g.narrow(dim, 0, keep)
    return aten.slice_backward(g, input_sizes, dim, start, start + keep, 1)


def _counts(h: int, w: int, oh: int, ow: int, kh: int, kw: int, sh: int, sw: int, ph: int, pw: int,
            include_pad: bool, device) -> torch.Tensor:
    """avg_pool2d's divisor per output position, (oh, ow): window elements inside the
    padded input (count_include_pad) or inside the input."""
    def along(o, n, k, s, p):
        start = torch.arange(o, device=device) * s - p
        end = torch.clamp_max(start + k, n + p)
        if not include_pad:
            start = torch.clamp_min(start, 0)
            end = torch.clamp_max(end, n)
        return end - start
    return (along(oh, h, kh, sh, ph).unsqueeze(1) * along(ow, w, kw, sw, pw).unsqueeze(0))


def _avg_setup(x, kernel_size, stride, padding, ceil_mode):
    kh, kw = _pair(kernel_size)
    sh, sw = _pair(stride, (kh, kw))
    ph, pw = _pair(padding, 0)
    h, w = x.shape[-2], x.shape[-1]
    oh, ow = _out_size(h, kh, sh, ph, 1, ceil_mode), _out_size(w, kw, sw, pw, 1, ceil_mode)
    return kh, kw, sh, sw, ph, pw, h, w, oh, ow


def avg_pool2d(x: torch.Tensor, kernel_size: Sequence[int], stride: Sequence[int] = (),
               padding: int | Sequence[int] = 0, ceil_mode: bool = False, count_include_pad: bool = True,
               divisor_override: int | None = None) -> torch.Tensor | NotImplementedType:
    if not (x.is_floating_point() or _integer(x, avg=True)):
        return NotImplemented
    kh, kw, sh, sw, ph, pw, h, w, oh, ow = _avg_setup(x, kernel_size, stride, padding, ceil_mode)
    hp, wp = (oh - 1) * sh + kh, (ow - 1) * sw + kw
    if _integer(x):
        # eager sums integers in int64 and divides with C's truncating quotient
        total = _box_sum(_padded(x.to(torch.int64), ph, pw, hp, wp, 0), kh, kw, oh, ow, sh, sw)
        div = divisor_override or _counts(h, w, oh, ow, kh, kw, sh, sw, ph, pw, count_include_pad, x.device)
        return torch.div(total, div, rounding_mode="trunc").to(x.dtype)
    total = _box_sum(_padded(x, ph, pw, hp, wp, 0.0), kh, kw, oh, ow, sh, sw)
    if divisor_override:
        return total / divisor_override
    return total / _counts(h, w, oh, ow, kh, kw, sh, sw, ph, pw, count_include_pad, x.device).to(x.dtype)


def _integer(x: torch.Tensor, avg: bool = False) -> bool:
    """An integer tensor (not bool): max pools take them; the average pools int64 only
    (eager's CPU kernels; no other integer type has eager semantics to follow)."""
    if avg:
        return x.dtype == torch.int64
    return not (x.is_floating_point() or x.is_complex() or x.dtype == torch.bool)


def _lowest(x: torch.Tensor) -> float | int:
    """The padding of a maximum: -inf, or an integer type's minimum."""
    return -math.inf if x.is_floating_point() else torch.iinfo(x.dtype).min


def _box_sum(xp: torch.Tensor, kh: int, kw: int, oh: int, ow: int, sh: int, sw: int) -> torch.Tensor:
    """Each window's sum over the padded `xp`."""
    if kh * kw > UNROLL_MAX_WINDOW:
        return _window_views(xp, kh, kw, oh, ow, sh, sw).sum((-2, -1))
    total = None
    for i in range(kh):
        for j in range(kw):
            win = _window(xp, i, j, oh, ow, sh, sw)
            total = win if total is None else total + win
    return total


def avg_pool2d_backward(grad: torch.Tensor, x: torch.Tensor | SimpleNamespace, kernel_size: Sequence[int],
                        stride: Sequence[int], padding: int | Sequence[int], ceil_mode: bool, count_include_pad: bool,
                        divisor_override: int | None) -> torch.Tensor | NotImplementedType:
    if not grad.is_floating_point():
        return NotImplemented
    kh, kw, sh, sw, ph, pw, h, w, oh, ow = _avg_setup(x, kernel_size, stride, padding, ceil_mode)
    if divisor_override:
        g = grad / divisor_override
    else:
        g = grad / _counts(h, w, oh, ow, kh, kw, sh, sw, ph, pw, count_include_pad, x.device).to(grad.dtype)
    return _unpool(lambda shift, pos: shift(g, 0.0), g, kh, kw, sh, sw, ph, pw, 1, 1, h, w).contiguous(
        memory_format=_memory_format(x))


def _max_setup(x, kernel_size, stride, padding, dilation, ceil_mode):
    kh, kw = _pair(kernel_size)
    sh, sw = _pair(stride, (kh, kw))
    ph, pw = _pair(padding, 0)
    dh, dw = _pair(dilation, 1)
    h, w = x.shape[-2], x.shape[-1]
    oh, ow = _out_size(h, kh, sh, ph, dh, ceil_mode), _out_size(w, kw, sw, pw, dw, ceil_mode)
    hp, wp = (oh - 1) * sh + dh * (kh - 1) + 1, (ow - 1) * sw + dw * (kw - 1) + 1
    return kh, kw, sh, sw, ph, pw, dh, dw, h, w, oh, ow, hp, wp


def _inside(oh, ow, sh, sw, ph, pw, i, j, h, w, device) -> torch.Tensor:
    """Per output position, whether window offset (i, j) lies inside the input."""
    r = torch.arange(oh, device=device).unsqueeze(1) * sh + (i - ph)
    c = torch.arange(ow, device=device).unsqueeze(0) * sw + (j - pw)
    return (r >= 0) & (r < h) & (c >= 0) & (c < w)


def max_pool2d_with_indices(x: torch.Tensor, kernel_size: Sequence[int], stride: Sequence[int] = (),
                            padding: int | Sequence[int] = 0, dilation: int | Sequence[int] = 1,
                            ceil_mode: bool = False) -> tuple[torch.Tensor, torch.Tensor] | NotImplementedType:
    if not (x.is_floating_point() or _integer(x)) or x.dim() not in (3, 4):
        return NotImplemented
    kh, kw, sh, sw, ph, pw, dh, dw, h, w, oh, ow, hp, wp = _max_setup(x, kernel_size, stride, padding,
                                                                      dilation, ceil_mode)
    low = _lowest(x)   # (an integer window of minima takes its first position inside, as -inf's)
    xp = _padded(x, ph, pw, hp, wp, low)
    if kh * kw > UNROLL_MAX_WINDOW:
        return _max_pool_reduced(x, xp, kh, kw, sh, sw, ph, pw, dh, dw, h, w, oh, ow)
    offsets = [(i, j) for i in range(kh) for j in range(kw)]
    # The window offset of each maximum, numbered i * kw + j, in one byte where it fits; the
    # flat index is exact integer arithmetic on it.  A training graph's partition then saves
    # the offsets (1 byte an output) and the backward recomputes the index (8 bytes):
    # `capture/partition.py` lets a backward comparison read recomputed integer arithmetic.
    code = torch.int8 if kh * kw <= 127 else torch.int32
    # eager's index of an all -inf window is its first position inside the input
    first = None
    for i, j in reversed(offsets):
        inside = _inside(oh, ow, sh, sw, ph, pw, i * dh, j * dw, h, w, x.device)
        here = torch.full(inside.shape, i * kw + j, dtype=code, device=x.device)
        first = here if first is None else torch.where(inside, here, first)
    best = torch.full_like(_window(xp, 0, 0, oh, ow, sh, sw), low)
    k = first.expand(best.shape)
    for i, j in offsets:
        v = _window(xp, i * dh, j * dw, oh, ow, sh, sw)
        take = (v > best) | torch.isnan(v)  # the first maximum wins; NaN propagates, as in eager
        best = torch.where(take, v, best)
        k = torch.where(take, i * kw + j, k)
    return _with_flat_index(x, best, k, kw, sh, sw, ph, pw, dh, dw, h, w, oh, ow)


def _with_flat_index(x, best, k, kw, sh, sw, ph, pw, dh, dw, h, w, oh, ow):
    """(maximum, eager's flat input index) from each maximum's window offset `k` = i*kw + j."""
    # (in int32, which divides by a constant in a multiply and a shift: int64 takes ~20
    # instructions, nine times an element where the backward recomputes it)
    wide = torch.int32 if h * w < 2**31 else torch.int64
    k = _eager_layout(k, x).to(wide)
    # (k >= 0: truncating division and fmod, without floor division's sign fix-ups)
    r = torch.arange(oh, device=x.device, dtype=wide).unsqueeze(1) * sh - ph + \
        torch.div(k, kw, rounding_mode="trunc") * dh
    c = torch.arange(ow, device=x.device, dtype=wide).unsqueeze(0) * sw - pw + torch.fmod(k, kw) * dw
    return _eager_layout(best, x), _eager_layout((r * w + c).to(torch.int64), x)


def _max_pool_reduced(x, xp, kh, kw, sh, sw, ph, pw, dh, dw, h, w, oh, ow):
    """A large window's maximum and its index as reductions over the window axes.  The
    index is eager's: the first maximum in row-major window order, the last NaN where the
    window holds one (eager takes `v > best || isnan(v)`), and for an all -inf window its
    first position inside the input (not the -inf padding)."""
    win = _window_views(xp, kh, kw, oh, ow, sh, sw, dh, dw)                  # (..., oh, ow, kh, kw)
    best = win.amax((-2, -1))
    code = (torch.arange(kh, device=x.device).unsqueeze(1) * kw + torch.arange(kw, device=x.device)).to(torch.int32)
    first_max = torch.where(win == best.unsqueeze(-1).unsqueeze(-1), code, kh * kw).amin((-2, -1))
    last_nan = torch.where(torch.isnan(win), code, -1).amax((-2, -1))
    # first offset inside the input per output row / column: i*d >= p - o*s
    oi = (ph - torch.arange(oh, device=x.device) * sh).clamp_min(0)
    oj = (pw - torch.arange(ow, device=x.device) * sw).clamp_min(0)
    first = (torch.div(oi + dh - 1, dh, rounding_mode="trunc").unsqueeze(1) * kw
             + torch.div(oj + dw - 1, dw, rounding_mode="trunc").unsqueeze(0)).to(torch.int32)
    k = torch.where(last_nan >= 0, last_nan, torch.where(best == _lowest(x), first, first_max))
    return _with_flat_index(x, best, k, kw, sh, sw, ph, pw, dh, dw, h, w, oh, ow)


def _memory_format(x) -> torch.memory_format:
    """channels_last for a 4-d channels-last tensor (not contiguous), else contiguous."""
    if isinstance(x, torch.Tensor) and x.dim() == 4 and not x.is_contiguous() and \
            x.is_contiguous(memory_format=torch.channels_last):
        return torch.channels_last
    return torch.contiguous_format


def _eager_layout(out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Pooling results laid out as eager's are (contiguous, or channels_last for a
    channels_last input), not as the strided slices of a transposed input left them:
    code after the op may `.view` them (max_unpool's backward views the indices)."""
    return out.contiguous(memory_format=_memory_format(x))


def max_pool2d_with_indices_backward(grad: torch.Tensor, x: torch.Tensor, kernel_size: Sequence[int],
                                     stride: Sequence[int], padding: int | Sequence[int],
                                     dilation: int | Sequence[int], ceil_mode: bool,
                                     indices: torch.Tensor) -> torch.Tensor | NotImplementedType:
    if not grad.is_floating_point() or x.dim() not in (3, 4):
        return NotImplemented
    kh, kw, sh, sw, ph, pw, dh, dw, h, w, oh, ow, hp, wp = _max_setup(x, kernel_size, stride, padding,
                                                                      dilation, ceil_mode)
    def term(shift, pos: torch.Tensor) -> torch.Tensor:
        # (-1 outside the windows: no input position; a position in the padding matches
        # nothing either, and is cropped)
        return torch.where(shift(indices, -1) == pos, shift(grad, 0.0), 0.0)
    return _unpool(term, grad, kh, kw, sh, sw, ph, pw, dh, dw, h, w).contiguous(memory_format=_memory_format(x))


def _adaptive_avg_pool2d_backward(grad, x):
    """Windows [floor(o*n/out), ceil((o+1)*n/out)): when they tile the input evenly
    this is avg_pool2d's backward (strided windows); other sizes the per-axis gather
    form (`_adaptive_avg_backward`)."""
    h, w = x.shape[-2], x.shape[-1]
    oh, ow = grad.shape[-2], grad.shape[-1]
    if _symbolic(h, w, oh, ow) or h % oh or w % ow:
        return _adaptive_avg_backward(grad, x.shape, 2)
    k = (h // oh, w // ow)
    return avg_pool2d_backward(grad, x, k, k, 0, False, True, None)


# ------------------------------------------------------------ 1-d and 3-d pooling
# A 1-d window is a (1, k) window of the 2-d forms.  A 3-d box is separable: the 2-d
# window over (H, W), then a 1-d window over D (moved last).  Sums and maxima compose,
# and so do the averages' divisors: the valid count of a box is the product of its
# per-axis counts, with or without padding counted, in ceil mode too.

def _triple(v, default=None) -> tuple[int, int, int]:
    if v is None or (isinstance(v, (list, tuple)) and len(v) == 0):
        v = default
    if isinstance(v, int):
        return (v, v, v)
    return tuple(v) * 3 if len(v) == 1 else tuple(v)


def _shaped(shape, device) -> SimpleNamespace:
    """What the 2-d backwards read of their input: its shape and device."""
    return SimpleNamespace(shape=tuple(shape), device=device)


def avg_pool1d(x: torch.Tensor, kernel_size: Sequence[int], stride: Sequence[int] = (),
               padding: int | Sequence[int] = 0, ceil_mode: bool = False,
               count_include_pad: bool = True) -> torch.Tensor | NotImplementedType:
    (k,), (p,) = tuple(kernel_size), _one(padding, 0)
    (s,) = _one(stride, k)
    out = avg_pool2d(x.unsqueeze(-2), (1, k), (1, s), (0, p), ceil_mode, count_include_pad)
    return out if out is NotImplemented else out.squeeze(-2)


def _one(v, default) -> tuple[int]:
    if v is None or (isinstance(v, (list, tuple)) and len(v) == 0):
        return (default,)
    return (v,) if isinstance(v, int) else (v[0],)


def adaptive_avg_pool1d(x: torch.Tensor, output_size: Sequence[int]) -> torch.Tensor | NotImplementedType:
    n, (o,) = x.shape[-1], _one(output_size, 1)
    if _symbolic(n, o) or n % o:
        return _adaptive_avg(x, (o,))
    return avg_pool1d(x, (n // o,), (n // o,))


def avg_pool3d(x: torch.Tensor, kernel_size: Sequence[int], stride: Sequence[int] = (),
               padding: int | Sequence[int] = 0, ceil_mode: bool = False, count_include_pad: bool = True,
               divisor_override: int | None = None) -> torch.Tensor | NotImplementedType:
    """With divisor_override: box sums (both stages divide by 1), then the divisor.
    Integers: box sums in int64, then one truncating division by the 3-d window's count
    (eager's; two stages of truncation would round twice)."""
    if not (x.is_floating_point() or _integer(x, avg=True)):
        return NotImplemented
    (kd, kh, kw), (pd, ph, pw) = _triple(kernel_size), _triple(padding, 0)
    sd, sh, sw = _triple(stride, (kd, kh, kw))
    if _integer(x):
        y = avg_pool2d(x.to(torch.int64), (kh, kw), (sh, sw), (ph, pw), ceil_mode, count_include_pad, 1)
        z = avg_pool2d(y.movedim(-3, -1), (1, kd), (1, sd), (0, pd), ceil_mode, count_include_pad, 1).movedim(-1, -3)
        if divisor_override:
            return torch.div(z, divisor_override, rounding_mode="trunc").to(x.dtype)
        d, h, w = x.shape[-3:]
        od, oh, ow = z.shape[-3:]
        per_d = _counts(d, 1, od, 1, kd, 1, sd, 1, pd, 0, count_include_pad, x.device)              # (od, 1)
        per_hw = _counts(h, w, oh, ow, kh, kw, sh, sw, ph, pw, count_include_pad, x.device)        # (oh, ow)
        return torch.div(z, per_d.unsqueeze(-1) * per_hw, rounding_mode="trunc").to(x.dtype)
    one = 1 if divisor_override else None
    y = avg_pool2d(x, (kh, kw), (sh, sw), (ph, pw), ceil_mode, count_include_pad, one)      # (..., D, oh, ow)
    z = avg_pool2d(y.movedim(-3, -1), (1, kd), (1, sd), (0, pd), ceil_mode, count_include_pad, one)
    z = z.movedim(-1, -3)
    return z / divisor_override if divisor_override else z


def avg_pool3d_backward(grad: torch.Tensor, x: torch.Tensor, kernel_size: Sequence[int], stride: Sequence[int],
                        padding: int | Sequence[int], ceil_mode: bool, count_include_pad: bool,
                        divisor_override: int | None) -> torch.Tensor | NotImplementedType:
    if not grad.is_floating_point():
        return NotImplemented
    (kd, kh, kw), (pd, ph, pw) = _triple(kernel_size), _triple(padding, 0)
    sd, sh, sw = _triple(stride, (kd, kh, kw))
    oh, ow = grad.shape[-2], grad.shape[-1]
    one = 1 if divisor_override else None
    if divisor_override:
        grad = grad / divisor_override
    y_moved = _shaped(tuple(x.shape[:-3]) + (oh, ow, x.shape[-3]), x.device)            # (..., oh, ow, D)
    gy = avg_pool2d_backward(grad.movedim(-3, -1), y_moved, (1, kd), (1, sd), (0, pd), ceil_mode,
                             count_include_pad, one).movedim(-1, -3)                       # (..., D, oh, ow)
    return avg_pool2d_backward(gy, x, (kh, kw), (sh, sw), (ph, pw), ceil_mode, count_include_pad, one)


def max_pool3d_with_indices(x: torch.Tensor, kernel_size: Sequence[int], stride: Sequence[int] = (),
                            padding: int | Sequence[int] = 0, dilation: int | Sequence[int] = 1,
                            ceil_mode: bool = False) -> tuple[torch.Tensor, torch.Tensor] | NotImplementedType:
    """Max over (H, W) per depth slice with its flat h*W+w index, then max over D of
    those (the first maximum in (d, h, w) order wins, NaN propagates, as in eager)."""
    if not (x.is_floating_point() or _integer(x)) or x.dim() not in (4, 5):
        return NotImplemented
    (kd, kh, kw), (pd, ph, pw) = _triple(kernel_size), _triple(padding, 0)
    sd, sh, sw = _triple(stride, (kd, kh, kw))
    dd, dh, dw = _triple(dilation, 1)
    lead, (d, h, w) = tuple(x.shape[:-3]), tuple(x.shape[-3:])
    x4 = x.reshape((-1, d, h, w))
    y, i2 = max_pool2d_with_indices(x4, (kh, kw), (sh, sw), (ph, pw), (dh, dw), ceil_mode)   # (B, D, oh, ow)
    z, iz = max_pool2d_with_indices(y.movedim(1, -1), (1, kd), (1, sd), (0, pd), (1, dd), ceil_mode)
    depth = iz % d                                                                             # (B, oh, ow, od)
    idx = depth * (h * w) + torch.gather(i2.movedim(1, -1), -1, depth)
    out_shape = lead + (z.shape[-1], z.shape[1], z.shape[2])
    return z.movedim(-1, 1).reshape(out_shape), idx.movedim(-1, 1).reshape(out_shape)


def max_pool3d_with_indices_backward(grad: torch.Tensor, x: torch.Tensor, kernel_size: Sequence[int],
                                     stride: Sequence[int], padding: int | Sequence[int],
                                     dilation: int | Sequence[int], ceil_mode: bool,
                                     indices: torch.Tensor) -> torch.Tensor | NotImplementedType:
    """Each output's gradient added at its input position (the scatter-add form; windows
    overlap when the stride is below the kernel, so positions repeat)."""
    if not grad.is_floating_point() or x.dim() not in (4, 5):
        return NotImplemented
    b = x.numel() // max(x.shape[-3] * x.shape[-2] * x.shape[-1], 1)
    flat = grad.new_zeros((b, x.shape[-3] * x.shape[-2] * x.shape[-1]))
    out = flat.scatter_add(1, indices.reshape(b, -1), grad.reshape(b, -1))
    return out.reshape(x.shape)


def _adaptive_avg_pool3d(x, output_size):
    """Windows that tile the input evenly: avg_pool3d; other sizes the gather form."""
    sizes, outs = x.shape[-3:], _triple(output_size)
    if _symbolic(*sizes, *outs) or any(n % o for n, o in zip(sizes, outs)):
        return _adaptive_avg(x, outs)
    k = tuple(n // o for n, o in zip(sizes, outs))
    return avg_pool3d(x, k, k)


def _adaptive_avg_pool3d_backward(grad, x):
    sizes, outs = x.shape[-3:], grad.shape[-3:]
    if _symbolic(*sizes, *outs) or any(n % o for n, o in zip(sizes, outs)):
        return _adaptive_avg_backward(grad, x.shape, 3)
    k = tuple(n // o for n, o in zip(sizes, outs))
    return avg_pool3d_backward(grad, x, k, k, 0, False, True, None)


# ------------------------------------------- adaptive windows that do not tile evenly
# Output o of an axis of n inputs averages (or maximises) inputs [start_o, end_o) with
# start_o = floor(o·n/out), end_o = ceil((o+1)·n/out): windows of unequal length, at most
# K long.  Each axis is a gather of a (out, K) index (clamped, with a validity mask)
# reduced over K — one reduction kernel per axis.  Averages and maxima are separable
# (a box window is the product of its axis windows), so n-d pooling is the 1-d form
# applied axis after axis.  With static sizes K is the longest window; where the input
# or the output size is symbolic, a bound (masked), so no guard on n % out or on the
# sizes' equality makes Dynamo compile the graph again per size class.

def _windows(n: int, out: int) -> tuple[list[int], list[int]]:
    return [o * n // out for o in range(out)], [-(-(o + 1) * n // out) for o in range(out)]


def _axis_index(n: int, out: int, device):
    """(index (out, K) clamped into [0, n), valid (out, K), count (out,)).  K is the
    longest window for static sizes; where n or out is dynamic the bound n // out + 2 (a
    window spans less than n/out + 2 inputs), its extra positions masked — no guard."""
    if not _symbolic(n, out):
        starts, ends = _windows(n, out)
        k = max(e - s for s, e in zip(starts, ends))
    else:
        k = n // out + 2
    o = torch.arange(out, device=device)
    start, end = (o * n) // out, ((o + 1) * n + out - 1) // out
    idx = start.unsqueeze(1) + torch.arange(k, device=device).unsqueeze(0)
    valid = idx < end.unsqueeze(1)
    return torch.clamp_max(idx, n - 1), valid, end - start


def _adaptive_avg_axis(x: torch.Tensor, axis: int, out: int) -> torch.Tensor:
    n = x.shape[axis]
    idx, valid, count = _axis_index(n, out, x.device)
    xm = x.movedim(axis, -1)
    win = torch.where(valid, xm[..., idx], torch.zeros((), dtype=x.dtype, device=x.device))
    return (win.sum(-1) / count.to(x.dtype)).movedim(-1, axis)


def _adaptive_avg_axis_backward(grad: torch.Tensor, axis: int, n: int) -> torch.Tensor:
    """The adjoint of `_adaptive_avg_axis` as a gather: input w lies in the windows
    o = floor(w·out/n) + j, j < J, those with start_o <= w (and o < out) — no atomics."""
    out = grad.shape[axis]
    if not _symbolic(n, out):
        starts, ends = _windows(n, out)
        cover = [0] * n
        for s_, e in zip(starts, ends):
            for w in range(s_, e):
                cover[w] += 1
        j_max = max(cover)
    else:   # a dynamic size: at most out // n + 2 windows hold an input (extra ones masked)
        j_max = out // n + 2
    w = torch.arange(n, device=grad.device)
    o = ((w * out) // n).unsqueeze(1) + torch.arange(j_max, device=grad.device).unsqueeze(0)
    valid = (o < out) & ((o * n) // out <= w.unsqueeze(1))
    o = torch.clamp_max(o, out - 1)
    count = (((o + 1) * n + out - 1) // out - (o * n) // out).to(grad.dtype)
    gm = grad.movedim(axis, -1)
    share = torch.where(valid, gm[..., o] / count, torch.zeros((), dtype=grad.dtype, device=grad.device))
    return share.sum(-1).movedim(-1, axis)


def _static(*sizes) -> bool:
    """Static, non-zero sizes (K and the cover count are kernel constants)."""
    return all(isinstance(v, int) and v > 0 for v in sizes)


def _symbolic(*sizes) -> bool:
    return any(isinstance(v, torch.SymInt) for v in sizes)


def _sized(inputs, outs) -> bool:
    """Adaptive windows need non-zero sizes, static or dynamic (a SymInt: K and the cover
    count become bounds, `_axis_index`); a dynamic output size is checked non-zero at run
    time (`torch._check`: Dynamo proves it for sizes such as h // 2 + 1)."""
    for v in (*inputs, *outs):
        if isinstance(v, torch.SymInt):
            torch._check(v > 0, lambda: "adaptive pooling to an empty output")
        elif not (isinstance(v, int) and v > 0):
            return False
    return True


def _adaptive_avg(x: torch.Tensor, outs) -> torch.Tensor:
    spatial = len(outs)
    if not x.is_floating_point() or not _sized(x.shape[-spatial:], outs):
        return NotImplemented
    for i, out in enumerate(outs):
        axis = x.dim() - spatial + i
        if not _symbolic(x.shape[axis], out) and x.shape[axis] == out:   # (no guard on dynamic sizes)
            continue
        if isinstance(out, int) and out == 1:     # (global pooling: one window, the mean)
            x = x.mean(axis, keepdim=True)
        else:
            x = _adaptive_avg_axis(x, axis, out)
    return x


def _adaptive_avg_pool2d(x, output_size):
    """torch's decomposition for static sizes; under dynamic sizes the per-axis window
    gathers (`_adaptive_avg`), whose K is a bound: torch's guards on `n % out` would
    recompile the graph for every size class."""
    outs = tuple(output_size)
    if _symbolic(*x.shape[-2:], *outs):
        out = _adaptive_avg(x, outs)
        if out is not NotImplemented:
            return out
    from torch._decomp import decomposition_table as torch_table
    return torch_table[aten._adaptive_avg_pool2d.default](x, output_size)


def _adaptive_avg_backward(grad: torch.Tensor, input_shape, spatial: int) -> torch.Tensor:
    if not grad.is_floating_point() or not _sized(input_shape[-spatial:], grad.shape[-spatial:]):
        return NotImplemented
    for i in range(spatial):
        axis = grad.dim() - spatial + i
        n = input_shape[axis]
        if _symbolic(n, grad.shape[axis]) or grad.shape[axis] != n:   # (no guard on a dynamic size)
            grad = _adaptive_avg_axis_backward(grad, axis, n)
    return grad


def _adaptive_max_axis(x: torch.Tensor, axis: int, out: int):
    """Maximum and its position along one axis (the first maximum; NaN wins)."""
    n = x.shape[axis]
    idx, valid, _ = _axis_index(n, out, x.device)
    xm = x.movedim(axis, -1)
    low = torch.full((), -math.inf, dtype=x.dtype, device=x.device)
    vals, k = torch.where(valid, xm[..., idx], low).max(-1)
    at = torch.gather(idx.expand(k.shape + idx.shape[-1:]), -1, k.unsqueeze(-1)).squeeze(-1)
    return vals.movedim(-1, axis), at.movedim(-1, axis)


def _adaptive_max(x: torch.Tensor, outs):
    """Values and flat positions in the input's spatial plane: maximum along the last
    axis first, then along each earlier one, each step carrying the position of the
    maximum found so far (first in row-major order wins a tie)."""
    spatial = len(outs)
    if not x.is_floating_point() or not _sized(x.shape[-spatial:], outs):
        return NotImplemented
    sizes = tuple(x.shape[-spatial:])
    vals, pos = x, None
    for i in reversed(range(spatial)):
        axis = x.dim() - spatial + i
        vals, at = _adaptive_max_axis(vals, axis, outs[i])
        plane = math.prod(sizes[i + 1:])
        # the inner position found so far, taken at the chosen index of this axis
        pos = at if pos is None else torch.gather(pos, axis, at) + at * plane
    return vals, pos


# ------------------------------------------------ antialiased bilinear resampling
# `_upsample_bilinear2d_aa` (torchvision's Resize(antialias=True) on tensors) is
# separable: along each axis output o averages inputs [xmin_o, xmin_o + xsize_o) with
# triangle weights, normalised to sum 1 — eager's formulas: scale = in/out (1/scale
# when given; (in-1)/(out-1) with align_corners), support = max(scale, 1), center =
# scale·(o + 0.5), xmin = trunc(center - support + 0.5) clamped at 0, xmax =
# trunc(center + support + 0.5) clamped at in, weight of input j = max(0, 1 - |(j -
# center + 0.5) / max(scale, 1)|).  Per axis: a gather of K = max window length
# clamped indices, weighted and reduced (one kernel); the backward adds each output's
# gradient times its weights back at its window (index_add: the scatter-add form).

def _aa_scale(n: int, out: int, align_corners: bool, scale) -> float:
    if align_corners:
        return (n - 1) / (out - 1) if out > 1 else 0.0
    return 1.0 / scale if scale is not None and scale > 0 else n / out


def _aa_axis(n: int, out: int, scale: float, device, dtype):
    """(clamped indices (out, K), normalised weights (out, K)) of one axis."""
    support = scale if scale >= 1.0 else 1.0
    invscale = 1.0 / scale if scale >= 1.0 else 1.0
    k = 0
    for o in range(out):  # the longest window (Python floats; one more lane is harmless)
        c = scale * (o + 0.5)
        k = max(k, min(int(c + support + 0.5), n) - max(int(c - support + 0.5), 0))
    k += 1
    center = (torch.arange(out, device=device, dtype=dtype) + 0.5) * scale
    xmin = torch.clamp_min((center - support + 0.5).to(torch.int64), 0)
    xmax = torch.clamp_max((center + support + 0.5).to(torch.int64), n)
    j = xmin.unsqueeze(1) + torch.arange(k, device=device).unsqueeze(0)
    w = torch.clamp_min(1.0 - ((j.to(dtype) - center.unsqueeze(1) + 0.5) * invscale).abs(), 0.0)
    w = torch.where(j < xmax.unsqueeze(1), w, torch.zeros((), dtype=dtype, device=device))
    total = w.sum(1, keepdim=True)
    w = torch.where(total != 0, w / total, w)
    return torch.clamp_max(j, n - 1), w


def _aa_scales(input_size, output_size, align_corners, scales_h, scales_w):
    (h, w), (oh, ow) = input_size[-2:], output_size
    return (_aa_scale(h, oh, align_corners, scales_h), _aa_scale(w, ow, align_corners, scales_w))


def upsample_bilinear2d_aa(x: torch.Tensor, output_size: Sequence[int], align_corners: bool,
                           scales_h: float | None = None,
                           scales_w: float | None = None) -> torch.Tensor | NotImplementedType:
    if not x.is_floating_point() or not _static(*x.shape[-2:], *output_size):
        return NotImplemented
    wt = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
    sh, sw = _aa_scales(x.shape, output_size, align_corners, scales_h, scales_w)
    y = x.to(wt)
    for axis, n, out, sc in ((-1, x.shape[-1], output_size[1], sw), (-2, x.shape[-2], output_size[0], sh)):
        j, w = _aa_axis(n, out, sc, x.device, wt)
        ym = y.movedim(axis, -1)
        y = (ym[..., j] * w).sum(-1).movedim(-1, axis)
    return y.to(x.dtype)


def upsample_bilinear2d_aa_backward(grad: torch.Tensor, output_size: Sequence[int], input_size: Sequence[int],
                                    align_corners: bool, scales_h: float | None = None,
                                    scales_w: float | None = None) -> torch.Tensor | NotImplementedType:
    if not grad.is_floating_point() or not _static(*input_size[-2:], *output_size):
        return NotImplemented
    wt = torch.float32 if grad.dtype in (torch.float16, torch.bfloat16) else grad.dtype
    sh, sw = _aa_scales(input_size, output_size, align_corners, scales_h, scales_w)
    g = grad.to(wt)
    for axis, n, out, sc in ((-2, input_size[-2], output_size[0], sh), (-1, input_size[-1], output_size[1], sw)):
        j, w = _aa_axis(n, out, sc, grad.device, wt)
        gm = g.movedim(axis, -1)                                   # (..., out)
        share = (gm.unsqueeze(-1) * w).flatten(-2)                 # (..., out·K)
        acc = torch.zeros(gm.shape[:-1] + (n,), dtype=wt, device=grad.device)
        g = acc.index_add(-1, j.flatten(), share).movedim(-1, axis)
    return g.to(grad.dtype)


# ------------------------------------------------------------- other backwards

def weight_norm_backward(grad_w: torch.Tensor, saved_v: torch.Tensor, saved_g: torch.Tensor, saved_norms: torch.Tensor,
                         dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """w = v * g / |v| (norm over every dim but `dim`): the two gradients in closed form."""
    dims = [d for d in range(saved_v.dim()) if d != dim % max(saved_v.dim(), 1)]
    dot = (grad_w * saved_v).sum(dims, keepdim=True)
    grad_g = (dot / saved_norms).to(saved_g.dtype)
    grad_v = (saved_g / saved_norms) * (grad_w - saved_v * (dot / (saved_norms * saved_norms)))
    return grad_v, grad_g


def _add_at(grad, input_shape, rows: torch.Tensor, cols: torch.Tensor):
    """The adjoint of x[..., rows[:, None], cols[None, :]]: an index_put with accumulate."""
    zero = grad.new_zeros(input_shape)
    return aten.index_put(zero, [None] * (grad.dim() - 2) + [rows.unsqueeze(1), cols.unsqueeze(0)], grad, True)


def upsample_nearest2d_backward(grad: torch.Tensor, output_size: Sequence[int], input_size: Sequence[int],
                                scales_h: float | None = None, scales_w: float | None = None) -> torch.Tensor:
    h, w = input_size[-2], input_size[-1]
    oh, ow = output_size

    def src(o, n, scale):
        s = (1.0 / scale) if scale else n / o
        return torch.clamp_max((torch.arange(o, device=grad.device, dtype=torch.float32) * s).to(torch.int64), n - 1)
    return _add_at(grad, input_size, src(oh, h, scales_h), src(ow, w, scales_w))


def _replication_pad_backward(spatial: int):
    """Replication padding's adjoint, axis by axis (padding lists the last axis first):
    the gradient at the positions that copy an input element one to one, plus at the
    first (last) element the sum of the gradient of the copies padded before (after)
    it; a negative pad crops, and the cropped inputs get zero — slices, two small
    reductions and pads, a gather form: no atomics, deterministic."""
    def backward(grad, x, padding):
        pads = list(padding)
        for i in range(spatial):
            axis = grad.dim() - 1 - i
            before, after = pads[2 * i], pads[2 * i + 1]
            n = x.shape[axis]
            lo, hi = max(-before, 0), n - max(-after, 0)       # inputs that reach the output
            if hi <= lo:
                # output j copies input clamp(j - before, 0, n - 1): with every input
                # cropped on one side, all copy the one at the other end (before <= -n:
                # the last; after <= -n: the first), which takes the whole gradient
                grad = _at_end(grad.sum(axis, keepdim=True), axis, n, first=before >= 0)
                continue
            mid = grad.narrow(axis, max(before, 0), hi - lo)
            if before > 0:
                head = grad.narrow(axis, 0, before).sum(axis, keepdim=True)
                mid = mid + _at_end(head, axis, hi - lo, first=True)
            if after > 0:
                tail = grad.narrow(axis, grad.shape[axis] - after, after).sum(axis, keepdim=True)
                mid = mid + _at_end(tail, axis, hi - lo, first=False)
            if lo or hi < n:   # cropped inputs: no gradient
                mid = aten.constant_pad_nd(mid, [0, 0] * (grad.dim() - 1 - axis) + [lo, n - hi], 0.0)
            grad = mid
        return grad
    return backward


def _at_end(v: torch.Tensor, axis: int, n: int, first: bool) -> torch.Tensor:
    """v (size 1 along axis) zero-padded to n along axis, at the first or last position."""
    pad = [0, 0] * (v.dim() - 1 - axis % v.dim()) + ([0, n - 1] if first else [n - 1, 0])
    return aten.constant_pad_nd(v, pad, 0.0)


def slice_scatter(x: torch.Tensor, src: torch.Tensor, dim: int = 0, start: int | None = None, end: int | None = None,
                  step: int = 1) -> torch.Tensor:
    """x with src written at x[start:end:step] along dim: src placed (slice_backward,
    zeros elsewhere) where a placed mask is set, x elsewhere.  Computed in x's memory
    order, so the result has x's strides as eager's `clone` of x does: functionalisation
    regenerates the views of a written view's base from this result (Longformer writes
    into a transposed view of a `view`ed buffer; a contiguous result cannot be `view`ed
    back)."""
    perm = _memory_order(x)
    dim = perm.index(dim % x.dim()) if x.dim() else 0
    xp, sp = x.permute(perm), src.permute(perm)
    n = xp.shape[dim]
    start, end = 0 if start is None else start, n if end is None else end
    placed = aten.slice_backward(sp.to(x.dtype), xp.shape, dim, start, end, step)
    hit = aten.slice_backward(torch.ones_like(sp, dtype=x.dtype if x.is_floating_point() else torch.float32,
                                              memory_format=torch.contiguous_format), xp.shape, dim, start, end, step)
    return torch.where(hit != 0, placed, xp).permute(invert_perm(perm))


def select_scatter(x: torch.Tensor, src: torch.Tensor, dim: int, index: int) -> torch.Tensor:
    """x with src written at x.select(dim, index): a slice scatter of one position, in
    x's memory order (see `slice_scatter`)."""
    dim = dim % x.dim()
    index = index + x.shape[dim] if index < 0 else index
    return slice_scatter(x, src.unsqueeze(dim), dim, index, index + 1, 1)


def _memory_order(x) -> list[int]:
    """x's dimensions from outermost to innermost in memory (ties: logical order)."""
    from torch._prims_common import compute_elementwise_output_logical_to_physical_perm
    return list(compute_elementwise_output_logical_to_physical_perm(x)[0]) if x.dim() else []


def _adaptive_max_pool_backward(spatial: int):
    """Adaptive max pooling's backward: each output gradient added at its window's
    maximum, `indices` being flat positions in the input's spatial plane (H*W, or D*H*W
    in 3-d): a scatter-add into the flattened plane (windows may overlap)."""
    def backward(grad, x, indices):
        flat_in = tuple(x.shape[:-spatial]) + (math.prod(x.shape[-spatial:]),)
        flat_out = tuple(grad.shape[:-spatial]) + (math.prod(grad.shape[-spatial:]),)
        acc = torch.zeros(flat_in, dtype=grad.dtype, device=grad.device)
        return acc.scatter_add(-1, indices.reshape(flat_out), grad.reshape(flat_out)).reshape(x.shape)
    return backward


def _adaptive_max_pool(spatial: int):
    """torch's decomposition where windows tile evenly (strided max pooling), else the
    per-axis gather form."""
    def forward(x, output_size):
        from torch._decomp import decomposition_table as torch_table
        op = aten.adaptive_max_pool2d.default if spatial == 2 else aten.adaptive_max_pool3d.default
        out = torch_table[op](x, output_size)
        if out is NotImplemented:
            out = _adaptive_max(x, tuple(output_size) if len(output_size) == spatial else
                                tuple(output_size) * spatial)
        return out
    return forward


# The reason an op still runs eagerly when a decomposition here (or torch's, for adaptive
# max pooling) declined the case (`fallback.no_rule_reason` reports it).
DECLINED: dict[object, str] = {
    op: "adaptive pooling of integers or to an empty output has no stitched form"
    for op in (aten.adaptive_max_pool2d.default, aten.adaptive_max_pool3d.default,
               aten._adaptive_avg_pool2d_backward.default, aten._adaptive_avg_pool3d.default,
               aten._adaptive_avg_pool3d_backward.default)
}


def table() -> dict:
    out = {
        aten.slice_backward.default: slice_backward,
        aten.slice_scatter.default: slice_scatter,
        aten.select_scatter.default: select_scatter,
        aten.avg_pool2d.default: avg_pool2d,
        aten.avg_pool2d_backward.default: avg_pool2d_backward,
        aten.max_pool2d_with_indices.default: max_pool2d_with_indices,
        aten.max_pool2d_with_indices_backward.default: max_pool2d_with_indices_backward,
        aten._adaptive_avg_pool2d.default: _adaptive_avg_pool2d,
        aten._adaptive_avg_pool2d_backward.default: _adaptive_avg_pool2d_backward,
        aten.avg_pool1d.default: avg_pool1d,
        aten.adaptive_avg_pool1d.default: adaptive_avg_pool1d,
        aten.avg_pool3d.default: avg_pool3d,
        aten.avg_pool3d_backward.default: avg_pool3d_backward,
        aten.max_pool3d_with_indices.default: max_pool3d_with_indices,
        aten.max_pool3d_with_indices_backward.default: max_pool3d_with_indices_backward,
        aten._adaptive_avg_pool3d.default: _adaptive_avg_pool3d,
        aten._adaptive_avg_pool3d_backward.default: _adaptive_avg_pool3d_backward,
        aten._weight_norm_interface_backward.default: weight_norm_backward,
        aten.upsample_nearest2d_backward.default: upsample_nearest2d_backward,
        aten.replication_pad1d_backward.default: _replication_pad_backward(1),
        aten.replication_pad2d_backward.default: _replication_pad_backward(2),
        aten.replication_pad3d_backward.default: _replication_pad_backward(3),
        aten._upsample_bilinear2d_aa.default: upsample_bilinear2d_aa,
        aten._upsample_bilinear2d_aa_backward.default: upsample_bilinear2d_aa_backward,
        aten.adaptive_max_pool2d.default: _adaptive_max_pool(2),
        aten.adaptive_max_pool3d.default: _adaptive_max_pool(3),
        aten.adaptive_max_pool2d_backward.default: _adaptive_max_pool_backward(2),
        aten.adaptive_max_pool3d_backward.default: _adaptive_max_pool_backward(3),
    }
    return out
