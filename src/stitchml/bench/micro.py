"""The micro suite: single memory-intensive patterns at sizes larger than L2.

Normalisations and softmax, forward and backward, at row lengths N in
{1024, 4096, 5000, 32768, 262144} with ~2^25 elements per tensor; bias+GELU;
residual+dropout+layer-norm; cross-entropy forward+backward over 32k and 128k
vocabularies; AStitch's irregular shapes (<750000,32> row sum, <64,30000> row
softmax); column sums; and AStitch's running example.  `--quick` keeps the case
families at tiny sizes (a few thousand elements).

Every case but the optimizer step (lists of tensors) also has a JAX version (used only
where JAX is installed).
"""
from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F

from .compare import compare, tolerance
from .workload import DTYPES, CaseSpec, CheckOutcome, JaxSpec, Workload, rand, randn

FULL_N = (1024, 4096, 5000, 32768, 262144)
QUICK_N = (1000,)          # not a power of two: masked tails are exercised
ELEMS = 2**25            # per [rows, N] tensor at full size: 128 MB fp32, well above L2
EPS_LN, EPS_RMS = 1e-5, 1e-6
DROPOUT_P = 0.1


# --------------------------------------------------------------------------- torch functions

def layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(x, (x.shape[-1],), w, b, EPS_LN)


def rms_norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    # LLaMA's form: normalise in float32, cast back, then scale
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS_RMS)).to(x.dtype) * w


def softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, -1)


