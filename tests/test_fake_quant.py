"""Fake quantisation for quantisation-aware training (capture/decomp_quant.py): the
per-tensor (float and tensor qparams, on and off) and per-channel forms ran eagerly with
"no lowering rule".  Interpreter tier: values and masks equal to eager's (eager's own
float32 arithmetic, rounding half to even), gradients through the mask, every dtype
eager takes; one kernel forward, one backward."""
import pytest
import torch

import stitchml
from stitchml import config

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _run(fn, x, *rest):
    """fn compiled (strict, fallback off) and eager on copies of x (which requires a
    gradient); outputs equal, x's gradients equal; the backend."""
    backend = stitchml.StitchBackend()
    xc, xe = x.clone().requires_grad_(), x.clone().requires_grad_()
    with config.override(strict=True, fallback_on_error=False):
        got = torch.compile(fn, backend=backend)(xc, *rest)
        want = fn(xe, *rest)
        assert torch.equal(got, want)
        g = torch.randn(want.shape).to(want.dtype)
        got.backward(g)
    want.backward(g)
    assert torch.equal(xc.grad, xe.grad)
    assert [r.plan.num_kernels for r in backend.records] == [1, 1]
    assert not [f.op for r in backend.records for f in r.graph.fallbacks]
    return backend


def _x(dtype):
    # (values past the clamp range on both sides, and halves: round half to even)
    x = torch.randn(8, 16) * 4
    x[0, :4] = torch.tensor([0.5, 1.5, 2.5, -0.5]) * 0.05
    return x.to(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "fp16", "bf16"])
def test_per_tensor_fake_quantize_matches_eager(dtype):
    _run(lambda x: torch.fake_quantize_per_tensor_affine(x, 0.05, 3, -128, 127), _x(dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "fp16", "bf16"])
def test_tensor_qparams_fake_quantize_matches_eager(dtype):
    scale, zero = torch.tensor(0.037), torch.tensor(10, dtype=torch.int32)
    _run(lambda x, s, z: torch.fake_quantize_per_tensor_affine(x, s, z, 0, 255), _x(dtype), scale, zero)


def test_fake_quantize_with_its_enable_flag_off_passes_the_input_through():
    x = _x(torch.float32)
    for on in (1, 0):
        flag = torch.tensor([on], dtype=torch.uint8)
        _run(lambda x, f: torch.ops.aten._fake_quantize_per_tensor_affine_cachemask_tensor_qparams(
            x, torch.tensor([0.05]), torch.tensor([3], dtype=torch.int32), f, -128, 127)[0] * 1.0, x, flag)


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "fp16", "bf16"])
def test_per_channel_fake_quantize_matches_eager(dtype):
    scale = torch.rand(16) * 0.1 + 0.01
    zero = torch.randint(-3, 3, (16,), dtype=torch.int32)
    _run(lambda x, s, z: torch.fake_quantize_per_channel_affine(x, s, z, 1, -128, 127), _x(dtype), scale, zero)


def test_a_float_zero_point_per_channel_runs_eagerly_with_its_reason():
    backend = stitchml.StitchBackend()
    x, scale, zero = torch.randn(4, 6), torch.rand(6) * 0.1 + 0.01, torch.randn(6)
    f = torch.compile(lambda x: torch.fake_quantize_per_channel_affine(x, scale, zero, 1, -128, 127) * 2,
                      backend=backend)
    with config.override(strict=False, fallback_on_error=False):
        torch.testing.assert_close(f(x), torch.fake_quantize_per_channel_affine(x, scale, zero, 1, -128, 127) * 2)
    reasons = [f.reason for r in backend.records for f in r.graph.fallbacks]
    assert reasons == ["fake quantisation with floating-point zero points has no stitched form"], reasons


def _learnable(fn, x, scale, zero):
    """fn(x, scale, zero) compiled and eager, every input requiring a gradient: outputs and
    x's gradients equal to eager's, the scale's and zero point's (sums over x: another
    summation order) close; nothing eager, one kernel forward (no host read of the scale,
    which eager's `.item()` does), kernels backward."""
    backend = stitchml.StitchBackend()
    args_c = [t.clone().requires_grad_() for t in (x, scale, zero)]
    args_e = [t.clone().requires_grad_() for t in (x, scale, zero)]
    with config.override(strict=True, fallback_on_error=False, poison_outputs=True):
        got = torch.compile(fn, backend=backend, dynamic=False)(*args_c)
        want = fn(*args_e)
        assert torch.equal(got, want)
        g = torch.randn(want.shape)
        got.backward(g)
    want.backward(g)
    assert torch.equal(args_c[0].grad, args_e[0].grad)
    for c, e in zip(args_c[1:], args_e[1:]):
        torch.testing.assert_close(c.grad, e.grad, rtol=1e-5, atol=1e-5)
    assert not [f.op for r in backend.records for f in r.graph.fallbacks]
    assert backend.records[0].plan.num_kernels == 1
    return backend


@pytest.mark.parametrize("zero", [2.4, -3.5, 0.5, 9.7], ids=["2.4", "-3.5", "0.5", "clamped"])
def test_learnable_per_tensor_fake_quantize_matches_eager(zero):
    # (zero points that round differently forward (half to even) and backward (+0.5, truncated),
    # and one past the range)
    x = _x(torch.float32)
    _learnable(lambda x, s, z: torch._fake_quantize_learnable_per_tensor_affine(x, s, z, -8, 7, 0.5),
               x, torch.tensor([0.21]), torch.tensor([zero]))


def test_learnable_per_channel_fake_quantize_matches_eager():
    x = _x(torch.float32)
    scale = torch.rand(16) * 0.3 + 0.05
    zero = torch.randn(16) * 3
    _learnable(lambda x, s, z: torch._fake_quantize_learnable_per_channel_affine(x, s, z, 1, -8, 7, 1.0),
               x, scale, zero)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_learnable_fake_quantize_forward_in_half_types(dtype):
    # (eager's backward takes float32 alone: the half forward, as in an evaluation pass)
    x = _x(dtype)
    scale, zero = torch.tensor([0.21], dtype=dtype), torch.tensor([2.4], dtype=dtype)
    fn = lambda x, s, z: torch._fake_quantize_learnable_per_tensor_affine(x, s, z, -8, 7, 1.0)  # noqa: E731
    backend = stitchml.StitchBackend()
    with torch.no_grad(), config.override(strict=True, fallback_on_error=False, poison_outputs=True):
        got = torch.compile(fn, backend=backend, dynamic=False)(x, scale, zero)
    assert torch.equal(got, fn(x, scale, zero))
    assert not [f.op for r in backend.records for f in r.graph.fallbacks]
