"""Attention kept fused (issue 15.2): math attention captured by Dynamo becomes
scaled_dot_product_attention, for each mask kind, in inference and training, checked
against eager (forward and backward) on fresh random inputs; refusals with reasons."""
import math

import pytest
import torch
import torch.nn.functional as F

from stitchml import patterns
from stitchml.capture.backend import StitchBackend
from stitchml.patterns import attention

B, H, L, E = 2, 2, 5, 8


def additive(q, k, v, m):
    s = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(E)
    return F.softmax(s + m, dim=-1) @ v


def bool_masked_fill(q, k, v, m):
    return (q @ k.mT * 0.3).masked_fill(m, float("-inf")).softmax(-1) @ v


def causal_in_graph(q, k, v):
    c = torch.tril(torch.ones(L, L, dtype=torch.bool))
    p = F.softmax((q @ k.transpose(2, 3) / math.sqrt(E)).masked_fill(~c, float("-inf")), dim=-1)
    return F.dropout(p, 0.1, training=False) @ v


def causal_buffer_where(q, k, v, m):
    """GPT-2's form: torch.where(mask, scores, finfo.min), the mask a (sliced) buffer."""
    s = torch.where(m[:L, :L], q @ k.mT / math.sqrt(E), torch.finfo(torch.float32).min)
    return F.softmax(s, dim=-1, dtype=torch.float32).to(q.dtype) @ v


def _positions_mask(q, q_offset=0, strict=False, ge=False):
    """Hugging Face's eager causal mask, built in the graph (masking_utils): query and key
    positions from aranges, kv <= q, expanded over the batch, 0 where kept and finfo.min
    where masked."""
    n = q.shape[-2]
    qi = (torch.arange(n) + q_offset)[None, None, :, None]
    ki = (torch.arange(n) + 0)[None, None, None, :]
    keep = (ki < qi) if strict else (qi >= ki) if ge else (ki <= qi)
    keep = keep.expand(q.shape[0], -1, n, n)
    return torch.where(keep, torch.zeros((), dtype=q.dtype), torch.finfo(q.dtype).min)


def hf_causal(q, k, v):
    return F.softmax(q @ k.mT * 0.3 + _positions_mask(q), dim=-1) @ v


def _qkv(dtype=torch.float32):
    return [torch.randn(B, H, L, E, dtype=dtype, requires_grad=True) for _ in range(3)]


def _masks(kind):
    if kind == "additive":
        m = torch.randn(B, 1, 1, L)
        m[:, :, :, -1] = -1e4   # a padded key
        return (m,)
    if kind == "bool":
        m = torch.rand(B, 1, L, L) > 0.6
        m[..., 0] = False       # every row keeps a key
        return (m,)
    if kind == "buffer":
        return (torch.tril(torch.ones(L + 3, L + 3, dtype=torch.bool)),)
    return ()


CASES = {"additive": (additive, "additive"), "bool": (bool_masked_fill, "inverted-bool"),
         "causal": (causal_in_graph, "causal"), "buffer": (causal_buffer_where, "fill"),
         "hf_causal": (hf_causal, "causal")}


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("case", sorted(CASES))
def test_attention_becomes_sdpa(case, training):
    torch.manual_seed(len(case) + training)
    fn, mask_kind = CASES[case]
    q, k, v = _qkv()
    extra = _masks(case)
    seen = len(patterns.LOG)
    backend = StitchBackend()
    compiled = torch.compile(fn, backend=backend)
    with torch.set_grad_enabled(training):
        got = compiled(q, k, v, *extra)
        want = fn(q, k, v, *extra)
    recs = [r for r in patterns.LOG[seen:] if r.pattern == "attention"]
    assert [r.applied for r in recs] == [True], recs
    assert f"mask={mask_kind}," in recs[0].detail
    assert all(rec.eager_reason is None for rec in backend.records)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    if training:
        g = torch.randn_like(want)
        torch.testing.assert_close(torch.autograd.grad(got, (q, k, v), g), torch.autograd.grad(want, (q, k, v), g),
                                   rtol=1e-4, atol=1e-5)
    # the only library calls left are the fused attention kernels (no bmm, no score tensor)
    library = [n.op for rec in backend.records for n in rec.graph.nodes if n.kind == "opaque"]
    assert library and all("scaled_dot_product" in op for op in library), library


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("variant,mask_kind", [
    ({}, "causal"), ({"ge": True}, "causal"),
    ({"q_offset": 1}, "additive"),                  # keeps j <= i + 1: not the diagonal
    ({"strict": True, "q_offset": 1}, "additive"),  # kv < q + 1 is j <= i, but not read as such
])
def test_in_graph_position_masks(variant, mask_kind, dtype):
    """An additive mask built from query and key positions is `is_causal=True` only when
    it keeps exactly j <= i: the same positions along both axes, `<=` (or `>=` the other
    way round); a shifted or strict one stays a mask tensor (no row here is fully
    masked: SDPA's backward and eager's differ on such a row of finite fills, the
    module's known limit).  Forward and backward against eager."""
    torch.manual_seed(3)
    q, k, v = _qkv(dtype)

    def fn(q, k, v):
        return F.softmax(q @ k.mT * 0.3 + _positions_mask(q, **variant), dim=-1) @ v
    seen = len(patterns.LOG)
    backend = StitchBackend()
    got = torch.compile(fn, backend=backend)(q, k, v)
    want = fn(q, k, v)
    recs = [r for r in patterns.LOG[seen:] if r.pattern == "attention"]
    assert [r.applied for r in recs] == [True] and f"mask={mask_kind}," in recs[0].detail, recs
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(got, want, **tol)
    g = torch.randn_like(want)
    torch.testing.assert_close(torch.autograd.grad(got, (q, k, v), g), torch.autograd.grad(want, (q, k, v), g),
                               **(tol if dtype == torch.float32 else dict(rtol=5e-2, atol=5e-2)))
    if mask_kind == "causal":   # the mask's construction is gone from the graph
        ops = [n.op for rec in backend.records for n in rec.graph.nodes]
        assert not any("where" in op or "arange" in op for op in ops), ops


