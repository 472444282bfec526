"""Fractional max-pooling (capture/decomp_fractional.py): `fractional_max_pool2d/3d` and
their backwards ran eagerly with "no lowering rule" (found by a sweep of PyTorch's
`module_db`).  Interpreter tier against eager on fresh random inputs with the random
samples passed in (the op's windows come from them), every dtype eager takes; the
decomposition itself against the native op on many random shapes."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import stitchml
from stitchml import config
from stitchml.capture.decomp_fractional import fractional_max_pool2d, fractional_max_pool3d

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
IDS = ["fp32", "fp64", "fp16", "bf16"]


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_window_starts_values_and_indices_are_eagers_exactly(dtype):
    """The starts are computed with eager's roundings (a half type's after each
    operation on the CPU), so values and indices are equal, not close."""
    g = torch.Generator().manual_seed(int(torch.randint(0, 2**31, ())))
    for _ in range(60):
        h, w = (int(torch.randint(4, 40, (), generator=g)) for _ in range(2))
        kh, kw = (int(torch.randint(1, 4, (), generator=g)) for _ in range(2))
        oh, ow = int(torch.randint(1, h - kh + 2, (), generator=g)), int(torch.randint(1, w - kw + 2, (), generator=g))
        x = torch.randn(2, 2, h, w, generator=g).to(dtype)
        s = torch.rand(2, 2, 2, generator=g).to(dtype)
        want = torch.ops.aten.fractional_max_pool2d(x, [kh, kw], [oh, ow], s)
        got = fractional_max_pool2d(x, [kh, kw], [oh, ow], s)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), ((h, w), (kh, kw), (oh, ow))
    for _ in range(20):
        sizes = [int(torch.randint(4, 11, (), generator=g)) for _ in range(3)]
        k = [int(torch.randint(1, 3, (), generator=g)) for _ in range(3)]
        o = [int(torch.randint(1, n - kk + 1, (), generator=g)) for n, kk in zip(sizes, k)]
        x = torch.randn(2, 2, *sizes, generator=g).to(dtype)
        s = torch.rand(2, 2, 3, generator=g).to(dtype)
        want = torch.ops.aten.fractional_max_pool3d(x, k, o, s)
        got = fractional_max_pool3d(x, k, o, s)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), (sizes, k, o)


def test_nan_and_minus_inf_windows_follow_eagers_rule():
    """A NaN replaces the maximum (the last NaN of a window wins); an all -inf window
    keeps its first position."""
    x = torch.randn(1, 2, 9, 9)
    x[0, 0, 2, 2] = x[0, 0, 2, 3] = float("nan")
    x[0, 1] = -float("inf")
    s = torch.rand(1, 2, 2)
    want = torch.ops.aten.fractional_max_pool2d(x, [3, 3], [4, 4], s)
    got = fractional_max_pool2d(x, [3, 3], [4, 4], s)
    assert torch.equal(got[1], want[1])
    torch.testing.assert_close(got[0], want[0], equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("nd", [2, 3])
def test_fractional_max_pool_is_stitched_forward_and_backward(nd, dtype):
    shape = (2, 3, 11, 13) if nd == 2 else (2, 2, 6, 7, 9)
    x = torch.randn(shape).to(dtype)
    s = torch.rand(2, shape[1], nd).to(dtype)

    def f(x, s):
        if nd == 2:
            return F.fractional_max_pool2d(x, (3, 2), output_size=(5, 7), _random_samples=s, return_indices=True)
        return F.fractional_max_pool3d(x, 2, output_size=(3, 4, 5), _random_samples=s, return_indices=True)

    backend = stitchml.StitchBackend()
    xc, xe = x.clone().requires_grad_(), x.clone().requires_grad_()
    with config.override(strict=True, fallback_on_error=False):
        vc, ic = torch.compile(f, backend=backend)(xc, s)
        ve, ie = f(xe, s)
        assert torch.equal(vc, ve) and torch.equal(ic, ie)
        g = torch.randn(ve.shape).to(dtype)
        vc.backward(g)
    ve.backward(g)
    # windows sharing a maximum add their gradients: eager in the half type an add at a
    # time, the kernel in float32 rounded once; against the float64 sum at eager's indices
    # each element is no further than eager's (plus float32's rounding of another order of
    # adds, where three or more windows share a maximum)
    ref = torch.zeros(x.shape, dtype=torch.float64).flatten(2).scatter_add(
        2, ie.flatten(2), g.double().flatten(2)).view(x.shape)
    ours, eagers = (xc.grad.double() - ref).abs(), (xe.grad.double() - ref).abs()
    allowed = eagers + 4 * torch.finfo(torch.float32).eps * ref.abs() + 1e-12
    assert bool((ours <= allowed).all()), (ours - allowed).max()
    assert {r.kind for r in backend.records} == {"forward", "backward"}
    assert all(r.plan.num_kernels == 1 for r in backend.records), [r.plan.num_kernels for r in backend.records]
    assert not [f.op for r in backend.records for f in r.graph.fallbacks]


def test_the_module_without_samples_draws_them_and_compiles_stitched():
    """nn.FractionalMaxPool2d draws its samples itself (our generator, not eager's: the
    windows differ from an eager call's), then unbatched input: one kernel, no eager op,
    each value one of its plane's inputs at the index it names."""
    m = nn.FractionalMaxPool2d(2, output_ratio=0.5, return_indices=True)
    backend = stitchml.StitchBackend()
    x = torch.randn(3, 12, 10)
    with config.override(strict=True, fallback_on_error=False):
        v, i = torch.compile(m, backend=backend)(x)
    assert v.shape == (3, 6, 5)
    assert torch.equal(v, x.flatten(1).gather(1, i.flatten(1)).view_as(v))
    assert not [f.op for r in backend.records for f in r.graph.fallbacks]
