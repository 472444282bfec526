"""GEMM epilogue stitching (issue 15.1): linear + bias / GELU / tanh-GELU / SiLU /
silu·mul / residual / cast as one Triton GEMM, forward and backward against eager
on fresh random inputs (the interpreter runs tl.dot)."""
import pytest
import torch
import torch.nn.functional as F

from stitchml import config, patterns
from stitchml.capture.backend import StitchBackend
from stitchml.patterns.gemm_op import linear_epilogue
from launches import count_launches

M, K, N = 13, 20, 37   # nothing a multiple of the 16 x 16 x 16 tiles


def gelu_bias(x, w, b, r, w3):
    return F.gelu(F.linear(x, w, b))


def tanh_gelu_residual(x, w, b, r, w3):
    return F.gelu(x @ w.T + b, approximate="tanh") + r


def silu_residual_cast(x, w, b, r, w3):
    return (F.silu(F.linear(x, w)) + r).to(torch.bfloat16)


def swiglu(x, w, b, r, w3):
    return F.silu(F.linear(x, w)) * F.linear(x, w3)


def relu_bias(x, w, b, r, w3):
    return torch.relu(F.linear(x, w) + b)


FORMS = {"gelu_bias": (gelu_bias, "act=gelu"), "tanh_gelu_residual": (tanh_gelu_residual, "act=gelu_tanh"),
         "silu_residual_cast": (silu_residual_cast, "cast=torch.bfloat16"), "swiglu": (swiglu, "mul"),
         "relu_bias": (relu_bias, "act=relu")}


def _inputs():
    x = torch.randn(2, M, K, requires_grad=True)
    w = (torch.randn(N, K) / K ** 0.5).requires_grad_()
    b = torch.randn(N, requires_grad=True)
    r = torch.randn(2, M, N, requires_grad=True)
    w3 = (torch.randn(N, K) / K ** 0.5).requires_grad_()
    return x, w, b, r, w3


@pytest.mark.parametrize("form", sorted(FORMS))
def test_epilogue_matches_eager(form):
    torch.manual_seed(len(form))
    fn, needle = FORMS[form]
    args = _inputs()
    seen = len(patterns.LOG)
    backend = StitchBackend()
    with config.override(gemm_epilogue=True):
        got = torch.compile(fn, backend=backend)(*args)
    recs = [r for r in patterns.LOG[seen:] if r.pattern == "gemm_epilogue"]
    assert [r.applied for r in recs] == [True] and needle in recs[0].detail, recs
    want = fn(*args)
    assert got.dtype == want.dtype
    tol = dict(rtol=2e-2, atol=2e-2) if want.dtype == torch.bfloat16 else dict(rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(got, want, **tol)
    g = torch.randn_like(want)
    used = [a for a in args if a.requires_grad]
    got_g = torch.autograd.grad(got, used, g, allow_unused=True)
    want_g = torch.autograd.grad(want, used, g, allow_unused=True)
    for a, e in zip(got_g, want_g):
        assert (a is None) == (e is None)
        if a is not None:
            torch.testing.assert_close(a, e, rtol=1e-3, atol=1e-4)
    assert all(rec.eager_reason is None for rec in backend.records)


def test_inference_is_one_launch():
    """gelu(linear(x) + b) + r with no grad: the whole graph is our one GEMM launch."""
    torch.manual_seed(9)
    x, w, b, r, w3 = (a.detach() for a in _inputs())
    with config.override(gemm_epilogue=True), torch.no_grad():
        f = torch.compile(tanh_gelu_residual, backend=StitchBackend())
        f(x, w, b, r, w3)
        with count_launches() as launches:
            out = f(x, w, b, r, w3)
    torch.testing.assert_close(out, tanh_gelu_residual(x, w, b, r, w3), rtol=1e-4, atol=1e-5)
    assert launches["n"] == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_against_fp32_math(dtype):
    torch.manual_seed(11)
    x = torch.randn(M, K).to(dtype)
    w = torch.randn(N, K).to(dtype)
    b, r, m = torch.randn(N).to(dtype), torch.randn(M, N).to(dtype), torch.randn(M, N).to(dtype)
    y, z = linear_epilogue(x, w, b, r, m, "silu", "float32", True)
    zr = x.float() @ w.float().t() + b.float()
    torch.testing.assert_close(z.float(), zr, rtol=1e-2 if dtype != torch.float32 else 1e-5, atol=1e-2)
    torch.testing.assert_close(y, F.silu(zr) * m.float() + r.float(), rtol=1e-4, atol=1e-4)


def test_knob_off_leaves_the_graph():
    x, w, b, r, w3 = _inputs()
    seen = len(patterns.LOG)
    torch.compile(gelu_bias, backend=StitchBackend())(x, w, b, r, w3)
    assert not [r for r in patterns.LOG[seen:] if r.pattern == "gemm_epilogue"]
