"""Bit-level ops, boolean-mask writes, float16 nextafter and complex32, stitched (issue
19): `hash_tensor` (an XOR reduction of 64-bit patterns, a uint64 result),
`view(dtype)` bit-casts, `x[mask] = v` with values that do not vary along the mask, and
the complex ops on pairs of float16.  Against eager on fresh random inputs, outputs
poisoned, strict mode with the fallback off, kernel counts asserted."""
import pytest
import torch

import stitchml
from stitchml import config
from stitchml.testing import compare_against_float64
from launches import count_launches


def _run(fn, *args, eager_ok=(), fullgraph=False):
    """(stitched result, eager result, launches); every op in kernels except the ops
    named in `eager_ok`."""
    torch._dynamo.reset()
    backend = stitchml.StitchBackend()
    with config.override(strict=True, fallback_on_error=False, poison_outputs=True), count_launches() as launches:
        got = torch.compile(fn, backend=backend, fullgraph=fullgraph)(*args)
    assert backend.records and all(r.plan is not None for r in backend.records)
    eager = [(f.op, f.reason) for r in backend.records for f in r.graph.fallbacks]
    assert all(op in eager_ok for op, _ in eager), eager
    return got, fn(*args), launches["n"]


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _input(dtype, shape, seed):
    x = torch.randn(shape, generator=_gen(seed)) * 50
    if dtype == torch.bool:
        return x > 0
    return x.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16,
                                   torch.int32, torch.int8, torch.bool])
def test_hash_tensor_is_eagers_xor_of_64_bit_patterns(dtype):
    # rows of 3, 37 and 1100 values (a looped row), all dims, kept dims, a transposed
    # operand, and the XOR fused into the kernel that computes its operand
    for seed, (shape, kw) in enumerate([((3, 37), {"dim": 1}), ((37, 3), {}), ((5, 1100), {"dim": -1}),
                                        ((4, 6, 5), {"dim": (0, 2), "keepdim": True}), ((7, 9), {"dim": 0})]):
        x = _input(dtype, shape, seed)

        def fn(x):
            y = x.t() if x.dim() == 2 else x
            y = y + y if dtype != torch.bool else ~y
            return torch.hash_tensor(y.t() if y.dim() == 2 else y, **kw)

        got, want, launches = _run(fn, x)
        assert got.dtype == torch.uint64 and torch.equal(got, want), (shape, kw, got, want)
        assert launches == 1


def test_hash_tensor_of_a_scalar_and_of_an_empty_tensor():
    x = torch.randn((), generator=_gen(1))
    got, want, _ = _run(lambda x: torch.hash_tensor(x * 3), x)
    assert torch.equal(got, want)
    e = torch.randn(0, 4)   # (eager refuses to reduce an empty dim: kept empty dims only)
    got, want, launches = _run(lambda e: torch.hash_tensor(e * 2, dim=1), e)
    assert got.shape == want.shape == (0,) and got.dtype == torch.uint64 and launches == 0


def test_bit_casts_between_types_of_one_size_fuse_with_their_neighbours():
    x = torch.randn(6, 11, generator=_gen(2))

    def fn(x):
        return ((x * 2).view(torch.int32) + 1,
                (x.bfloat16() + 1).view(torch.int16),     # rounded to bf16 as eager stored it
                (x.half() * 3).view(torch.int16),
                x.view(torch.uint32).t(),                 # an unsigned result, viewed
                x.double().view(torch.uint64),
                ((x * 1000).to(torch.int32).view(torch.float32) * 0).nan_to_num(),
                x.view(torch.uint32).view(torch.float32) * 2)   # read back through a bit-cast

    got, want, launches = _run(fn, x)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and torch.equal(g, w)
    assert launches == 1


def test_bit_cast_between_sizes_and_arithmetic_on_wide_unsigned_values_run_eagerly_with_reasons():
    x = torch.randn(4, 8, generator=_gen(3))
    fn = lambda x: ((x * 2).view(torch.int16) + 1, (x.view(torch.uint32) == x.view(torch.uint32)))
    got, want, _ = _run(fn, x, eager_ok=("aten.view.dtype", "aten.eq.Tensor"))
    assert all(torch.equal(g, w) for g, w in zip(got, want))
    report = stitchml.explain(fn, x)
    reasons = {f.op: f.reason for f in report.fallbacks}
    assert "changes the last dim" in reasons["aten.view.dtype"], reasons
    assert "torch.uint32 is not supported" in reasons["aten.eq.Tensor"], reasons


MASKED = {
    # x shape, mask over dims [p, p + mask.dim()), values shape, accumulate (through
    # index_put(..., accumulate=True): `y[mask] += v` reads y[mask] first, a
    # data-dependent shape where Dynamo itself breaks the graph)
    "rows": ((5, 5), 0, (5,), (5,), False),
    "rows_add": ((5, 5), 0, (5,), (5,), True),
    "scalar_2d_mask_add": ((4, 6, 3), 0, (4, 6), (), True),
    "middle_dim": ((4, 6, 3), 1, (6,), (3,), False),
    "middle_keepdim_values": ((4, 6, 3), 1, (6,), (4, 1, 3), False),
    "trailing_mask": ((4, 6, 3), 1, (6, 3), (4, 1), False),
    "mask_token": ((2, 9, 8), 0, (2, 9), (8,), False),      # wav2vec2's masked_spec_embed
}


