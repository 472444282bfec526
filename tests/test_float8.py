"""Casts to and from the float8 types (float8_e4m3fn, float8_e5m2) in kernels: FP8
training's scaling casts ran eagerly ("dtype ... is not supported in kernels") around
their stitched amax and scale.  Kernels hold a float8 value as its bits and convert with
eager's own rounding written in integer ops (`codegen/triton_ops.py`, `_to_e4m3fn`), so
the interpreter tier checks the very arithmetic a GPU runs: every result bit-equal to
eager's, over the special values (ties, subnormals, saturation, overflow, NaN, signed
zeros) and random values across the whole exponent range."""
import pytest
import torch

import stitchml
from stitchml import config

E4, E5 = torch.float8_e4m3fn, torch.float8_e5m2
F8 = [E4, E5]
IDS = ["e4m3fn", "e5m2"]


def _compile(fn, *args, kernels=None):
    """fn compiled (strict, fallback off, outputs poisoned) on args; its results, the backend."""
    backend = stitchml.StitchBackend()
    with config.override(strict=True, fallback_on_error=False, poison_outputs=True):
        got = torch.compile(fn, backend=backend, dynamic=False)(*args)
    assert not [f.op for r in backend.records for f in r.graph.fallbacks]
    if kernels is not None:
        assert [r.plan.num_kernels for r in backend.records] == kernels
    return got, backend


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.dtype in F8 else t


def _assert_same(got, want):
    """Bit-equal float8 results (NaN patterns too); other results equal with NaNs."""
    assert got.dtype == want.dtype and got.shape == want.shape
    if want.dtype in F8:
        assert torch.equal(_bits(got.contiguous()), _bits(want.contiguous()))
    else:
        torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)


def _specials() -> torch.Tensor:
    """float32 values at every rounding edge of both float8 types, with both signs."""
    v = [0.0, 1.0, 1.0625, 1.1875, 1.03125, 1.09375, 448.0, 449.0, 463.99, 464.0, 464.01, 479.0, 480.0,
         1e6, 3.4e38, float("inf"), float("nan"), 2.0 ** -6, 2.0 ** -7, 2.0 ** -9, 2.0 ** -10, 1.5 * 2.0 ** -10,
         3 * 2.0 ** -11, 3 * 2.0 ** -10, 5 * 2.0 ** -10, 2.0 ** -14, 3 * 2.0 ** -17, 5 * 2.0 ** -17, 2.0 ** -16, 2.0 ** -17, 1.5 * 2.0 ** -17, 3 * 2.0 ** -18, 1e-30, 1e-45,
         57344.0, 57345.0, 61439.0, 61440.0, 61441.0, 65535.0, 65536.0, 0.1, 1 / 3]
    x = torch.tensor(v, dtype=torch.float32)
    return torch.cat([x, -x])


def _random(n: int = 4000) -> torch.Tensor:
    # values across the whole exponent range of both types and beyond (random mantissas)
    return torch.randn(n) * torch.pow(2.0, torch.randint(-26, 20, (n,)).float())


@pytest.mark.parametrize("dst", F8, ids=IDS)
def test_cast_from_float32_matches_eager_bit_for_bit(dst):
    s = _specials()
    x = torch.cat([s, _random(17 * 244 - s.numel())]).reshape(-1, 17)   # (odd row length: masked lanes)
    got, _ = _compile(lambda x: x.to(dst), x, kernels=[1])
    _assert_same(got, x.to(dst))


@pytest.mark.parametrize("src", F8, ids=IDS)
def test_every_float8_pattern_widens_as_eager_does(src):
    x = torch.arange(256, dtype=torch.uint8).view(src).reshape(16, 16)
    for dst in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        got, _ = _compile(lambda x: x.to(dst), x, kernels=[1])
        _assert_same(got, x.to(dst))


@pytest.mark.parametrize("src_dtype", [torch.float16, torch.bfloat16, torch.float64, torch.int32])
def test_cast_from_other_types_rounds_through_float32_like_eager(src_dtype):
    # eager converts a float64 value to float32 first: 1 + 2^-4 + 2^-30 is the tie 1.0625
    # in float32 (to 1.0), not just above it (to 1.125)
    if src_dtype == torch.int32:
        x = torch.randint(-70000, 70000, (40, 9), dtype=torch.int32)
    else:
        x = torch.cat([_specials(), _random(600), torch.tensor([1 + 2 ** -4 + 2 ** -30])]).to(src_dtype)
    for dst in F8:
        got, _ = _compile(lambda x: x.to(dst), x, kernels=[1])
        _assert_same(got, x.to(dst))


