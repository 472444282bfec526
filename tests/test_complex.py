"""Complex numbers lowered as pairs of reals (lower/rules_complex.py, issue 19.4):
rotary embeddings written with complex numbers (the original LLaMA code) stitch,
forward and backward; FFT stays a library op, with its reason."""
from __future__ import annotations

import pytest
import torch

from launches import count_launches
from stitchml import config, explain
from stitchml.testing import compare_with_eager


def _strict(fn, inputs, **kw):
    with config.override(fallback_on_error=False), count_launches() as n:
        cmp = compare_with_eager(fn, inputs, **kw)
    assert all(r.plan is not None for r in cmp.backend.records), [r.eager_reason for r in cmp.backend.records]
    return cmp, n["n"]


def _fallbacks(cmp):
    return [(f.op, f.reason) for r in cmp.backend.records for f in r.graph.fallbacks]


def llama_rotary(xq, xk, freqs_cis):
    """facebookresearch/llama's apply_rotary_emb, as written there (complex numbers)."""
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    shape = [d if i == 1 or i == xq_.ndim - 1 else 1 for i, d in enumerate(xq_.shape)]
    fc = freqs_cis.view(*shape)
    xq_out = torch.view_as_real(xq_ * fc).flatten(3)
    xk_out = torch.view_as_real(xk_ * fc).flatten(3)
    return xq_out.type_as(xq), xk_out.type_as(xk)


def _freqs(seq, half, theta=10000.0):
    freqs = 1.0 / (theta ** (torch.arange(0, half).float() / half))
    t = torch.arange(seq).float()
    return torch.polar(torch.ones(seq, half), torch.outer(t, freqs))