@pytest.mark.parametrize("name", list(MASKED))
def test_a_boolean_mask_write_of_values_that_do_not_vary_along_it_is_one_where(name):
    """One graph (fullgraph), one kernel, gradients for x and v: without the
    masked_setitem rewrite, index_put's backward (grad[mask] for v) breaks the graph."""
    shape, p, mshape, vshape, acc = MASKED[name]
    x = torch.randn(shape, generator=_gen(4), requires_grad=True)
    mask = torch.rand(mshape, generator=_gen(5)) > 0.5
    v = torch.randn(vshape, generator=_gen(6), requires_grad=True)

    def fn(x, mask, v):
        y = x * 2
        if acc:
            y = y.index_put((mask,), v, accumulate=True)
        else:
            y[(slice(None),) * p + (mask,)] = v
        return y.exp()

    got, want, launches = _run(fn, x, mask, v, fullgraph=True)
    assert torch.allclose(got, want, rtol=1e-6, atol=1e-6)
    assert launches == 1
    # gradients flow to x (where the mask keeps it) and to v (summed over the positions)
    want_g = torch.autograd.grad(want.sum(), (x, v))
    with config.override(strict=True, fallback_on_error=False):
        got2 = torch.compile(fn, backend=stitchml.StitchBackend(), fullgraph=True)(x, mask, v)
        got_g = torch.autograd.grad(got2.sum(), (x, v))
    for a, e in zip(got_g, want_g):
        assert torch.allclose(a, e, rtol=1e-5, atol=1e-5)
    records = [r for r in stitchml.explain(fn, x, mask, v).patterns if r.pattern == "masked_setitem"]
    assert [r.applied for r in records] == [True], records


def test_a_boolean_mask_write_of_one_value_per_selected_element_runs_eagerly_with_its_reason():
    x = torch.randn(5, 5, generator=_gen(7))
    mask = torch.tensor([True, False, True, True, False])
    v = torch.randn(3, 5, generator=_gen(8))

    def fn(x, mask, v):
        y = x * 2
        y[mask] = v
        return y + 1

    got, want, _ = _run(fn, x, mask, v, eager_ok=("aten.index_put.default",))
    assert torch.equal(got, want)
    reasons = {f.op: f.reason for f in stitchml.explain(fn, x, mask, v).fallbacks}
    assert "data-dependent number" in reasons["aten.index_put.default"], reasons


def test_nextafter_in_float16_steps_the_float16_bit_pattern():
    special = [(0.0, 1.0), (-0.0, -1.0), (1.0, 2.0), (-1.0, 0.0), (65504.0, float("inf")), (-65504.0, 0.0),
               (float("inf"), 0.0), (float("-inf"), 0.0), (float("nan"), 1.0), (1e-7, 0.0), (-6e-8, 0.0),
               (2.0, 2.0), (3.5, -4.0), (0.0, -1.0), (1.0, float("nan")), (6.1e-5, 0.0), (6.1e-5, 1.0)]
    a = torch.cat([torch.tensor([s[0] for s in special]), torch.randn(60, generator=_gen(9))]).half()
    b = torch.cat([torch.tensor([s[1] for s in special]), torch.randn(60, generator=_gen(10))]).half()
    got, want, launches = _run(lambda a, b: torch.nextafter(a * 1, b), a, b)
    nan = want.isnan()
    assert torch.equal(got.isnan(), nan)
    assert torch.equal(got.view(torch.int16)[~nan], want.view(torch.int16)[~nan])
    assert launches == 1


def test_complex32_arithmetic_on_float16_pairs_is_no_further_from_float64_than_eager():
    x = torch.randn(3, 7, 2, generator=_gen(11)).half()
    y = torch.randn(3, 7, 2, generator=_gen(12)).half()

    def fn(x, y):
        z, w = torch.view_as_complex(x), torch.view_as_complex(y)
        u = z * w + z - w * 2
        return torch.view_as_real(u), u.abs(), torch.view_as_real(torch.conj(u) * z)

    with config.override(strict=True, fallback_on_error=False), count_launches() as launches:
        cmp, judgement = compare_against_float64(fn, [x, y], backward=False)
    judgement.assert_ok()
    assert not [f for r in cmp.backend.records for f in r.graph.fallbacks]
    assert launches["n"] == 1