def bias_gelu(x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.gelu(x + b)


def residual_dropout_layer_norm(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor,
                                b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # the residual sum is returned too: the next block adds to it
    h = r + F.dropout(x, DROPOUT_P, training=True)
    return h, F.layer_norm(h, (h.shape[-1],), w, b, EPS_LN)


def cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits, target)


def row_sum(x: torch.Tensor) -> torch.Tensor:
    return x.sum(-1)


def column_sum(x: torch.Tensor) -> torch.Tensor:
    return x.sum(0)


def cumsum_rows(x: torch.Tensor) -> torch.Tensor:
    """A prefix sum along rows (positions from a mask, MoE expert offsets): the scan form."""
    return torch.cumsum(x, -1)


def transpose_scale(x: torch.Tensor) -> torch.Tensor:
    """A key stored transposed for an attention product, scaled: reads along one dim,
    writes along the other (the tiled transpose form)."""
    return (x.t() * 0.125).contiguous()


def rotary(q: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """LLaMA's rotate-half rotary embedding of the queries, [batch, seq, heads*64] to
    [batch, heads, seq, 64]: the cat of two half-slices the index simplifier must see through."""
    b, s, hd = q.shape
    q = q.view(b, s, hd // 64, 64).transpose(1, 2)
    half = torch.cat((-q[..., 32:], q[..., :32]), dim=-1)
    return q * cos + half * sin


def fp8_scaled_cast(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # FP8 training's tensor-wise scaling cast (torchao's recipe written out): amax, scale,
    # saturated cast to float8_e4m3fn, and the inverse scale the matrix product takes
    scale = 448.0 / torch.clamp(x.abs().amax().float(), min=1e-12)
    return (x.float() * scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn), scale.reciprocal()


def max_pool_stem(x: torch.Tensor) -> torch.Tensor:
    """ResNet's stem pooling (3x3, stride 2, padding 1) over a channels-last activation:
    windows of the -inf padded input forward; backward, the gradient placed at each
    window's argmax (`capture/decomp_window.py::_unpool`)."""
    return F.max_pool2d(x, 3, 2, 1)


def astitch_running(x: torch.Tensor, y: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """AStitch's running example: a row reduce, an expensive element-wise op on its
    broadcast, a column reduce, and a consumer of both."""
    a = x + y
    r1 = a.sum(1, keepdim=True)
    p1 = (a / r1) ** 2
    r2 = p1.sum(0)
    return p1 * (r2 / z), r2


# AdamW's update as `torch.optim.AdamW(foreach=True)` computes it, over lists of tensors,
# its results written into the caller's tensors (`_foreach_copy_`): what a compiled
# `optimizer.step()` does.  The new values are computed from `*0` copies of the state,
# so every call computes the same thing (a timed loop, and each contender's check
# against eager, start from the same state); the bytes are a real step's: four tensors
# read, three written in place.
ADAMW = dict(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01, step=10)


def adamw_foreach(ps: list[torch.Tensor], ms: list[torch.Tensor], vs: list[torch.Tensor], gs: list[torch.Tensor],
                  p0: list[torch.Tensor], m0: list[torch.Tensor],
                  v0: list[torch.Tensor]) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    a = ADAMW
    bc1, bc2 = 1 - a["beta1"] ** a["step"], 1 - a["beta2"] ** a["step"]
    m = torch._foreach_lerp(m0, gs, 1 - a["beta1"])
    v = torch._foreach_mul(v0, a["beta2"])
    torch._foreach_addcmul_(v, gs, gs, 1 - a["beta2"])
    denom = torch._foreach_sqrt(v)
    torch._foreach_div_(denom, bc2 ** 0.5)
    torch._foreach_add_(denom, a["eps"])
    p = torch._foreach_mul(p0, 1 - a["lr"] * a["weight_decay"])
    torch._foreach_addcdiv_(p, m, denom, -a["lr"] / bc1)
    torch._foreach_copy_(ps, p)
    torch._foreach_copy_(ms, m)
    torch._foreach_copy_(vs, v)
    return ps, ms, vs


# BERT-base's parameter shapes (embeddings, 12 layers, pooler): 199 tensors, 109.5 M values
def bert_base_shapes() -> list[tuple[int, ...]]:
    h, f = 768, 3072
    shapes = [(30522, h), (512, h), (2, h), (h,), (h,)]
    layer = [(h, h), (h,)] * 4 + [(h,), (h,), (f, h), (f,), (h, f), (h,), (h,), (h,)]
    return shapes + layer * 12 + [(h, h), (h,)]


# --------------------------------------------------------------------------- JAX versions
# each builder gets the `jax` module and returns f(key, *arrays); the torch dtype of the
# inputs is kept (bf16 in, bf16 out) and float32 is used inside where torch does

def _jax_layer_norm(jax: Any) -> Callable[..., Any]:
    jnp = jax.numpy

    def ln(x: Any, w: Any, b: Any) -> Any:
        xf = x.astype(jnp.float32)
        mu = xf.mean(-1, keepdims=True)
        var = ((xf - mu) ** 2).mean(-1, keepdims=True)
        return ((xf - mu) * jax.lax.rsqrt(var + EPS_LN) * w.astype(jnp.float32)
                + b.astype(jnp.float32)).astype(x.dtype)
    return lambda key, x, w, b: ln(x, w, b)


def _jax_rms_norm(jax: Any) -> Callable[..., Any]:
    jnp = jax.numpy

    def f(key: Any, x: Any, w: Any) -> Any:
        xf = x.astype(jnp.float32)
        return (xf * jax.lax.rsqrt((xf * xf).mean(-1, keepdims=True) + EPS_RMS)).astype(x.dtype) * w
    return f


def _jax_softmax(jax: Any) -> Callable[..., Any]:
    jnp = jax.numpy
    return lambda key, x: jax.nn.softmax(x.astype(jnp.float32), axis=-1).astype(x.dtype)


def _jax_bias_gelu(jax: Any) -> Callable[..., Any]:
    return lambda key, x, b: jax.nn.gelu(x + b, approximate=False)


def _jax_residual_dropout_ln(jax: Any) -> Callable[..., Any]:
    ln = _jax_layer_norm(jax)
    jnp = jax.numpy

    def f(key: Any, x: Any, r: Any, w: Any, b: Any) -> Any:
        keep = jax.random.bernoulli(key, 1.0 - DROPOUT_P, x.shape)
        h = r + jnp.where(keep, x / (1.0 - DROPOUT_P), jnp.zeros_like(x)).astype(x.dtype)
        return h, ln(key, h, w, b)
    return f


def _jax_cross_entropy(jax: Any) -> Callable[..., Any]:
    jnp = jax.numpy

    def f(key: Any, logits: Any, target: Any) -> Any:
        lf = logits.astype(jnp.float32)
        lse = jax.nn.logsumexp(lf, axis=-1)
        picked = jnp.take_along_axis(lf, target[:, None].astype(jnp.int32), axis=-1)[:, 0]
        return (lse - picked).mean().astype(logits.dtype)
    return f


def _jax_row_sum(jax: Any) -> Callable[..., Any]:
    return lambda key, x: x.sum(-1)


def _jax_column_sum(jax: Any) -> Callable[..., Any]:
    return lambda key, x: x.sum(0)


def _jax_cumsum(jax: Any) -> Callable[..., Any]:
    return lambda key, x: jax.numpy.cumsum(x, axis=-1)


def _jax_transpose(jax: Any) -> Callable[..., Any]:
    return lambda key, x: x.T * 0.125


def _jax_rotary(jax: Any) -> Callable[..., Any]:
    jnp = jax.numpy

    def f(key: Any, q: Any, cos: Any, sin: Any) -> Any:
        b, s, hd = q.shape
        q = q.reshape(b, s, hd // 64, 64).transpose(0, 2, 1, 3)
        half = jnp.concatenate((-q[..., 32:], q[..., :32]), axis=-1)
        return q * cos + half * sin
    return f


def _jax_max_pool(jax: Any) -> Callable[..., Any]:
    def f(key: Any, x: Any) -> Any:
        init = jax.numpy.array(-jax.numpy.inf, dtype=x.dtype)
        return jax.lax.reduce_window(x, init, jax.lax.max, (1, 1, 3, 3), (1, 1, 2, 2),
                                     ((0, 0), (0, 0), (1, 1), (1, 1)))
    return f


def _jax_astitch(jax: Any) -> Callable[..., Any]:
    def f(key: Any, x: Any, y: Any, z: Any) -> Any:
        a = x + y
        r1 = a.sum(1, keepdims=True)
        p1 = (a / r1) ** 2
        r2 = p1.sum(0)
        return p1 * (r2 / z), r2
    return f


# --------------------------------------------------------------------------- checks

def dropout_checker(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor, b: torch.Tensor, dtype: str,
                    tol: float) -> Callable[[list[torch.Tensor], list[torch.Tensor]], CheckOutcome]:
    """Dropout's result is random, so check its structure: every element of h - r is
    either 0 (dropped) or x / (1 - p) (kept), about p of them are dropped, and the
    layer norm matches eager's layer norm of this very h."""
    def check(actual: list[torch.Tensor], expected: list[torch.Tensor]) -> CheckOutcome:
        if len(actual) != 2:
            return CheckOutcome(False, float("inf"), f"{len(actual)} outputs, expected (h, layer_norm(h))")
        h, y = actual
        if h.shape != x.shape or h.dtype != x.dtype:
            return CheckOutcome(False, float("inf"), f"h is {tuple(h.shape)}/{h.dtype}")
        d = h.double() - r.double()
        scaled = x.double() / (1.0 - DROPOUT_P)
        # h was rounded to the dtype once: allow one rounding of |r| + |x / (1 - p)|
        slack = (2e-2 if dtype == "bf16" else 1e-5) * (r.double().abs() + scaled.abs() + 1e-6)
        kept = (d - scaled).abs() <= slack
        dropped = d.abs() <= slack
        stray = (~(kept | dropped)).sum().item()
        if stray:
            return CheckOutcome(False, float("inf"), f"{stray} elements of h - r are neither 0 nor x/(1-p)")
        n = x.numel()
        frac = (dropped & ~kept).sum().item() / n
        bound = 6 * (DROPOUT_P * (1 - DROPOUT_P) / n) ** 0.5 + 2.0 / n
        if abs(frac - DROPOUT_P) > bound + (dropped & kept).sum().item() / n:
            return CheckOutcome(False, float("inf"), f"dropped fraction {frac:.4f}, p = {DROPOUT_P}")
        ref = F.layer_norm(h.detach(), (h.shape[-1],), w, b, EPS_LN)
        out = compare([y], [ref], tol, ["layer_norm(h)"])
        out.detail = f"dropped {frac:.4f} (p={DROPOUT_P}); {out.detail}"
        return out
    return check


# --------------------------------------------------------------------------- cases

def _gen(name: str) -> torch.Generator:
    # a seed per case name, so a case gets the same inputs whatever else runs
    return torch.Generator().manual_seed(sum(map(ord, name)) % 2**31)


def _spec(name: str, build: Callable[[str, torch.device, str], Workload], **kw: Any) -> CaseSpec:
    return CaseSpec(name, "micro", lambda dtype, device: build(dtype, device, name), **kw)


def _layer_norm_case(dtype: str, device: torch.device, name: str, rows: int, n: int, bwd: bool) -> Workload:
    g, dt = _gen(name), DTYPES[dtype]
    x = randn((rows, n), dt, device, g)
    w, b = randn((n,), dt, device, g, scale=0.1, shift=1.0), randn((n,), dt, device, g, scale=0.1)
    if bwd:
        for t in (x, w, b):
            t.requires_grad_(True)
    return Workload(name, "micro", dtype, layer_norm, [x, w, b], mode="bwd" if bwd else "fwd",
                    grad_targets=[x, w, b] if bwd else [], shape=f"x[{rows},{n}]",
                    tol=tolerance("micro", dtype), jax=JaxSpec(_jax_layer_norm, (0, 1, 2)))


def _norm_softmax_cases(n_values: tuple[int, ...], quick: bool) -> list[CaseSpec]:
    out = []
    for n in n_values:
        rows = 4 if quick else ELEMS // n

        def ln(dtype: str, device: torch.device, name: str, n: int = n, rows: int = rows, bwd: bool = False):
            return _layer_norm_case(dtype, device, name, rows, n, bwd)

        def rms(dtype: str, device: torch.device, name: str, n: int = n, rows: int = rows, bwd: bool = False):
            g, dt = _gen(name), DTYPES[dtype]
            x, w = randn((rows, n), dt, device, g), randn((n,), dt, device, g, scale=0.1, shift=1.0)
            if bwd:
                x.requires_grad_(True)
                w.requires_grad_(True)
            return Workload(name, "micro", dtype, rms_norm, [x, w], mode="bwd" if bwd else "fwd",
                            grad_targets=[x, w] if bwd else [], shape=f"x[{rows},{n}]",
                            tol=tolerance("micro", dtype), jax=JaxSpec(_jax_rms_norm, (0, 1)))

        def sm(dtype: str, device: torch.device, name: str, n: int = n, rows: int = rows, bwd: bool = False):
            g, dt = _gen(name), DTYPES[dtype]
            x = randn((rows, n), dt, device, g, scale=2.0)
            if bwd:
                x.requires_grad_(True)
            return Workload(name, "micro", dtype, softmax, [x], mode="bwd" if bwd else "fwd",
                            grad_targets=[x] if bwd else [], shape=f"x[{rows},{n}]",
                            tol=tolerance("micro", dtype), jax=JaxSpec(_jax_softmax, (0,)))

        for fam, build in (("layer_norm", ln), ("rms_norm", rms), ("softmax", sm)):
            out.append(_spec(f"{fam}_fwd[N={n}]", build))
            out.append(_spec(f"{fam}_bwd[N={n}]", lambda d, dev, name, build=build: build(d, dev, name, bwd=True)))
    return out


def cases(quick: bool) -> list[CaseSpec]:
    specs = _norm_softmax_cases(QUICK_N if quick else FULL_N, quick)

    gelu_shape = (4, 1024) if quick else (8192, 4096)

    def gelu(dtype: str, device: torch.device, name: str) -> Workload:
        g, dt = _gen(name), DTYPES[dtype]
        x, b = randn(gelu_shape, dt, device, g), randn(gelu_shape[1:], dt, device, g)
        return Workload(name, "micro", dtype, bias_gelu, [x, b], shape=f"x{list(gelu_shape)}",
                        tol=tolerance("micro", dtype), jax=JaxSpec(_jax_bias_gelu))
    specs.append(_spec(f"bias_gelu[{gelu_shape[0]}x{gelu_shape[1]}]", gelu))
    # BERT-base's FFN GELU backward beside its bias gradient (2048 tokens x 3072): column
    # partials walked over row blocks, and issue-bound (erf and exp an element); in the BERT
    # step on the H200 (2026-11-30) 25.4 µs a launch where its bytes take 9.8 (bench/NOTES.md,
    # forty-eighth session)
    gelu_bwd_shape = (16, 96) if quick else (2048, 3072)

    def gelu_bwd(dtype: str, device: torch.device, name: str) -> Workload:
        g, dt = _gen(name), DTYPES[dtype]
        x = randn(gelu_bwd_shape, dt, device, g).requires_grad_(True)
        b = randn(gelu_bwd_shape[1:], dt, device, g).requires_grad_(True)
        return Workload(name, "micro", dtype, bias_gelu, [x, b], mode="bwd", grad_targets=[x, b],
                        shape=f"x{list(gelu_bwd_shape)}", tol=tolerance("micro", dtype),
                        jax=JaxSpec(_jax_bias_gelu, (0, 1)))
    specs.append(_spec(f"bias_gelu_bwd_tokens[{gelu_bwd_shape[0]}x{gelu_bwd_shape[1]}]", gelu_bwd))

    rdl_shape = (4, 1024) if quick else (32768, 1024)

    def rdl(dtype: str, device: torch.device, name: str) -> Workload:
        g, dt = _gen(name), DTYPES[dtype]
        x, r = randn(rdl_shape, dt, device, g), randn(rdl_shape, dt, device, g)
        n = rdl_shape[1]
        w, b = randn((n,), dt, device, g, scale=0.1, shift=1.0), randn((n,), dt, device, g, scale=0.1)
        tol = tolerance("micro", dtype)
        return Workload(name, "micro", dtype, residual_dropout_layer_norm, [x, r, w, b],
                        shape=f"x{list(rdl_shape)}, p={DROPOUT_P}", tol=tol,
                        checker=dropout_checker(x, r, w, b, dtype, tol),
                        jax=JaxSpec(_jax_residual_dropout_ln),
                        notes="dropout is random: checked by structure (0 or x/(1-p), drop rate, LN of h)")
    specs.append(_spec(f"residual_dropout_layer_norm[{rdl_shape[0]}x{rdl_shape[1]}]", rdl))

    # (4096 x 50257: GPT-2's head, rows of an odd length that no 16-byte vector starts aligned)
    ce_sizes = [(2, 2048)] if quick else [(8192, 32000), (2048, 128256), (4096, 50257)]
    for rows, vocab in ce_sizes:
        def ce(dtype: str, device: torch.device, name: str, rows: int = rows, vocab: int = vocab) -> Workload:
            g, dt = _gen(name), DTYPES[dtype]
            logits = randn((rows, vocab), dt, device, g, scale=2.0).requires_grad_(True)
            target = torch.randint(0, vocab, (rows,), generator=g).to(device)
            return Workload(name, "micro", dtype, cross_entropy, [logits, target], mode="fwdbwd",
                            grad_targets=[logits], shape=f"logits[{rows},{vocab}]",
                            tol=tolerance("micro", dtype), jax=JaxSpec(_jax_cross_entropy, (0,)))
        specs.append(_spec(f"cross_entropy_fwdbwd[V={vocab}]", ce))

    def simple(fn: Callable[..., Any], jfn: Callable[[Any], Any], shape: tuple[int, ...], label: str) -> None:
        def build(dtype: str, device: torch.device, name: str) -> Workload:
            g, dt = _gen(name), DTYPES[dtype]
            x = randn(shape, dt, device, g)
            return Workload(name, "micro", dtype, fn, [x], shape=f"x{list(shape)}",
                            tol=tolerance("micro", dtype), jax=JaxSpec(jfn))
        specs.append(_spec(f"{label}[{'x'.join(map(str, shape))}]", build))

    simple(row_sum, _jax_row_sum, (128, 32) if quick else (750000, 32), "row_sum_irregular")
    simple(softmax, _jax_softmax, (2, 3000) if quick else (64, 30000), "row_softmax_irregular")
    simple(column_sum, _jax_column_sum, (64, 64) if quick else (32768, 1024), "column_sum")
    # BERT-base training's per-layer column reductions are over 2048 tokens x 768: on the
    # H200 (2026-11-27) the step's column-partial kernels at that size took ~30-36 µs each,
    # 5-7x their prediction and Inductor's kernels for the same work (bench/NOTES.md)
    simple(column_sum, _jax_column_sum, (40, 24) if quick else (2048, 768), "column_sum_tokens")
    # GPT-2's position-embedding gradient, the token gradients summed over the batch (a
    # reduction over the outermost axis, rows contiguous): its one-launch group with two
    # combines took 31 µs on the H200 (2026-11-28) where 5 were predicted
    simple(column_sum, _jax_column_sum, (2, 8, 24) if quick else (8, 512, 768), "batch_sum")
    bert_ln = (16, 24) if quick else (2048, 768)
    specs.append(_spec(f"layer_norm_bwd_tokens[{bert_ln[0]}x{bert_ln[1]}]",
                       lambda dtype, device, name: _layer_norm_case(dtype, device, name, *bert_ln, bwd=True)))
    # rows held whole (scan in registers) and rows walked in blocks with a carry
    simple(cumsum_rows, _jax_cumsum, (8, 300) if quick else (8192, 4096), "cumsum_rows")
    simple(cumsum_rows, _jax_cumsum, (2, 3000) if quick else (64, 131072), "cumsum_long_rows")
    simple(transpose_scale, _jax_transpose, (40, 72) if quick else (16384, 4096), "transpose_scale")
    # (a reduction over the whole tensor, then a pass that writes float8: bench/NOTES.md,
    # sixty-first session, for its prediction)
    fp8_shape = (32, 72) if quick else (4096, 4096)

    def fp8(dtype: str, device: torch.device, name: str) -> Workload:
        g, dt = _gen(name), DTYPES[dtype]
        x = randn(fp8_shape, dt, device, g, scale=3.0)
        return Workload(name, "micro", dtype, fp8_scaled_cast, [x], shape=f"x{list(fp8_shape)}",
                        tol=tolerance("micro", dtype), notes="float8_e4m3fn output; no JAX twin")
    specs.append(_spec(f"fp8_scaled_cast[{fp8_shape[0]}x{fp8_shape[1]}]", fp8))

    rq = (2, 16, 128) if quick else (4, 1024, 1024)

    def rope(dtype: str, device: torch.device, name: str) -> Workload:
        g, dt = _gen(name), DTYPES[dtype]
        q = randn(rq, dt, device, g).requires_grad_(True)
        cos, sin = randn((rq[1], 64), dt, device, g), randn((rq[1], 64), dt, device, g)
        return Workload(name, "micro", dtype, rotary, [q, cos, sin], mode="fwdbwd", grad_targets=[q],
                        shape=f"q{list(rq)}", tol=tolerance("micro", dtype), jax=JaxSpec(_jax_rotary, (0,)))
    specs.append(_spec(f"rotary_fwdbwd[{rq[0]}x{rq[1]}x{rq[2]}]", rope))

    mp = (2, 8, 12, 12) if quick else (32, 64, 112, 112)

    def pool(dtype: str, device: torch.device, name: str) -> Workload:
        g, dt = _gen(name), DTYPES[dtype]
        x = randn(mp, dt, device, g).to(memory_format=torch.channels_last).requires_grad_(True)
        return Workload(name, "micro", dtype, max_pool_stem, [x], mode="fwdbwd", grad_targets=[x],
                        shape=f"x{list(mp)} channels_last", tol=tolerance("micro", dtype),
                        jax=JaxSpec(_jax_max_pool, (0,)))
    specs.append(_spec(f"max_pool_fwdbwd[{'x'.join(map(str, mp))},cl]", pool))

    as_shape = (8, 256) if quick else (8192, 4096)

    def running(dtype: str, device: torch.device, name: str) -> Workload:
        g, dt = _gen(name), DTYPES[dtype]
        # positive inputs keep the row sums away from zero (the pattern divides by them)
        x, y = rand(as_shape, dt, device, g, low=0.5, high=1.5), rand(as_shape, dt, device, g, low=0.5, high=1.5)
        z = rand(as_shape[1:], dt, device, g, low=0.5, high=1.5)
        return Workload(name, "micro", dtype, astitch_running, [x, y, z], shape=f"x{list(as_shape)}",
                        tol=tolerance("micro", dtype), jax=JaxSpec(_jax_astitch))
    specs.append(_spec(f"astitch_running[{as_shape[0]}x{as_shape[1]}]", running))

    opt_shapes = [(16, 24), (24,), (24, 16), (16,)] if quick else bert_base_shapes()

    def adamw(dtype: str, device: torch.device, name: str) -> Workload:
        g, dt = _gen(name), DTYPES[dtype]
        lists = [[randn(s, dt, device, g) for s in opt_shapes] for _ in range(3)]   # p0, m0, g
        v0 = [rand(s, dt, device, g, low=0.0, high=1e-2) for s in opt_shapes]
        p0, m0, gs = lists
        ps, ms, vs = ([t.clone() for t in ts] for ts in (p0, m0, v0))
        n = sum(t.numel() for t in p0)
        return Workload(name, "micro", dtype, adamw_foreach, [ps, ms, vs, gs, p0, m0, v0],
                        shape=f"{len(opt_shapes)} tensors, {n} values", min_bytes=7 * n * p0[0].element_size(),
                        tol=tolerance("micro", dtype),
                        notes="optimizer step: 4 tensors read, 3 written in place into the inputs; no JAX twin")
    specs.append(_spec(f"adamw_foreach[{'bert_base' if not quick else 'tiny'}]", adamw))
    return specs
