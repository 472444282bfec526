"""Concatenations computed by their readers (issue 18's ResNet-50 row): a pooling window
reads the -inf padded input, a pooling backward reads its gradient and indices shifted
(padded) per residue class and interleaves the classes (stacked); each is a `cat`.
Written, each was a kernel of its own (the max-pool backward of ResNet-50's stem: 21
kernels, 515 us predicted on an H200).  Now a cat in a cheap chain (`graph_view.
cheap_chains`, knob `free_cats`) is free when the plan weighs it cheaper to recompute
(`planner._cheaper_recomputed`, bytes and issue time): a reader loads each part under its
position's mask.  Interpreter
tier (fp32 against eager, bf16 against float64, outputs poisoned) and plan tier (full-size
plans, nothing run)."""
import sys

import pytest
import torch
import torch.nn.functional as F

from stitchml import config
from stitchml.ir import nodes as ir
from stitchml.testing import compare_against_float64, compare_with_eager

sys.path.insert(0, "tests")
from planning import graph_of  # noqa: E402

aten = torch.ops.aten


def _x(shape, dtype=torch.float32, channels_last=True):
    x = torch.randn(shape) * 2 + 0.3
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    return x.to(dtype).requires_grad_()


def _counts(c):
    return {r.kind: len(r.plan.kernels) for r in c.backend.records}   # kernels, not launches


POOLS = [
    ("max3s2p1", lambda x: F.max_pool2d(x, 3, 2, 1)),
    ("max2s2", lambda x: F.max_pool2d(x, 2, 2)),
    ("max3s2p1_ceil", lambda x: F.max_pool2d(x, 3, 2, 1, ceil_mode=True)),
    ("max3s1_dil2", lambda x: F.max_pool2d(x, 3, 1, 1, dilation=2)),
    ("avg3s2p1", lambda x: F.avg_pool2d(x, 3, 2, 1)),
    ("avg3s2p1_nopad", lambda x: F.avg_pool2d(x, 3, 2, 1, count_include_pad=False)),
]


@pytest.mark.parametrize("channels_last", [True, False], ids=["cl", "nchw"])
@pytest.mark.parametrize("name,fn", POOLS, ids=[p[0] for p in POOLS])
def test_pooling_forward_reads_its_padded_input_in_place(name, fn, channels_last):
    x = _x((2, 5, 13, 11), channels_last=channels_last)
    c = compare_with_eager(fn, [x])
    counts = _counts(c)
    assert counts["forward"] == 1
    with config.override(free_cats=False):
        off = _counts(compare_with_eager(fn, [x.detach().clone().requires_grad_()]))
    if "p1" in name:   # a padded window: the padded copy was a kernel of its own
        assert off["forward"] > 1
    assert counts["backward"] <= off["backward"]


def test_bf16_max_pool_after_relu_matches_float64():
    def fn(x):
        return F.max_pool2d(F.relu(x * 1.5), 3, 2, 1) + 0.25
    c, verdict = compare_against_float64(fn, [_x((3, 8, 15, 12), torch.bfloat16)])
    verdict.assert_ok("bf16 relu + max-pool")
    (fwd,) = [r.plan for r in c.backend.records if r.kind == "forward"]
    # (the ReLU's output is saved for the backward: written; its padded copy is not)
    assert not any(fwd.graph[o].kind == ir.CAT for k in fwd.kernels for o in k.outputs)


def test_training_max_pool_saves_one_byte_offsets_and_recomputes_the_index():
    """The forward keeps each maximum's window offset (int8); the backward recomputes the
    flat index from it inside its class-sum kernel (integer division by the window width
    is a cheap chain link): no int64 tensor is saved, written or read."""
    x = _x((2, 6, 13, 11))
    c = compare_with_eager(lambda x: F.max_pool2d(x, 3, 2, 1), [x])
    (back,) = [r.plan for r in c.backend.records if r.kind == "backward"]
    g = back.graph
    assert [n.dtype for n in g.nodes if n.kind == ir.INPUT and not n.dtype.is_floating_point] == [torch.int8]
    assert len(back.kernels) <= 2
    assert all(g[m].dtype != torch.int64 for k in back.kernels for m in (*k.outputs, *k.inputs))