def test_between_the_two_float8_types():
    x = torch.arange(256, dtype=torch.uint8)
    for src, dst in ((E4, E5), (E5, E4)):
        got, _ = _compile(lambda x: x.view(src).to(dst), x, kernels=[1])
        _assert_same(got, x.view(src).to(dst))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_tensorwise_scaled_cast_is_stitched_with_its_amax(dtype):
    # FP8 training's scaling cast (as torchao's tensor-wise recipe writes it): the amax,
    # the scale and the saturated cast stitched, nothing eager
    def scaled_cast(x):
        amax = x.abs().amax().float()
        scale = 448.0 / torch.clamp(amax, min=1e-12)
        y = (x.float() * scale).clamp(-448.0, 448.0).to(E4)
        return y, scale.reciprocal()

    x = (torch.randn(96, 130) * 3).to(dtype)
    (y, inv), backend = _compile(scaled_cast, x)
    wy, winv = scaled_cast(x)
    _assert_same(y, wy)
    _assert_same(inv, winv)
    assert backend.records[0].plan.num_kernels <= 2


def test_float8_copies_views_and_concatenation():
    x8 = torch.randn(24, 40).to(E4)
    y8 = torch.randn(24, 8).to(E4)

    def moves(a, b):
        t = a.t().contiguous()                      # (a transposed copy, as for a matmul's operand)
        c = torch.cat([a, b], dim=1)
        return t, c, a[:, ::3].clone(), a.view(torch.uint8) + 1, (b.view(torch.uint8) & 0x7E).view(E4)

    got, _ = _compile(moves, x8, y8)
    for g, w in zip(got, moves(x8, y8)):
        _assert_same(g, w)


def test_arithmetic_on_float8_runs_eagerly_with_its_reason():
    x8 = torch.randn(8, 8).to(E4)
    backend = stitchml.StitchBackend()
    with config.override(strict=False, fallback_on_error=False):
        got = torch.compile(lambda x: torch.abs(x).float() * 2, backend=backend)(x8)
    _assert_same(got, torch.abs(x8).float() * 2)
    reasons = {f.op: f.reason for r in backend.records for f in r.graph.fallbacks}
    assert reasons == {"aten.abs.default": "dtype torch.float8_e4m3fn is not supported in kernels"}, reasons


def test_a_tensorwise_float8_linear_stitches_around_its_scaled_product():
    # torchao's tensor-wise recipe written out: both operands scaled and cast in kernels,
    # the float8 product with the inverse scales left to the library (CPU eager has one)
    def cast(t):
        scale = 448.0 / torch.clamp(t.abs().amax().float(), min=1e-12)
        return (t.float() * scale).clamp(-448.0, 448.0).to(E4), scale.reciprocal()

    def linear(x, w, b):
        x8, sx = cast(x)
        w8, sw = cast(w)
        y = torch._scaled_mm(x8, w8.t(), scale_a=sx, scale_b=sw, out_dtype=torch.bfloat16)
        return torch.nn.functional.gelu(y + b), x8, w8

    x, w, b = (torch.randn(32, 64) * 2).bfloat16(), (torch.randn(48, 64) * 0.1).bfloat16(), torch.randn(48).bfloat16()
    backend = stitchml.StitchBackend()
    with config.override(strict=True, fallback_on_error=False, poison_outputs=True):
        got = torch.compile(linear, backend=backend, dynamic=False)(x, w, b)
    want = linear(x, w, b)
    _assert_same(got[1], want[1])   # (the casts bit for bit: the product then reads the same operands)
    _assert_same(got[2], want[2])
    # (the bias and GELU in float32, rounded once: bfloat16's rounding noise apart)
    torch.testing.assert_close(got[0], want[0])
    eager = {(f.op, f.reason) for r in backend.records for f in r.graph.fallbacks}
    assert eager == {("aten._scaled_mm.default", "compute-intensive: vendor library")}, eager


def test_float8_casts_under_dynamic_shapes_reuse_their_kernels():
    def f(x):
        s = 448.0 / x.abs().amax().float()
        return (x.float() * s).clamp(-448.0, 448.0).to(E4), x.to(E5).t().contiguous()

    backend = stitchml.StitchBackend()
    fc = torch.compile(f, backend=backend, dynamic=True)
    for n in (37, 129):
        x = torch.randn(n, 48, dtype=torch.bfloat16) * 5
        with config.override(strict=True, fallback_on_error=False, poison_outputs=True):
            got = fc(x)
        for g, w in zip(got, f(x)):
            _assert_same(g, w)
    assert len(backend.records) == 1 and not backend.records[0].graph.fallbacks