def test_llama_rotary_with_complex_numbers_stitches_forward_and_backward():
    b, s, h, d = 2, 5, 3, 8
    xq, xk = torch.randn(b, s, h, d, requires_grad=True), torch.randn(b, s, h, d, requires_grad=True)
    cmp, launches = _strict(llama_rotary, [xq, xk, _freqs(s, d // 2)])
    assert not _fallbacks(cmp), _fallbacks(cmp)
    # forward and backward: one kernel each for both rotations (the backward's conjugate
    # of the frequencies computed inside it); no copies of complex values
    assert [r.plan.num_kernels for r in cmp.backend.records] == [1, 1]
    assert launches == 2


def test_llama_rotary_in_bfloat16_matches_eager():
    b, s, h, d = 1, 4, 2, 8
    xq = torch.randn(b, s, h, d, dtype=torch.bfloat16, requires_grad=True)
    xk = torch.randn(b, s, h, d, dtype=torch.bfloat16, requires_grad=True)
    cmp, _ = _strict(llama_rotary, [xq, xk, _freqs(s, d // 2)])
    assert not _fallbacks(cmp)


def test_complex_arithmetic_abs_angle_polar():
    x = torch.randn(3, 4, 2, requires_grad=True)
    y = torch.randn(3, 4, 2)
    special = torch.tensor([[0.0, 0.0], [-0.0, 0.0], [-1.0, 0.0], [-1.0, -0.0], [3e30, 4e30], [1e-30, -2e-30],
                            [float("inf"), 1.0], [1.0, float("-inf")], [-2.0, 1e-8], [0.0, -5.0]])

    def fn(x, y, sp):
        z, w = torch.view_as_complex(x), torch.view_as_complex(y)
        u = z * w + z - w * 2 + (1 - 2j) * z
        p = torch.polar(z.abs(), w.angle())
        zs = torch.view_as_complex(sp)
        return torch.view_as_real(u + p), u.abs(), zs.abs(), zs.angle(), torch.view_as_real(torch.conj(u) * z)

    cmp, _ = _strict(fn, [x, y, special])
    assert not _fallbacks(cmp), _fallbacks(cmp)


def test_complex128_runs_in_float64_and_angle_is_refused_with_a_reason():
    x = torch.randn(3, 4, 2, dtype=torch.float64, requires_grad=True)

    def fn(x):
        z = torch.view_as_complex(x)
        return torch.view_as_real(z * z.conj() + z), z.angle()

    cmp, _ = _strict(fn, [x], backward=False)
    reasons = _fallbacks(cmp)
    assert [op for op, _ in reasons] == ["aten.angle.default"], reasons
    assert "float64" in reasons[0][1]


def test_fft_stays_a_library_op_with_its_reason():
    x = torch.randn(4, 16)
    report = explain(lambda x: torch.fft.rfft(torch.softmax(x, -1), dim=-1).abs() * 2, x)
    reasons = {f.op: f.reason for f in report.fallbacks}
    assert "library op" in reasons["aten._fft_r2c.default"], reasons
    assert list(reasons) == ["aten._fft_r2c.default"]  # |.| * 2 of its result is a kernel again
    assert report.num_kernels == 2


FFT_NEIGHBOURS = {
    # the ops around an FFT in its forward or backward graph: pads and crops of complex
    # values (n= beyond or below the length), slice_backward, new_zeros + copy, diagonal,
    # diagonal_scatter
    "hfft_pad": (lambda z: torch.fft.hfft(z, n=10), True),
    "irfft_crop": (lambda z: torch.fft.irfft(z, n=5), True),
    "rfft_pad": (lambda x: torch.view_as_real(torch.fft.rfft(x, n=12)) * 2, False),
    "ihfft": (lambda x: torch.view_as_real(torch.fft.ihfft(x).resolve_conj()).sum(-1), False),
    "fft_diagonal": (lambda x: torch.view_as_real(torch.fft.fft(x).diagonal(1)), False),
    # the diagonal (offset -1, dims swapped) of an FFT's result replaced by a crop of it:
    # diagonal_scatter of complex values (its backward a diagonal and a zeroed diagonal)
    "fft_diagonal_scatter": (lambda x: torch.view_as_real(torch.diagonal_scatter(
        torch.fft.fft(x), torch.fft.fft(x)[:, 0] * (1 + 2j), -1, 1, 0)), False),
    "conj_physical_fill": (lambda x: torch.view_as_real(torch.conj_physical(torch.fft.fft(x))
                                                        + torch.ones_like(torch.fft.fft(x)) * (2 - 1j)), False),
}


@pytest.mark.parametrize("name", list(FFT_NEIGHBOURS))
def test_complex_pads_crops_and_diagonals_around_ffts_stitch(name):
    """Forward and backward against eager (float64); every op but the FFTs themselves in
    kernels (they ran eagerly for "no lowering rule" on complex values)."""
    f, complex_input = FFT_NEIGHBOURS[name]
    x = torch.randn(5, 6, dtype=torch.complex128 if complex_input else torch.float64, requires_grad=True)
    with count_launches() as launches:
        cmp = compare_with_eager(f, [x], rtol=1e-9, atol=1e-9)
    ops = {op for op, _ in _fallbacks(cmp)}
    assert ops and all("_fft_" in op for op in ops), _fallbacks(cmp)
    assert launches["n"] >= 1


def test_a_complex_matrix_product_is_a_library_op_not_a_missing_rule():
    a = torch.randn(2, 3, 4, dtype=torch.complex64)
    b = torch.randn(2, 4, 5, dtype=torch.complex64)
    cmp = compare_with_eager(lambda a, b: torch.view_as_real(torch.bmm(a, b) * 2), [a, b], backward=False)
    reasons = dict(_fallbacks(cmp))
    assert reasons["aten.bmm.default"] == "compute-intensive: vendor library", reasons


def test_a_saved_complex_value_is_laid_out_as_eager_lays_it_out(caplog):
    # fuzz seed 44635: `polar(1, t)` of a transposed `t` is a complex value eager lays out
    # transposed; the forward wrote its pair contiguously, so the backward's view_as_real of
    # the saved value found other strides than its metadata's, and the wrapper copied it at
    # every call with a warning.  The forward now writes the pair in eager's layout.
    def f(x, t):
        z = torch.view_as_complex(x.clone(memory_format=torch.contiguous_format)) * torch.polar(torch.ones_like(t), t)
        return z.real * 2.0 - z.imag

    t = torch.randn(3, 2).t().detach().requires_grad_()
    with caplog.at_level("WARNING", logger="stitchml"):
        cmp, _ = _strict(f, [torch.randn(2, 3, 2, requires_grad=True), t])
    assert not [r.getMessage() for r in caplog.records if r.name == "stitchml"]
    assert not _fallbacks(cmp)