def test_stem_backward_from_offsets_reads_one_byte_an_output():
    """Full size (H200 plan): the index recomputed from the offsets, as the forward
    decomposition writes it, is computed by the class-sum kernel, not written."""
    x = torch.empty(8, 64, 112, 112, dtype=torch.bfloat16).to(memory_format=torch.channels_last)
    offsets = torch.zeros(8, 64, 56, 56, dtype=torch.int8).to(memory_format=torch.channels_last)
    grad = torch.randn(8, 64, 56, 56, dtype=torch.bfloat16).to(memory_format=torch.channels_last)

    def bwd(g, k):
        k = k.to(torch.int32)
        r = torch.arange(56, dtype=torch.int32).unsqueeze(1) * 2 - 1 + torch.div(k, 3, rounding_mode="trunc")
        c = torch.arange(56, dtype=torch.int32).unsqueeze(0) * 2 - 1 + torch.fmod(k, 3)
        idx = (r * 112 + c).to(torch.int64)
        return aten.max_pool2d_with_indices_backward(g, x, [3, 3], [2, 2], [1, 1], [1, 1], False, idx)

    from stitchml.plan.planner import build_plan
    with config.override(device="H200"):
        plan = build_plan(graph_of(bwd, grad, offsets))
    g = plan.graph
    big = [k for k in plan.kernels if k.domain.rows * k.domain.cols > 10**5]
    assert len(big) == 2
    assert sum(k.bytes_read for k in big) == grad.numel() * 2 + offsets.numel() + 4 * 8 * 64 * 57 * 57 * 2
    assert not any(g[o].dtype in (torch.int32, torch.int64) for k in plan.kernels for o in k.outputs
                   if g[o].numel > 10**5)


def test_a_cat_read_by_two_kernels_matches_eager():
    def fn(a, b):
        t = torch.cat([a, b * 2], dim=1)           # read by a row reduction and a transposed copy
        return t.softmax(-1), t.t().contiguous() * 3
    compare_with_eager(fn, [torch.randn(6, 5, requires_grad=True), torch.randn(6, 7, requires_grad=True)])


def test_a_cat_that_is_an_output_stays_written():
    def fn(a, b):
        t = torch.cat([a, b], dim=0)
        return t, t.sum(0)
    c = compare_with_eager(fn, [torch.randn(3, 5), torch.randn(4, 5)], backward=False)
    plan = c.backend.records[0].plan
    assert any(plan.graph[o].kind == ir.CAT for k in plan.kernels for o in k.outputs)


def _stem_backward_plan(device: str, **knobs):
    """The plan of ResNet-50's stem max-pool backward at b8 (channels last, bf16)."""
    x = torch.empty(8, 64, 112, 112, dtype=torch.bfloat16).to(memory_format=torch.channels_last)
    y, idx = aten.max_pool2d_with_indices(x, [3, 3], [2, 2], [1, 1])

    def bwd(g, x, idx):
        return aten.max_pool2d_with_indices_backward(g, x, [3, 3], [2, 2], [1, 1], [1, 1], False, idx)

    from stitchml.plan.planner import build_plan
    with config.override(device=device, **knobs):
        return build_plan(graph_of(bwd, torch.randn_like(y), x, idx.contiguous(memory_format=torch.channels_last)))


def test_stem_max_pool_backward_is_class_sums_then_their_interleave():
    """One kernel sums each residue class's terms from the gradient and the indices, read
    through their pads (4 class sums on the 57 x 57 grid); the next interleaves the four
    and crops (`decomp_window._unpool`).  Without free cats each pad is a kernel of its own."""
    plan = _stem_backward_plan("H200")
    off = _stem_backward_plan("H200", free_cats=False)
    g = plan.graph
    big = [k for k in plan.kernels if k.domain.rows * k.domain.cols > 10**5]
    assert len(big) == 2 and len(off.kernels) > len(plan.kernels) + 4
    sums, out = big
    assert sorted(g[o].shape for o in sums.outputs) == [(8, 64, 57, 57)] * 4
    assert [g[o].shape for o in out.outputs] == [(8, 64, 112, 112)]
    grad, index, classes, result = 8 * 64 * 56 * 56 * 2, 8 * 64 * 56 * 56 * 8, 4 * 8 * 64 * 57 * 57 * 2, \
        8 * 64 * 112 * 112 * 2
    moved = sum(k.bytes_read + k.bytes_written for k in plan.kernels)
    assert moved <= 1.02 * (grad + index + 2 * classes + result)
    assert 2 * moved < sum(k.bytes_read + k.bytes_written for k in off.kernels)


def test_stem_max_pool_forward_reads_the_input_in_place():
    x = torch.empty(8, 64, 112, 112, dtype=torch.bfloat16).to(memory_format=torch.channels_last)
    from stitchml.plan.planner import build_plan
    with config.override(device="H200"):
        plan = build_plan(graph_of(lambda x: aten.max_pool2d_with_indices(x, [3, 3], [2, 2], [1, 1]), x))
    (k,) = plan.kernels
    assert k.bytes_read == x.numel() * 2          # the -inf padding is a mask, not a tensor
