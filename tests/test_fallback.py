"""Ops without a lowering run eagerly between stitched kernels, with their reason."""
import torch
import torch.nn.functional as F

from stitchml import explain
from stitchml.testing import compare_with_eager


def fft_between(x, w, b):
    s = torch.softmax(x, -1)
    f = torch.fft.rfft(s, dim=-1).abs()
    return F.layer_norm(f, (f.shape[-1],), w, b)


def test_unknown_op_runs_eagerly_between_stitched_regions():
    x = torch.randn(12, 30, requires_grad=True)
    w = torch.randn(16, requires_grad=True)
    b = torch.randn(16, requires_grad=True)
    cmp = compare_with_eager(fft_between, [x, w, b], backward=True)
    fwd = [r for r in cmp.backend.records if r.kind == "forward"][0]
    assert fwd.plan is not None
    kinds = [type(s).__name__ for s in fwd.plan.steps]
    # softmax kernel, then the eager FFT, then the layer-norm kernel
    first_eager = kinds.index("EagerStep")
    assert "KernelPlan" in kinds[:first_eager] and "KernelPlan" in kinds[first_eager:]
    report = explain(fft_between, x.detach(), w.detach(), b.detach())
    ops = {f.op: f.reason for f in report.fallbacks}
    assert "aten._fft_r2c.default" in ops
    assert ops["aten._fft_r2c.default"]  # a reason is given
    text = report.to_text()
    assert "aten._fft_r2c.default" in text and "eager" in text
    schemes = {k.scheme for k in report.kernels}
    assert "regional" in schemes  # softmax and layer-norm are stitched around it


def test_matmul_is_left_to_the_vendor_library():
    a, w = torch.randn(8, 16), torch.randn(16, 12)
    report = explain(lambda a, w: torch.relu(a @ w + 1.0), a, w)
    reasons = {f.op: f.reason for f in report.fallbacks}
    assert any("mm" in op for op in reasons)
    assert all("compute-intensive" in r for op, r in reasons.items() if "mm" in op)
    assert report.num_kernels == 1


def test_cpu_tensors_without_interpreter_fall_back_with_reason(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    x = torch.randn(4, 5)
    report = explain(lambda x: torch.softmax(x, -1), x)
    assert report.num_kernels == 0
    assert any("TRITON_INTERPRET" in f.reason for f in report.fallbacks)
