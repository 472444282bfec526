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
    from stitchml.capture.partition import partitioner, remat_partition, saving_partition
    assert config.KNOBS["remat"].default is True
    with config.override(remat=False):
        assert partitioner() is saving_partition
    with config.override(remat=True):
        assert partitioner() is remat_partition


def test_remat_guard_finds_the_first_recomputed_value_a_comparison_depends_on():
    from stitchml.capture.partition import recomputed_compared
    aten = torch.ops.aten

    def graph(recompute: bool) -> torch.fx.GraphModule:
        # a backward graph: `sigmoid` recomputed from the saved x (or x itself saved),
        # scaled by a backward-only `mul`, then compared with the saved m
        g = torch.fx.Graph()
        x, m = g.placeholder("x"), g.placeholder("m")
        y = g.call_function(aten.sigmoid.default, (x,), name="sigmoid") if recompute else x
        z = g.call_function(aten.mul.Tensor, (y, 2.0), name="mul")
        g.output((g.call_function(aten.eq.Tensor, (z, m)), g.call_function(aten.gt.Scalar, (y, 0.5), name="gt")))
        return torch.fx.GraphModule(torch.nn.Module(), g)

    forward = {"sigmoid", "gt"}
    assert recomputed_compared(graph(True), forward) == ["sigmoid"]
    assert recomputed_compared(graph(False), forward) == []
    # the first forward value on the path is the one to save, not what it is made from
    assert recomputed_compared(graph(True), forward | {"mul"}) == ["mul"]
    # a comparison with a Python scalar is not one (`gt` reads y and 0.5)
    assert recomputed_compared(graph(True), {"gt"}) == []


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_remat_keeps_min_cut_around_a_max_pool_and_saves_what_its_backward_compares(monkeypatch, dtype):
    """Batch norm -> ReLU -> max-pool, as at ResNet's stem: the pool's backward finds
    each window's arg-max by comparing the window's elements, which min-cut recomputes
    in half precision (here from the input).  Before, the whole graph then took the
    default partition (ResNet-50 training, H200 bf16 plan: 10696 MB of stitched traffic
    against 8224 MB now); now the values the comparisons read are saved and the rest
    stays recomputed."""
    import torch._functorch.partitioners as partitioners

    from stitchml.capture import partition
    from stitchml.testing import compare_against_float64
    defaults, splits = [], []
    monkeypatch.setattr(partitioners, "default_partition",
                        lambda *a, _f=partitioners.default_partition, **k: defaults.append(1) or _f(*a, **k))

    def spy(joint, inputs, _f=partition.remat_partition, **kwargs):
        fw, bw = _f(joint, inputs, **kwargs)
        splits.append((bw, partition.forward_values(joint, kwargs["num_fwd_outputs"])))
        return fw, bw
    monkeypatch.setattr(partition, "remat_partition", spy)

    def f(x, g, b, w):
        h = F.relu(F.batch_norm(x, None, None, g, b, training=True))
        return F.max_pool2d(h, 3, 2, 1) * w

    # every 3x3 window holds 9 values ~0.2 of a channel's spread apart (a random order
    # per channel, jittered): no near-tie, so the arg-max is the float64 run's too
    n, c, hgt, wid = 2, 8, 15, 17
    code = (torch.arange(hgt).view(hgt, 1) % 3 * 3 + torch.arange(wid) % 3).expand(n, c, hgt, wid)
    order = torch.stack([torch.randperm(9) for _ in range(c)]).float()
    x = order.view(1, c, 1, 9).expand(n, c, 1, 9).gather(3, code.reshape(n, c, 1, hgt * wid)).view(code.shape)
    x = (x + torch.rand(x.shape) * 0.4 - 0.2) * (torch.rand(1, c, 1, 1) + 0.5)
    x = x.to(dtype).to(memory_format=torch.channels_last).requires_grad_()
    g, b = (torch.rand(c) + 0.5).to(dtype).requires_grad_(), torch.randn(c).to(dtype).requires_grad_()
    w = torch.randn(1, c, 8, 9).to(dtype).requires_grad_()
    with config.override(remat=True):
        comp, judgement = compare_against_float64(f, [x, g, b, w])
    judgement.assert_ok()
    assert len(splits) == 1 and not defaults
    bw, forward = splits[0]
    assert partition.recomputed_compared(bw, forward) == []
    assert comp.num_kernels >= 3 and all(r.eager_reason is None for r in comp.backend.records)
    # the pool's backward compares the argmax index, exact integer arithmetic of the saved
    # one-byte window offset (`decomp_window.max_pool2d_with_indices`): min-cut's first
    # split stands, nothing marked, and the backward reads the offsets, not int64 indices
    (rec,) = comp.backend.partitions
    assert rec.method == "min-cut" and rec.runs == 1 and not rec.saved
    (back,) = [r.plan.graph for r in comp.backend.records if r.kind == "backward"]
    saved = [n.dtype for n in back.nodes if n.kind == "input" and not n.dtype.is_floating_point]
    assert torch.int8 in saved and torch.int64 not in saved   # (a bool: the ReLU's mask)


def test_remat_guard_lets_a_comparison_read_recomputed_integer_arithmetic():
    """Integer arithmetic of integer tensors recomputes bit for bit: the walk goes through
    it to what it is made of; a cast from a float, or a select on a float comparison, is
    where it stops."""
    from stitchml.capture.partition import recomputed_compared
    aten = torch.ops.aten

    def graph(source_dtype) -> torch.fx.GraphModule:
        g = torch.fx.Graph()
        k, pos = g.placeholder("k"), g.placeholder("pos")
        k.meta["val"] = torch.empty(4, dtype=source_dtype)
        pos.meta["val"] = torch.empty(4, dtype=torch.int64)
        wide = g.call_function(aten._to_copy.default, (k,), {"dtype": torch.int32}, name="wide")
        wide.meta["val"] = torch.empty(4, dtype=torch.int32)
        idx = g.call_function(aten.add.Tensor, (g.call_function(aten.mul.Tensor, (wide, 3), name="mul"), 1),
                              name="idx")
        for n in (idx, idx.args[0]):
            n.meta["val"] = torch.empty(4, dtype=torch.int32)
        g.output((g.call_function(aten.eq.Tensor, (idx, pos)),))
        return torch.fx.GraphModule(torch.nn.Module(), g)

    forward = {"wide", "mul", "idx"}
    assert recomputed_compared(graph(torch.int8), forward) == []
    # recomputed from a float, the cast is the first value that can differ: it is saved
    assert recomputed_compared(graph(torch.float16), forward) == ["wide"]


def test_explain_shows_how_each_training_graph_was_split():
    from stitchml.tools.explain import explain

    def f(x):
        return torch.sigmoid(x).half().amax(-1).float().sum() + x.sum()
    report = explain(f, torch.randn(16, 24, requires_grad=True), backward=True)
    text = report.to_text()
    # amax's backward masks `x == max`: the half-precision x it compares is saved, not recomputed
    assert "training graphs split (AOTAutograd, knob remat):" in text
    assert "  min-cut rematerialisation, 1 forward value(s) saved because a backward comparison reads them" in text
    from stitchml.tools.report_html import partition_section
    html = partition_section(report)
    assert "<div id='partitions'>" in html and report.partitions[0].saved[0] in html


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
