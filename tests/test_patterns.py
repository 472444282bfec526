"""Planner v1 patterns (issue: each is exactly ONE Triton launch), checked against
eager on fresh random inputs with real launches counted under the interpreter."""
import pytest
import torch
import torch.nn.functional as F

from stitchml import explain
from stitchml.testing import compare_with_eager
from launches import count_launches

R, C = 24, 130  # non-power-of-two row length, several packed rows per program


def layer_norm(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b, 1e-5)


def rms_norm(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


def bias_gelu(x, b):
    return F.gelu(x + b)


def residual_layer_norm(x, r, w, b):
    return layer_norm(x + r, w, b)


def softmax(x):
    return torch.softmax(x, -1)


def _inputs(*shapes, grad=False):
    return [torch.randn(*s, requires_grad=grad) for s in shapes]


FORWARD = {
    "layer_norm": (layer_norm, [(R, C), (C,), (C,)]),
    "softmax": (softmax, [(R, C)]),
    "rms_norm": (rms_norm, [(R, C), (C,)]),
    "bias_gelu": (bias_gelu, [(R, C), (C,)]),
    "residual_layer_norm": (residual_layer_norm, [(R, C), (R, C), (C,), (C,)]),
}


@pytest.mark.parametrize("name", sorted(FORWARD))
def test_forward_pattern_is_one_launch(name):
    fn, shapes = FORWARD[name]
    inputs = _inputs(*shapes)
    with count_launches() as n:
        cmp = compare_with_eager(fn, inputs, backward=False)
    assert n["n"] == 1, f"{name}: {n['n']} launches"
    report = explain(fn, *inputs)
    assert report.num_kernels == 1
    expected_scheme = "local" if name == "bias_gelu" else "regional"
    assert report.kernels[0].scheme == expected_scheme
    assert not report.fallbacks
    assert cmp.num_kernels == 1


def test_layer_norm_training_forward_also_writes_mean_and_rstd():
    x, w, b = _inputs((R, C), (C,), (C,), grad=True)
    cmp = compare_with_eager(layer_norm, [x, w, b], backward=True)
    fwd = [r for r in cmp.backend.records if r.kind == "forward"][0]
    assert fwd.plan.num_kernels == 1
    (k,) = fwd.plan.kernels
    shapes = sorted(fwd.graph[o].shape for o in k.outputs)
    # y (R, C) plus per-row statistics saved for backward (mean and rstd, (R, 1))
    assert shapes.count((R, 1)) == 2 and (R, C) in shapes


def test_softmax_backward_is_one_launch():
    (x,) = _inputs((R, C), grad=True)
    cmp = compare_with_eager(softmax, [x], backward=True)
    bwd = [r for r in cmp.backend.records if r.kind == "backward"][0]
    assert bwd.plan.num_kernels == 1
    assert bwd.plan.kernels[0].scheme == "regional"
    y = torch.compile(softmax, backend="stitch")(x.detach().clone().requires_grad_())
    g = torch.randn_like(y)
    with count_launches() as n:
        y.backward(g)
    assert n["n"] == 1


def test_residual_dropout_layer_norm_is_one_launch():
    x, r, w, b = _inputs((R, C), (R, C), (C,), (C,))

    def fn(x, r, w, b):
        d = F.dropout(x, 0.2, training=True)
        return layer_norm(r + d, w, b), d

    compiled = torch.compile(fn, backend="stitch")
    with count_launches() as n:
        out, d = compiled(x, r, w, b)
    assert n["n"] == 1
    report = explain(fn, x, r, w, b)
    assert report.num_kernels == 1 and report.kernels[0].scheme == "regional"
    # the dropped tensor is x/(1-p) or 0 elementwise, and the output is its layer norm
    kept = d != 0
    torch.testing.assert_close(d[kept], x[kept] / 0.8)
    assert 0.7 < kept.float().mean().item() < 0.9
    torch.testing.assert_close(out, layer_norm(r + d, w, b), rtol=1e-4, atol=1e-5)


def test_dropout_output_is_consistent_with_its_mask_and_seeded():
    x = torch.randn(64, 33)

    def fn(x):
        return torch.ops.aten.native_dropout(x, 0.3, True)

    compiled = torch.compile(fn, backend="stitch")
    torch.manual_seed(7)
    y, mask = compiled(x)
    kept = mask.float().mean().item()
    assert 0.6 < kept < 0.8
    torch.testing.assert_close(y, torch.where(mask, x / 0.7, torch.zeros_like(x)))
    torch.manual_seed(7)
    y2, mask2 = compiled(x)
    assert torch.equal(mask, mask2) and torch.equal(y, y2)
    y3, mask3 = compiled(x)
    assert not torch.equal(mask, mask3)


def test_expensive_op_feeding_broadcast_is_computed_once_per_row():
    def fn(x, y):
        return x + torch.exp(torch.tanh(y))

    x, y = torch.randn(R, C), torch.randn(R, 1)
    with count_launches() as n:
        compare_with_eager(fn, [x, y], backward=False)
    assert n["n"] == 1
    report = explain(fn, x, y)
    (rec,) = report.graphs
    (k,) = rec.kernels.values()
    g = rec.graph
    tanh = [n.id for n in g.nodes if n.op == "tanh"][0]
    exp = [n.id for n in g.nodes if n.op == "exp"][0]
    # evaluated over the row axis only: once per row, not once per element
    assert k.levels[tanh] == frozenset({"row"}) and k.levels[exp] == frozenset({"row"})
    assert rec.plan.kernels[0].scheme == "regional"
    assert k.source.count("_tanh(") == 1