def _dynamo_graph(fn, *args):
    graphs = []

    def grab(gm, example_inputs):
        graphs.append(gm)
        return gm.forward
    torch.compile(fn, backend=grab)(*args)
    return graphs[0]


def _call(gm, fn, args):
    """Call a Dynamo graph with fn's arguments, matched to its placeholders by name."""
    named = dict(zip(fn.__code__.co_varnames, args))
    return gm(*[named[n.target[2:-1]] for n in gm.graph.nodes if n.op == "placeholder"])[0]


def test_dropout_is_kept_and_unbiased():
    """Training dropout goes into SDPA's dropout_p; the result is random, so check it
    statistically: E[dropout(P)] = P, so the mean over draws approaches the p = 0 result."""
    torch.manual_seed(5)
    q, k, v = (x.detach() for x in _qkv())

    def fn(q, k, v):
        p = F.softmax(q @ k.transpose(-2, -1) / math.sqrt(E), dim=-1)
        return F.dropout(p, 0.3, training=True) @ v
    gm = _dynamo_graph(fn, q, k, v)
    records = patterns.rewrite(gm, [])
    assert [r.applied for r in records] == [True] and "dropout_p=0.3" in records[0].detail
    assert any(n.target is F.scaled_dot_product_attention for n in gm.graph.nodes)
    draws = torch.stack([_call(gm, fn, (q, k, v)) for _ in range(400)])
    exact = F.scaled_dot_product_attention(q, k, v)
    assert not torch.allclose(draws[0], exact)                       # dropout happened
    assert (draws.mean(0) - exact).abs().max() < 0.25                # ~5 standard errors at 400 draws
    assert (draws.mean(0) - exact).abs().mean() < 0.06


@pytest.mark.parametrize("body,reason", [
    (lambda q, k, v: (F.softmax(q @ k.mT, -1) @ v, F.softmax(q @ k.mT, -1)), None),
    (lambda q, k, v: (lambda p: (p @ v, p))(F.softmax(q @ k.mT, -1)), "also used elsewhere"),
    (lambda q, k, v: F.softmax(q @ k.mT, dim=2) @ v, "not over the key dim"),
    (lambda q, k, v: F.softmax((q @ k.mT).masked_fill(q[..., :1] > 0, -5.0), -1) @ v, "fill value"),
    (lambda q, k, v: torch.relu(q @ k.mT).softmax(-1) @ v, "is not the q·kᵀ product"),
])
def test_refusals_have_reasons(body, reason):
    q, k, v = (x.detach() for x in _qkv())
    gm = _dynamo_graph(body, q, k, v)
    records = attention.rewrite(gm)
    if reason is None:  # two separate attention computations, one returned probabilities: the other is fine
        assert [r.applied for r in records] == [True], records
        return
    assert records and not records[0].applied and reason in records[0].detail, records


def test_bf16_causal_no_worse_than_eager():
    torch.manual_seed(7)
    q, k, v = _qkv(torch.bfloat16)
    got = torch.compile(causal_in_graph, backend=StitchBackend())(q, k, v)
    want = causal_in_graph(q, k, v)
    ref = causal_in_graph(*(x.detach().float() for x in (q, k, v)))
    assert got.dtype == torch.bfloat16
    assert (got.float() - ref).abs().max() <= 2 * (want.float() - ref).abs().max() + 1e-2