def test_a_float8_training_step_matches_eager():
    # a float8 linear layer as FP8 training writes it (an autograd function: e4m3fn operands
    # forward, the gradient cast to e5m2 backward, every product `_scaled_mm`): the loss and
    # both gradients equal to eager's, only the products eager
    def cast(t, dt, mx):
        s = mx / torch.clamp(t.abs().amax().float(), min=1e-12)
        return (t.float() * s).clamp(-mx, mx).to(dt), s.reciprocal()

    class Linear8(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            x8, sx = cast(x, E4, 448.0)
            w8, sw = cast(w, E4, 448.0)
            ctx.save_for_backward(x8, sx, w8, sw)
            return torch._scaled_mm(x8, w8.t(), scale_a=sx, scale_b=sw, out_dtype=torch.bfloat16)

        @staticmethod
        def backward(ctx, g):
            x8, sx, w8, sw = ctx.saved_tensors
            g8, sg = cast(g, E5, 57344.0)
            gx = torch._scaled_mm(g8, w8.t().contiguous().t(), scale_a=sg, scale_b=sw, out_dtype=torch.bfloat16)
            gw = torch._scaled_mm(g8.t().contiguous(), x8.t().contiguous().t(), scale_a=sg, scale_b=sx,
                                  out_dtype=torch.bfloat16)
            return gx, gw

    def step(x, w, c):
        # (the output's gradient is c itself, exact in bfloat16: the gradients' casts then read
        # the same values as eager's; a loss through more bfloat16 ops would differ from eager's
        # by rounding, which a float8 cast can turn into a step of its own)
        return (Linear8.apply(x, w).float() * c).sum()

    x, w = torch.randn(32, 64).bfloat16(), (torch.randn(48, 64) * 0.1).bfloat16()
    c = torch.randn(32, 48).bfloat16().float()
    xc, wc, xe, we = (t.clone().requires_grad_() for t in (x, w, x, w))
    backend = stitchml.StitchBackend()
    with config.override(strict=True, fallback_on_error=False, poison_outputs=True):
        loss = torch.compile(step, backend=backend)(xc, wc, c)
        loss.backward()
    want = step(xe, we, c)
    want.backward()
    torch.testing.assert_close(loss, want)   # (a sum: another order)
    assert torch.equal(xc.grad, xe.grad) and torch.equal(wc.grad, we.grad)
    eager = {(f.op, f.reason) for r in backend.records for f in r.graph.fallbacks}
    assert eager == {("aten._scaled_mm.default", "compute-intensive: vendor library")}, eager
    assert [r.plan.num_kernels for r in backend.records] == [2, 1]


def test_rowwise_scaled_cast_is_one_kernel():
    # the row-wise recipe: a scale a row, each row's amax, scale and cast in one row kernel
    def rowwise(x):
        s = 448.0 / torch.clamp(x.abs().amax(dim=-1, keepdim=True).float(), min=1e-12)
        return (x.float() * s).clamp(-448.0, 448.0).to(E4), s.reciprocal()

    x = (torch.randn(64, 200) * 4).bfloat16()
    got, _ = _compile(rowwise, x, kernels=[1])
    for g, w in zip(got, rowwise(x)):
        _assert_same(g, w)


def test_other_one_byte_float_types_run_eagerly_with_their_reason():
    # float8_e8m0fnu (MX scales) and packed float4: Triton has no pointer type for them
    x = torch.arange(64, dtype=torch.uint8).reshape(8, 8)
    backend = stitchml.StitchBackend()
    with config.override(strict=False, fallback_on_error=False):
        got = torch.compile(lambda x: x.view(torch.float8_e8m0fnu).float() * 2, backend=backend)(x)
    _assert_same(got, x.view(torch.float8_e8m0fnu).float() * 2)
    reasons = {f.reason for r in backend.records for f in r.graph.fallbacks}
    assert reasons == {"dtype torch.float8_e8m0fnu is not supported in kernels"}, reasons


@pytest.mark.parametrize("shape", [(0, 5), (3, 0)])
def test_an_empty_float8_result_launches_nothing(shape):
    # (an empty result is a free allocation: "not supported in kernels" before)
    x = torch.randn(shape)
    got, _ = _compile(lambda x: (x * 2).to(E4), x, kernels=[0])
    assert got.shape == shape and got.dtype == E4


def test_a_cast_written_into_a_float8_input_in_place():
    # (a float8 weight cache refreshed in place, as FP8 training's weight casts do): the kernel
    # writes the cast straight into the input's buffer
    def refresh(buf, x):
        s = 448.0 / x.abs().amax()
        buf.copy_((x * s).clamp(-448.0, 448.0))
        return s

    x = torch.randn(16, 24) * 3
    mine, theirs = torch.zeros(16, 24).to(E4), torch.zeros(16, 24).to(E4)
    got, _ = _compile(refresh, mine, x, kernels=[1])
    want = refresh(theirs, x)
    _assert_same(got, want)
    _assert_same(mine, theirs)
