"""Ops the differential fuzzer's strided-view family (`_Builder.strided_ops`, seeds from
41600) and its check that no op runs eagerly found left to eager: `unfold` of an expanded
or offset input (torch's decomposition into `as_strided` with the operand's strides),
`prims.copy_strided` (torch's references of element-wise ops in float16), the sum of
complex values (the gradient of a broadcast complex product) and float64 embedding
gradients.  Each against eager with the fallback off, outputs poisoned (conftest), and no
op left eager."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from launches import count_launches
from stitchml import StitchBackend, config
from stitchml.testing import compare_with_eager


def _stitched(fn, inputs, *, launches=None, **tol):
    """Compare with eager (forward and backward), fallback off; no op left eager, every
    graph compiled; `launches`: the exact kernel launches of the forward call alone."""
    with config.override(fallback_on_error=False):
        cmp = compare_with_eager(fn, inputs, **tol)
    assert cmp.backend.records and all(r.plan is not None for r in cmp.backend.records)
    left = [(r.kind, f.op, f.reason) for r in cmp.backend.records for f in r.graph.fallbacks]
    assert not left, left
    if launches is not None:
        with config.override(fallback_on_error=False), count_launches() as n:
            torch.compile(fn, backend="stitch")(*[x.detach() for x in inputs])
        assert n["n"] == launches, n
    return cmp


def _layout_input(case: str) -> torch.Tensor:
    """A fresh input of the case's layout (the same values at every call)."""
    g = torch.Generator().manual_seed(7)
    if case == "expanded":   # stride 0 along dim 0
        return torch.randn(1, 7, generator=g).expand(5, 7).requires_grad_()
    if case == "offset":     # a storage offset and gaps
        return torch.randn(4, 12, generator=g)[1:, 1:].requires_grad_()
    return torch.randn(2, 3, 9, 8, generator=g).requires_grad_()


@pytest.mark.parametrize("case", ["expanded", "offset", "twice"])
def test_unfold_of_an_input_in_any_layout_is_an_index_map(case):
    # seeds 42894 and 43117 (an expanded input: "as_strided of an operand whose storage
    # overlaps"), 42794 and 43133 (an input with a storage offset): `unfold` went through
    # torch's decomposition into as_strided with the input's strides, which addresses
    # storage, and ran eagerly; now a view of the elements, (.., i, .., k) -> (.., i*step + k, ..).
    # (Inputs made afresh for each run: compare_with_eager's copies would not keep the layout.)
    fn = {"expanded": lambda a: torch.sin(a.unfold(0, 2, 1)) * a.unfold(1, 3, 2).sum(-1).mean(),
          "offset": lambda a: a.unfold(1, 3, 2) * 2,
          "twice": lambda a: a.unfold(2, 3, 1).unfold(3, 2, 2).exp().sum(-1)}[case]   # windows of windows
    ex, co = _layout_input(case), _layout_input(case)
    assert ex.stride() == co.stride() and ex.storage_offset() == co.storage_offset()
    backend = StitchBackend()
    with config.override(fallback_on_error=False), count_launches() as n:
        got = torch.compile(fn, backend=backend)(co)
    want = fn(ex)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    cot = torch.randn_like(want)
    (gw,), (gg,) = torch.autograd.grad(want, ex, cot), torch.autograd.grad(got, co, cot)
    torch.testing.assert_close(gg, gw, rtol=1e-5, atol=1e-5)
    assert not [f for r in backend.records for f in r.graph.fallbacks]
    assert n["n"] == 1   # the forward: one kernel


@pytest.mark.parametrize("case", ["bf16_transposed", "zero_d", "copy"])
def test_unfold_forms_match_eager(case):
    if case == "bf16_transposed":
        fn, x = (lambda a: a.t().unfold(0, 4, 3).float().cos()), torch.randn(6, 11, dtype=torch.bfloat16)
    elif case == "zero_d":
        fn, x = (lambda a: a.unfold(0, 1, 1) + 1), torch.randn(())
    else:
        fn, x = (lambda a: torch.ops.aten.unfold_copy(a, 1, 2, 2) * 3), torch.randn(3, 8)
    tol = {"rtol": 2e-2, "atol": 2e-2} if x.dtype == torch.bfloat16 else {}
    _stitched(fn, [x.detach().requires_grad_()], launches=1, **tol)


def test_copy_strided_is_a_copy_with_eagers_strides():
    # seeds 43022, 43045, 43121, 43195: torch's reference of `lerp` in float16 over a
    # transposed operand ends in prims.copy_strided, which had no rule
    def f(a, b):
        return torch.lerp(torch.square(torch.softmax(a, 1)).t() * 0.5, b, 0.25)

    a, b = torch.randn(48, 5, dtype=torch.float16), torch.randn(5, 48, dtype=torch.float16)
    cmp = _stitched(f, [a, b], rtol=1e-3, atol=1e-3)
    assert cmp.outputs.stride() == cmp.expected.stride()
    # the prim itself, with strides of its own
    cmp = _stitched(lambda x: torch.ops.prims.copy_strided(x * 2, (1, 4)), [torch.randn(4, 6)])
    assert cmp.outputs.stride() == (1, 4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sums_of_complex_values_stitch(dtype):
    # seeds 42702, 42960: the gradient of a rotary product by `polar(1, angles)` whose
    # angles are broadcast over a batch sums complex values over the batch
    # (aten.sum.dim_IntList on complex: "no lowering rule for complex values")
    def rotate(x, t):
        return torch.view_as_real(torch.view_as_complex(x) * torch.polar(torch.ones_like(t), t))

    def means(x):
        z = torch.view_as_complex(x)
        return torch.view_as_real(z.conj().mean(1, keepdim=True).resolve_conj()), torch.view_as_real(z.sum())

    _stitched(rotate, [torch.randn(4, 6, 2, dtype=dtype).requires_grad_(),
                       torch.randn(6, dtype=dtype).requires_grad_()])
    _stitched(means, [torch.randn(5, 3, 2, dtype=dtype).requires_grad_()])


@pytest.mark.parametrize("form", ["scatter", "dense", "compact"])
def test_float64_embedding_gradients_sum_in_float64(form, monkeypatch):
    # seeds 42785, 42845, 42990, 43017: "scatter-add kernels accumulate in float32:
    # torch.float64 gradients run eagerly"; each of the three forms now sums in float64
    # (within float64's tolerance of eager: a float32 sum would be ~1e-7 off)
    from stitchml.lower import rules_index
    rows, tokens = {"scatter": (20, 12), "dense": (3, 64), "compact": (200, 10)}[form]
    monkeypatch.setattr(rules_index, "COMPACT_MIN_SAVED_BYTES", 0)   # (the compact form at a test's size)
    w = torch.randn(rows, 5, dtype=torch.float64, requires_grad=True)
    ids = torch.randint(0, rows, (tokens,))
    ids[0], ids[2] = 1, ids[1]   # the padding row read, and a duplicate
    with config.override(compact_embedding_grads=form == "compact"):
        cmp = _stitched(lambda w, i: F.embedding(i, w, padding_idx=1).sin(), [w, ids])
    src = "".join(k.source for r in cmp.backend.records if r.kind == "backward" for k in r.kernels.values())
    assert ("atomic_add" in src) == (form != "dense") and "float32" not in src