def test_a_mask_token_write_keeps_working_when_the_length_changes():
    """Under dynamic shapes the mask (an input) and the frames have different symbolic
    lengths: the rewrite compares them by a guard on their relation, not on a value, so
    three lengths compile two graphs (static, then dynamic) and v keeps its gradient."""
    torch._dynamo.reset()
    v = torch.randn(8, generator=_gen(13), requires_grad=True)
    backend = stitchml.StitchBackend()

    def fn(x, mask, v):
        h = torch.nn.functional.conv1d(x, torch.ones(8, 8, 3) * 0.1)   # frames: T - 2
        h = h.transpose(1, 2) * 1.0
        h[mask] = v
        return h.tanh()

    compiled = torch.compile(fn, backend=backend, fullgraph=True)
    for i, t in enumerate((12, 9, 15)):
        x = torch.randn(2, 8, t, generator=_gen(20 + i))
        mask = torch.rand(2, t - 2, generator=_gen(30 + i)) > 0.5
        with config.override(strict=True, fallback_on_error=False):
            got = compiled(x, mask, v)
            (gv,) = torch.autograd.grad(got.sum(), (v,))
        want = fn(x, mask, v)
        (wv,) = torch.autograd.grad(want.sum(), (v,))
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-6) and torch.allclose(gv, wv, rtol=1e-4, atol=1e-5)
    assert len({id(r) for r in backend.records if r.kind in ("forward", "inference")}) == 2, \
        [(r.kind, r.dynamic is not None) for r in backend.records]


def test_mask_writes_keep_eagers_signed_zeros_errors_and_overlapping_targets():
    m = torch.tensor([True, False, False])
    x = torch.tensor([-0.0, -0.0, 1.0])
    v = torch.tensor([1.0])
    # accumulate leaves the unselected -0.0 alone (y + where(m, v, 0) made it +0.0)
    for fn in (lambda x, m, v: (x * 1).index_put((m,), v, accumulate=True),
               lambda x, m, v: (x * 1).index_put_((m,), v, True)):
        got, want, _ = _run(fn, x, m, v, fullgraph=True)
        assert torch.equal(got, want) and torch.equal(torch.signbit(got), torch.signbit(want)), (got, want)
    # where eager raises, so do we: values of another dtype (eager casts 0-d values only)
    y = torch.randn(4, 5, generator=_gen(14))
    mask = torch.tensor([True, False, True, False])

    def other_dtype(y, mask):
        y = y * 1
        y[mask] = torch.arange(5)
        return y

    with pytest.raises(RuntimeError) as eager_error:
        other_dtype(y, mask)
    torch._dynamo.reset()
    with pytest.raises(Exception) as compiled_error:
        with config.override(fallback_on_error=False):
            torch.compile(other_dtype, backend=stitchml.StitchBackend())(y, mask)
    assert str(eager_error.value)[:40] in str(compiled_error.value), compiled_error.value

    # a write into an expanded view (elements that share memory): functionalisation drops
    # it (aot_eager returns the unwritten values), so the graph runs as traced, with a
    # warning and its reason (an error under strict)
    def expanded(x, mask, v):
        y = x.expand(3, 4, 5)
        y[:, mask] = v
        return y * 1

    xe, ve = torch.randn(4, 5, generator=_gen(15)), torch.randn(5, generator=_gen(16))
    torch._dynamo.reset()
    backend = stitchml.StitchBackend()
    with pytest.warns(UserWarning, match="share memory"):
        got = torch.compile(expanded, backend=backend)(xe.clone(), mask, ve)
    assert torch.equal(got, expanded(xe.clone(), mask, ve))
    assert [r.eager_reason is not None and "expanded" in r.eager_reason for r in backend.records] == [True]
    torch._dynamo.reset()
    with pytest.raises(Exception, match="share memory"):
        with config.override(strict=True):
            torch.compile(expanded, backend=stitchml.StitchBackend())(xe.clone(), mask, ve)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_nextafter_of_computed_half_values_rounds_them_first(dtype):
    """a / 3 held in float32 is not eager's rounded half value: equal to b = a / 3 in the
    half type, and a tiny product is the half type's zero (a step from it is no NaN)."""
    a = (torch.rand(64, generator=_gen(17)) * 4 + 0.1).to(dtype)
    b = a / 3
    for fn in (lambda a, b: torch.nextafter(a / 3, b), lambda a, b: torch.nextafter(a * 1e-6, -b)):
        got, want, _ = _run(fn, a, b)
        assert torch.equal(got.view(torch.int16), want.view(torch.int16)), (got, want)


def test_a_bit_cast_to_bfloat16_keeps_subnormals():
    bits = torch.tensor([1, 0x40, 0x7F, -32765, 0x3F80, 0x0080], dtype=torch.int16)
    got, want, _ = _run(lambda b: ((b + 0).view(torch.bfloat16) * 1).view(torch.int16), bits)
    assert torch.equal(got, want), (got, want)


def test_python_integers_wrap_into_narrow_integer_types_as_in_eager():
    """uint8 - 1 is 255 and uint8 + 300 adds 44 in eager; an out-of-range Triton literal
    was an error at launch (a crash inside stitchml, the graph lost to the fallback)."""
    x = torch.randint(0, 255, (37,), dtype=torch.uint8, generator=_gen(18))
    m = torch.rand(37, generator=_gen(19)) > 0.5
    fn = lambda x, m: (x.masked_fill(m, -1), x + 300, x * 3 + 250, (x.to(torch.int8) - 1000) * 2,
                       x.to(torch.int16) * 40000, x.long() + 2 ** 40)
    got, want, launches = _run(fn, x, m)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and torch.equal(g, w), (g, w)
    assert launches == 1
