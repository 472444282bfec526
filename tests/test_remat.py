"""Knob `remat` (on by default): AOTAutograd's min-cut partitioner recomputes cheap
element-wise values in the backward instead of saving them.  RMSNorm is the case it
pays for: the backward then reads x, its row rsqrt and the gradient, not a saved
normalised copy of x."""
import pytest
import torch
import torch.nn.functional as F

from stitchml import config
from stitchml.testing import compare_with_eager


def rms_norm(x, w):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * w


def _saved_full_tensors(remat: bool) -> tuple[int, object]:
    x = torch.randn(48, 40, requires_grad=True)
    w = torch.randn(40, requires_grad=True)
    with config.override(remat=remat):
        c = compare_with_eager(rms_norm, [x, w])
    (bwd,) = [r for r in c.backend.records if r.kind == "backward"]
    # inputs of the backward graph shaped like x, other than x itself and the incoming gradient
    full = [n for n in bwd.graph.nodes if n.kind == "input" and n.shape == (48, 40)
            and not n.op.startswith(("primals", "tangents"))]
    return len(full), c


def test_remat_recomputes_the_normalised_input_instead_of_saving_it():
    saved_default, c0 = _saved_full_tensors(False)
    saved_remat, c1 = _saved_full_tensors(True)
    assert saved_default >= 1 and saved_remat == 0
    assert c1.num_kernels >= 1 and all(r.eager_reason is None for r in c1.backend.records)


def test_remat_is_on_by_default():
    from torch._functorch.partitioners import default_partition

    from stitchml.capture.backend import _remat_partition, partitioner
    assert config.KNOBS["remat"].default is True
    with config.override(remat=False):
        assert partitioner() is default_partition
    with config.override(remat=True):
        assert partitioner() is _remat_partition


def test_remat_guard_spots_a_comparison_with_a_recomputed_tensor():
    from stitchml.capture.backend import _compares_recomputed
    aten = torch.ops.aten

    def graph(recompute: bool) -> torch.fx.GraphModule:
        g = torch.fx.Graph()
        x, m = g.placeholder("x"), g.placeholder("m")
        y = g.call_function(aten.sigmoid.default, (x,)) if recompute else x
        g.output(g.call_function(aten.eq.Tensor, (y, m)))
        return torch.fx.GraphModule(torch.nn.Module(), g)

    assert _compares_recomputed(graph(True)) and not _compares_recomputed(graph(False))


def test_remat_max_backward_stays_exact():
    # amax's backward masks `x == max`: with x recomputed in a kernel (another rounding)
    # the mask could lose its hit; the guard keeps the default partition there
    def f(x):
        return torch.sigmoid(x).half().amax(-1).float().sum() + x.sum()

    with config.override(remat=True):
        c = compare_with_eager(f, [torch.randn(16, 24, requires_grad=True)])
    assert c.num_kernels >= 2


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_a_cast_out_of_a_half_type_rounds_like_eager(dtype):
    """Kernels hold half-precision values in float32 unrounded between ops, but
    `(a * b).float()` asks for the rounded product (exact in float32, then rounded once:
    eager's value): bit for bit eager's, also as an integer or a bool."""
    a, b = torch.randn(97, 33).to(dtype) * 30, torch.randn(97, 33).to(dtype)
    b[0, :5] = 1e-4   # products that round to zero in the half type

    def f(a, b):
        p = a * b
        return p.float() * 0.5, p.to(torch.int32), p.to(torch.bool)
    got = torch.compile(f, backend="stitch")(a, b)
    for g, want in zip(got, f(a, b)):
        assert torch.equal(g, want)


def test_remat_layer_norm_over_one_element_in_half_precision_has_a_zero_gradient():
    """A layer norm over one element is constant: its gradient is exactly zero.  The
    backward recomputes the normalised input, x - mean with the mean rounded to float16;
    the recomputed x must be rounded the same way (fuzz seed 7046 of the long profile)."""
    def f(a, s):
        return F.layer_norm((a + 2.0).reshape(1) * s, (1,))
    a = torch.randn((), dtype=torch.float16)
    s = (torch.rand(1) + 0.5).to(torch.float16).requires_grad_()
    with config.override(remat=True):
        out = torch.compile(f, backend="stitch")(a, s)
    out.sum().backward()
    assert torch.equal(s.grad, torch.zeros_like(s))
