"""Issue 18.1: no silent fallback under dynamic shapes.  A graph input that is a view
with a storage offset (a slice of a buffer, a chunk saved for backward) compiles with
symbolic sizes like any other input: stitched kernels run and no graph falls back whole."""
import warnings

import pytest
import torch

import stitchml
from launches import count_launches


def _no_fallback(backend) -> None:
    for rec in backend.records:
        assert rec.eager_reason is None, (rec.kind, rec.eager_reason)
        if rec.dynamic is not None:
            assert not rec.dynamic.eager_calls, rec.dynamic.describe()


def _softmax_shift(x):
    return torch.softmax(x * 2, -1) + 1


@pytest.mark.parametrize("offset_moves", [False, True], ids=["fixed_offset", "moving_offset"])
def test_slice_with_storage_offset_compiles_under_dynamic_sizes(offset_moves):
    backend = stitchml.StitchBackend()
    f = torch.compile(_softmax_shift, backend=backend)
    base = torch.randn(80, 7)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a fallback warns: it must not happen here
        for n in (5, 9, 13, 6):
            x = base[n:2 * n] if offset_moves else base[1:1 + n]
            assert x.storage_offset() != 0
            with count_launches() as launches:
                out = f(x)
            assert launches["n"] >= 1  # stitched kernels ran, not eager
            torch.testing.assert_close(out, _softmax_shift(x), rtol=1e-5, atol=1e-6)
    assert any(r.dynamic is not None for r in backend.records)
    _no_fallback(backend)


