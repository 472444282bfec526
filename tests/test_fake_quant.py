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
