"""Misaligned matrix products padded for cuBLAS (capture/pad_gemm.py): the padded graph
computes what eager computes, forward and backward, its results keep eager's layout
(so a saved result read by the backward is addressed as traced),
and explain says which products were padded and which were left (and why).

On the CPU the pass runs with the knob `pad_gemm=on` (its `auto` is CUDA only) and the
flops-per-byte threshold lowered to 0, since these test sizes are tiny."""
import pytest
import torch
import torch.nn.functional as F

import stitchml
from stitchml import config
from stitchml.capture import pad_gemm
from stitchml.capture.backend import StitchBackend

V, D = 37, 24          # an odd vocabulary (fp32 aligns to 4 elements), an aligned hidden size


@pytest.fixture
def padding(monkeypatch):
    monkeypatch.setattr(pad_gemm, "MIN_FLOPS_PER_BYTE", 0)
    with config.override(pad_gemm="on", linear_ce=False):
        yield


def _compiled(fn):
    be = StitchBackend()
    return torch.compile(fn, backend=be, fullgraph=True), be


def _pads(be) -> dict[str, list[str]]:
    return {rec.kind: rec.gemm_pads for rec in be.records}


def head(h, w, b, t):
    z = F.linear(h, w, b)                       # addmm, N = V odd
    return F.cross_entropy(z.view(-1, V), t.view(-1)), z


def test_lm_head_padded_forward_and_backward(padding):
    torch.manual_seed(11)
    h = torch.randn(3, 10, D, requires_grad=True)
    w = (torch.randn(V, D) / D ** 0.5).requires_grad_()
    b = torch.randn(V, requires_grad=True)
    t = torch.randint(0, V, (3, 10))
    fn, be = _compiled(head)
    for step in range(2):                      # the second call runs the compiled graphs again
        loss, z = fn(h, w, b, t)
        gh, gw, gb = torch.autograd.grad(loss, (h, w, b))
        ref_loss, ref_z = head(h, w, b, t)
        rh, rw, rb = torch.autograd.grad(ref_loss, (h, w, b))
        assert z.is_contiguous() and z.shape == ref_z.shape   # the traced layout, not the padded one
        torch.testing.assert_close(z, ref_z, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
        for g, r in ((gh, rh), (gw, rw), (gb, rb)):
            torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-5)
    pads = _pads(be)
    assert any("padded (N+3" in n for n in pads["forward"]), pads          # logits: result rows padded
    bwd = " | ".join(pads["backward"])
    assert "K+3" in bwd and "M+3" in bwd, pads       # dX = dZ·W pads K; dW = dZᵀ·h pads M (a row slice)
    assert all(rec.eager_reason is None for rec in be.records)
    text = str(stitchml.explain(head, h, w, b, t))        # what a user reads
    assert "GEMM alignment:" in text and "padded (N+3" in text, text


def attention_scores(q, k):
    return torch.softmax(q @ k.transpose(-1, -2), dim=-1)


def test_bmm_with_a_transposed_operand(padding):
    torch.manual_seed(12)
    q = torch.randn(4, 16, 13, requires_grad=True)          # K = 13: both operands' rows misaligned
    k = torch.randn(4, 20, 13, requires_grad=True)
    fn, be = _compiled(attention_scores)
    out = fn(q, k)
    ref = attention_scores(q, k)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    g = torch.randn_like(ref)
    got = torch.autograd.grad(out, (q, k), g)
    exp = torch.autograd.grad(ref, (q, k), g)
    for a, r in zip(got, exp):
        torch.testing.assert_close(a, r, rtol=1e-5, atol=1e-5)
    assert any("padded (K+3" in n for n in _pads(be)["forward"]), _pads(be)


def test_small_products_are_left_with_a_reason():
    torch.manual_seed(13)
    with config.override(pad_gemm="on", linear_ce=False):          # the real threshold
        fn, be = _compiled(lambda x, w: x @ w)
        x, w = torch.randn(8, 5), torch.randn(5, 7)
        torch.testing.assert_close(fn(x, w), x @ w)
    notes = _pads(be)["inference"]
    assert notes and "left" in notes[0] and "flops per byte" in notes[0], notes


@pytest.mark.parametrize("mode", ["off", "auto"])   # auto: CUDA tensors only
def test_knob_off_and_auto_on_cpu_leave_products(mode, monkeypatch):
    monkeypatch.setattr(pad_gemm, "MIN_FLOPS_PER_BYTE", 0)
    torch.manual_seed(14)
    with config.override(pad_gemm=mode, linear_ce=False):
        fn, be = _compiled(lambda x, w: x @ w)
        x, w = torch.randn(8, 5), torch.randn(5, 7)
        torch.testing.assert_close(fn(x, w), x @ w)
    assert _pads(be)["inference"] == []


def test_addmm_keeps_beta_and_alpha(padding):
    """addmm(bias, a, b, beta=, alpha=) padded: its scalars go along."""
    torch.manual_seed(15)
    fn, be = _compiled(lambda c, a, b: torch.addmm(c, a, b, beta=0.5, alpha=-2.0))
    c, a, b = torch.randn(9), torch.randn(6, 11), torch.randn(11, 9)       # K = 11, N = 9: both odd
    torch.testing.assert_close(fn(c, a, b), torch.addmm(c, a, b, beta=0.5, alpha=-2.0), rtol=1e-5, atol=1e-5)
    assert any("padded" in n for n in _pads(be)["inference"]), _pads(be)


def test_batched_product_with_padded_rows_keeps_its_layout(padding):
    """bmm with A column-major and M odd pads M: the row slice of a [B, M+p, N] result
    keeps the padded batch stride, so it is copied back.  Without that the backward,
    compiled for the traced strides, read the saved product wrongly (gradient errors
    of 12 and 20) and `.view(-1)` of the result failed."""
    torch.manual_seed(16)

    def f(a, b):
        p = a.transpose(1, 2) @ b
        return torch.sin(p), p
    a = torch.randn(3, 16, 21, requires_grad=True)           # A = aᵀ: column-major, M = 21
    b = torch.randn(3, 16, 16, requires_grad=True)
    fn, be = _compiled(f)
    (out, p), (ref, rp) = fn(a, b), f(a, b)
    assert p.stride() == rp.stride()
    torch.testing.assert_close(p.view(-1), rp.view(-1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    g = torch.randn_like(ref)
    got = torch.autograd.grad(out, (a, b), g)
    exp = torch.autograd.grad(ref, (a, b), g)
    for x, r in zip(got, exp):
        assert x.stride() == r.stride()
        torch.testing.assert_close(x, r, rtol=1e-4, atol=1e-4)
    assert any("padded (M+3" in n for n in _pads(be)["forward"]), _pads(be)


def test_an_unknown_knob_value_is_refused_by_name():
    from stitchml.capture.pad_gemm import pad_gemms
    gm = torch.fx.symbolic_trace(lambda x: x + 1)
    with config.override(pad_gemm="of"), pytest.raises(ValueError, match="STITCHML_PAD_GEMM='of'"):
        pad_gemms(gm, device=torch.device("cpu"))