def test_training_on_chunks_with_a_changing_length():
    """The tensor saved for backward is a chunk (a view with an offset) of a larger one."""
    def f(x, w):
        a, b = x.chunk(2, dim=-1)
        return (torch.sigmoid(a) * torch.tanh(b) * w).sum(-1)

    backend = stitchml.StitchBackend()
    g = torch.compile(f, backend=backend)
    w = torch.randn(6, requires_grad=True)
    for n in (4, 7, 11):
        x = torch.randn(n, 12, requires_grad=True)
        out = g(x, w)
        go = torch.randn_like(out)
        gx, gw = torch.autograd.grad(out, (x, w), go)
        x2 = x.detach().requires_grad_()
        w2 = w.detach().requires_grad_()
        ref = f(x2, w2)
        rx, rw = torch.autograd.grad(ref, (x2, w2), go)
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(gx, rx, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(gw, rw, rtol=1e-5, atol=1e-5)
    assert any(r.dynamic is not None for r in backend.records)
    _no_fallback(backend)


def test_float_computed_from_sizes_compiles_under_dynamic_sizes():
    """grid_sample's backward takes (size - 1) / 2 as a SymFloat input: folded in at each
    size like any size arithmetic (the whole backward graph ran eagerly before)."""
    import torch.nn.functional as F

    def f(x, g):
        return F.grid_sample(x * 2, g, padding_mode="border", align_corners=True)

    backend = stitchml.StitchBackend()
    c = torch.compile(f, backend=backend, dynamic=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for h, w in ((5, 6), (7, 9), (6, 11)):
            x = torch.randn(2, 3, h, w, requires_grad=True)
            g = (torch.rand(2, 4, 5, 2) * 2.6 - 1.3).requires_grad_()
            out = c(x, g)
            go = torch.randn_like(out)
            got = torch.autograd.grad(out, (x, g), go)
            ref = f(x, g)
            want = torch.autograd.grad(ref, (x, g), go)
            torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
            for a, b in zip(got, want):
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert any(r.kind == "backward" and r.dynamic is not None for r in backend.records)
    _no_fallback(backend)


def test_element_wise_siblings_are_one_launch_under_dynamic_sizes():
    """Dynamic graphs never pack launches horizontally; independent element-wise
    outputs of one input are one kernel instead (sibling fusion), at every size."""
    def f(s, v):
        return v + s[0], v * s[1], v - s[2]

    backend = stitchml.StitchBackend()
    c = torch.compile(f, backend=backend)
    for n in (3, 4, 5, 9, 13):
        s, v = torch.randn(n), torch.randn(n)
        with count_launches() as launches:
            out = c(s, v)
        assert launches["n"] == 1, (n, launches["n"])
        for a, b in zip(out, f(s, v)):
            torch.testing.assert_close(a, b)
    assert any(r.dynamic is not None for r in backend.records)
    _no_fallback(backend)


def _pools(x):
    return (torch.nn.functional.adaptive_max_pool2d(x * 2, (2, 3)), torch.nn.functional.adaptive_avg_pool2d(x, (3, 5)),
            torch.nn.functional.adaptive_avg_pool2d(x, 1).flatten(1),
            torch.nn.functional.adaptive_max_pool2d(x, (4, 4), return_indices=True)[1])


def test_adaptive_pooling_follows_size_changes_with_one_graph():
    """Adaptive avg/max pooling (uneven windows, global pooling, indices) at four input
    sizes, training: after the first size one dynamic graph serves the rest — the window
    length is a bound (n // out + 2, masked), not a guard on n % out, so Dynamo does not
    recompile per size class — and nothing runs eagerly; values, indices and gradients
    as eager's."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    backend = stitchml.StitchBackend()
    f = torch.compile(_pools, backend=backend)
    for h in (14, 15, 17, 21):
        x = torch.randn(2, 3, h, h + 1, requires_grad=True)
        x2 = x.detach().clone().requires_grad_()
        got, want = f(x), _pools(x2)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w)
        (got[0].sum() + got[1].square().sum() + got[2].sum()).backward()
        (want[0].sum() + want[1].square().sum() + want[2].sum()).backward()
        torch.testing.assert_close(x.grad, x2.grad)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 2   # the static graph, then one dynamic
    assert any(r.dynamic is not None for r in backend.records)
    _no_fallback(backend)
    assert not [fb for r in backend.records if r.graph for fb in r.graph.fallbacks]


def _pools_to_sizes(x, z):
    # output sizes that follow the input's: h // 2 + 1 rows, w // 3 + 1 columns (1-d
    # pooling is left out: torch's own adaptive_avg_pool1d makes its output size static,
    # a Dynamo guard per size under any backend)
    oh, ow = x.shape[-2] // 2 + 1, x.shape[-1] // 3 + 1
    return (torch.nn.functional.adaptive_avg_pool2d(x, (oh, ow)) * 2,
            torch.nn.functional.adaptive_avg_pool3d(z, (2, oh, ow)))


def test_adaptive_pooling_to_a_dynamic_output_size_is_stitched():
    """Average pooling whose output size is computed from the input's (2-d, 3-d),
    training at four sizes: the backward used to run eagerly ("to a dynamic output size
    has no stitched form"); now every graph is stitched, strict, with one dynamic graph
    after the first size, values and gradients as eager's."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    backend = stitchml.StitchBackend()
    f = torch.compile(_pools_to_sizes, backend=backend)
    for h, w in ((9, 10), (13, 17), (20, 22), (31, 8)):
        xs = [torch.randn(2, 3, h, w), torch.randn(2, 3, 3, h, w)]
        mine = [t.clone().requires_grad_() for t in xs]
        ref = [t.clone().requires_grad_() for t in xs]
        with stitchml.config.override(strict=True, fallback_on_error=False):
            got = f(*mine)
        want = _pools_to_sizes(*ref)
        cots = [torch.randn(t.shape) for t in want]
        for g, e in zip(got, want):
            torch.testing.assert_close(g, e)
        with stitchml.config.override(strict=True, fallback_on_error=False):
            torch.autograd.backward(list(got), cots)
        torch.autograd.backward(list(want), cots)
        for a, e in zip(mine, ref):
            torch.testing.assert_close(a.grad, e.grad)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 2   # the static graph, then one dynamic
    assert [r.kind for r in backend.records if r.dynamic is not None] == ["forward", "backward"]
    _no_fallback(backend)
    assert not [fb for r in backend.records if r.graph for fb in r.graph.fallbacks]
